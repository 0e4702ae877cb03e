// The side-by-side benchmark's real-worker phase: each agent brings a bare machine up to a Ready Node
// with the OSC Gardener renders for its pool (test/harness/worker.ts: install.sh, the agent's CSR, the
// rendered OSC, kubelet's TLS bootstrap, the Node Ready, a Pod Running), then reacts to changes of
// kubelet's configuration in that OSC (maxPods): Secret replaced → kubelet's new process → the Node Ready
// again as the new kubelet reports it. Its own control plane (with kube-controller-manager, serving on
// the bridge) and registry; a fresh worker per run; the agents take turns.
import { putOscSecret, waitApplied } from "../../harness/agent.ts";
import { waitFor } from "../../harness/exec.ts";
import { bringUpWorker, pushAgentImage, readyAgain, readyHeartbeat, runWebPod, startWorkerWorld, unitPids, type WorkerAgent } from "../../harness/worker.ts";
import { workerOsc } from "../../harness/worker-osc.ts";
import type { AgentId, BenchAgent } from "./agents.ts";
import { type Summary, summary } from "./stats.ts";

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

export async function workerPhase(agents: BenchAgent[], o: { runs: number; changes: number; progress: (msg: string) => void; turns: <T>(xs: T[], k: number) => T[] }): Promise<WorkerPhaseResult> {
  const world = await startWorkerWorld();
  const samples = Object.fromEntries(
    agents.map((a) => [a.id, { csr: [] as number[], applied: [] as number[], ready: [] as number[], pod: [] as number[], restart: [] as number[], readyAgain: [] as number[], others: 0 }]),
  ) as Record<AgentId, { csr: number[]; applied: number[]; ready: number[]; pod: number[]; restart: number[]; readyAgain: number[]; others: number }>;
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
        } finally {
          await w.bare.stop();
        }
      }
    }
  } finally {
    await world.stop();
  }
  return Object.fromEntries(
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
}
