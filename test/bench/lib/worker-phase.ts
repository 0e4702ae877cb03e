// The side-by-side benchmark's real-worker phase: each agent brings a bare machine up to a Ready Node
// with the OSC Gardener renders for its pool (test/harness/worker.ts: install.sh, the agent's CSR, the
// rendered OSC, kubelet's TLS bootstrap, the Node Ready, a Pod Running), then reacts to changes of
// kubelet's configuration in that OSC (maxPods): Secret replaced → kubelet's new process → the Node Ready
// again as the new kubelet reports it. Its own control plane (with kube-controller-manager, serving on
// the bridge) and registry; a fresh worker per run; the agents take turns.
// Then the agents' memory with that small OSC (what `bun run demo` applies, ~19 KiB): a worker per agent
// brought up at the same time, a Pod on each as in the demo, both idle together and sampled as the
// steady state samples them on the 1 MiB OSC; these agents never saw a larger OSC.
import { Buffer } from "node:buffer";
import { CoreV1Api } from "@kubernetes/client-node";
import { putOscSecret, waitApplied } from "../../harness/agent.ts";
import { waitFor } from "../../harness/exec.ts";
import { bringUpWorker, pushAgentImage, readyAgain, readyHeartbeat, runWebPod, startWorkerWorld, unitPids, type Worker, type WorkerAgent } from "../../harness/worker.ts";
import { workerOsc } from "../../harness/worker-osc.ts";
import type { AgentId, BenchAgent } from "./agents.ts";
import type { ThrottleLog } from "./cpu-limit.ts";
import { type IdleMemory, sampleIdleMemory } from "./idle-memory.ts";
import { round, type Summary, summary } from "./stats.ts";

export type WorkerPhaseResult = Record<
  AgentId,
  {
    installToCsrMs: Summary;
    installToAppliedMs: Summary;
    installToReadyMs: Summary;
    installToPodReadyMs: Summary;
    kubeletChange: { toKubeletRestartMs: Summary; toReadyAgainMs: Summary; otherUnitsRestarted: number };
  }
>;

export type DemoOscIdle = Record<AgentId, IdleMemory & { minutes: number; oscKiB: number }>;

export type WorkerPhaseOptions = {
  runs: number;
  changes: number;
  /** How long both agents idle with the demo OSC, sampled (after 30 s to settle). */
  idleMinutes: number;
  progress: (msg: string) => void;
  turns: <T>(xs: T[], k: number) => T[];
  /** Under --cpu-limit: each worker's counters are read before it stops. */
  throttle?: ThrottleLog;
};

export async function workerPhase(agents: BenchAgent[], o: WorkerPhaseOptions): Promise<{ timings: WorkerPhaseResult; demoOscIdle: DemoOscIdle }> {
  const world = await startWorkerWorld();
  const stop = async (w: Worker, agent: AgentId, phase: string) => {
    o.throttle?.record(phase, agent, w.bare.node, (await unitPids(w)).agent);
    await w.bare.stop();
  };
  const samples = Object.fromEntries(
    agents.map((a) => [a.id, { csr: [] as number[], applied: [] as number[], ready: [] as number[], pod: [] as number[], restart: [] as number[], readyAgain: [] as number[], others: 0 }]),
  ) as Record<AgentId, { csr: number[]; applied: number[]; ready: number[]; pod: number[]; restart: number[]; readyAgain: number[]; others: number }>;
  let demoOscIdle: DemoOscIdle;
  try {
    const images = new Map<AgentId, WorkerAgent>();
    // trellis as a release compresses it (zstd -19, a gzip -9 alternative): the layer install.sh really pulls.
    for (const a of agents) images.set(a.id, await pushAgentImage(world, a, { release: true }));
    for (let r = 0; r < o.runs; r++) {
      for (const agent of o.turns(agents, r)) {
        const s = samples[agent.id];
        // Each agent its own pool (Secret), so that each OSC deploys that agent's image. containerd's
        // default configuration: on Debian's, gardener-node-agent leaves runc without a runtime type.
        const w = await bringUpWorker(world, `w${agent.id}${r}`, { agent: images.get(agent.id) as WorkerAgent, pool: `pool-${agent.id}`, machineContainerd: "containerd-default" });
        let measured = false;
        try {
          s.csr.push(w.csrSeenMs - w.startedMs);
          s.applied.push(w.appliedMs - w.startedMs);
          s.ready.push(w.readyMs - w.startedMs);
          await runWebPod(world, w, `web-${agent.id}-${r}`);
          s.pod.push(performance.now() - w.startedMs);
          o.progress(`worker ${r + 1}/${o.runs} ${agent.label}: install.sh → Node Ready ${(s.ready.at(-1) as number / 1000).toFixed(2)} s, → Pod Ready ${(s.pod.at(-1) as number / 1000).toFixed(2)} s`);
          for (let i = 1; i <= o.changes; i++) {
            const before = await unitPids(w);
            const heartbeat = await readyHeartbeat(w);
            const changed = await workerOsc({ ...w.input, maxPods: 60 + i });
            const t0 = performance.now();
            const checksum = await putOscSecret(world.cluster, w.secretName, changed.osc);
            await waitFor("kubelet's new process", async () => ((await unitPids(w)).kubelet !== before.kubelet ? true : undefined), 120_000, 20);
            s.restart.push(performance.now() - t0);
            await readyAgain(w, heartbeat, Date.now());
            s.readyAgain.push(performance.now() - t0);
            await waitApplied(w.bare, checksum, 60_000);
            const after = await unitPids(w);
            s.others += Number(after.containerd !== before.containerd) + Number(after.agent !== before.agent);
          }
          o.progress(`worker ${r + 1}/${o.runs} ${agent.label}: ${o.changes} kubelet changes, last → kubelet restarted ${(s.restart.at(-1) as number).toFixed(0)} ms, → Ready again ${(s.readyAgain.at(-1) as number).toFixed(0)} ms`);
          measured = true;
        } finally {
          await (measured ? stop(w, agent.id, "real worker") : w.bare.stop());
        }
      }
    }
    demoOscIdle = await idleWithDemoOsc(world, agents, images, o, stop);
  } finally {
    await world.stop();
  }
  const timings = Object.fromEntries(
    agents.map((a) => {
      const s = samples[a.id];
      return [
        a.id,
        {
          installToCsrMs: summary(s.csr, 0),
          installToAppliedMs: summary(s.applied, 0),
          installToReadyMs: summary(s.ready, 0),
          installToPodReadyMs: summary(s.pod, 0),
          kubeletChange: { toKubeletRestartMs: summary(s.restart, 0), toReadyAgainMs: summary(s.readyAgain, 0), otherUnitsRestarted: s.others },
        },
      ];
    }),
  ) as WorkerPhaseResult;
  return { timings, demoOscIdle };
}

async function idleWithDemoOsc(
  world: Awaited<ReturnType<typeof startWorkerWorld>>,
  agents: BenchAgent[],
  images: Map<AgentId, WorkerAgent>,
  o: WorkerPhaseOptions,
  stop: (w: Worker, agent: AgentId, phase: string) => Promise<void>,
): Promise<DemoOscIdle> {
  o.progress(`demo OSC: a worker per agent, brought up together, then both idle ${o.idleMinutes} min (after 30 s to settle)`);
  // Together, so that both agents applied the OSC at the same time and idle for as long after it.
  const up = await Promise.allSettled(agents.map((a) => bringUpWorker(world, `i${a.id}`, { agent: images.get(a.id) as WorkerAgent, pool: `pool-${a.id}`, machineContainerd: "containerd-default" })));
  const workers = up.flatMap((u) => (u.status === "fulfilled" ? [u.value] : []));
  let sampled = false;
  try {
    const failed = up.find((u) => u.status === "rejected");
    if (failed) throw failed.reason;
    await Promise.all(workers.map((w, k) => runWebPod(world, w, `idle-${agents[k]?.id}`)));
    await Bun.sleep(30_000);
    const pids = await Promise.all(workers.map(async (w) => (await unitPids(w)).agent));
    const t0 = performance.now();
    const memory = await sampleIdleMemory(workers.map((w, k) => ({ node: w.bare.node, pid: pids[k] as number })), o.idleMinutes);
    const minutes = round((performance.now() - t0) / 60_000, 2);
    for (const [k, w] of workers.entries()) if ((await unitPids(w)).agent !== pids[k]) throw new Error(`${agents[k]?.label} restarted while idle with the demo OSC`);
    const core = world.cluster.admin().makeApiClient(CoreV1Api);
    const oscKiB = await Promise.all(workers.map(async (w) => Buffer.from((await core.readNamespacedSecret({ name: w.secretName, namespace: "kube-system" })).data?.["osc.yaml"] ?? "", "base64").length / 1024));
    sampled = true;
    return Object.fromEntries(agents.map((a, k) => [a.id, { minutes, oscKiB: round(oscKiB[k] as number), ...(memory[k] as IdleMemory) }])) as DemoOscIdle;
  } finally {
    for (const [k, w] of workers.entries()) await (sampled ? stop(w, (agents[k] as BenchAgent).id, "demo OSC idle") : w.bare.stop());
  }
}
