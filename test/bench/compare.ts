// bun run bench [-- --runs 3 --changes 30 --startups 5 --steady-minutes 10 --worker-runs 3 --worker-changes 5 --cpu-limit 0.5]
//
// trellis side by side with its peer, Gardener's gardener-node-agent (built from the Go module proxy by
// test/peer/build.sh), on the same machine in the same run: each agent on its own real node (systemd
// in namespaces, with a real containerd) against one real kube-apiserver, with the same
// NodeAgentConfiguration and the same OSC (500 files, 50 units: test/bench/lib/bench-osc.ts). The
// agents take turns on every measurement (the order alternates), except the steady state, where both
// idle at the same time, each on its own node.
//   1. first apply: Secret created → the agent's PATCH of the Node's checksum annotation (audit log),
//      and → the last of the 50 units started; a fresh node per run;
//   2. reaction latency: Secret replaced → the changed unit's new process started (its own
//      $EPOCHREALTIME), 30 changes each, one file of one unit's filePaths per change;
//   3. start-up: agent restarted on its applied node → its first reconcile finished (journal), from the
//      process's start (systemd's ExecMainStartTimestampMonotonic) to the log line that ends a
//      reconcile with nothing to do; same clock (CLOCK_MONOTONIC) for both. Both trust the Node's
//      checksum there (trellis its own record too); trellis's check of the node right after is timed as
//      well, beside the table;
//   4. no-op re-check: the applied OSC plus a comment → the Node annotation, the CPU it took, the API
//      requests it made, 10 times each;
//   5. steady state: RSS (and its RssAnon and RssFile + RssShmem), CPU seconds, API requests per hour
//      (audit log) and bytes received from the API server (a byte-counting TCP relay between each agent
//      and the API server, TLS untouched);
//   6. binary size and the compressed single-layer image;
//   7. a real worker (test/bench/lib/worker-phase.ts, its own control plane, after the others): a bare
//      machine with a real kubelet brought up by each agent with the OSC Gardener renders for its pool,
//      install.sh → agent's CSR → OSC applied → Node Ready → a Pod Ready; then kubelet's configuration
//      changed in the OSC → kubelet's new process → the Node Ready again as the new kubelet reports it;
//      then a worker per agent together, both idle with that small OSC (what `bun run demo` applies) for
//      --steady-minutes: the steady RSS with the demo OSC, beside phase 5's with the 1 MiB one.
// --cpu-limit CORES: every node of every phase (the agent, systemd, containerd; on a real worker also
// kubelet and install.sh) under the same CFS quota, the same for both agents (test/bench/lib/cpu-limit.ts);
// the control plane stays unlimited. Without it, the nodes share the machine's cores unlimited.
// Every node's kubeconfig points at its own relay (test/harness/byte-proxy.ts), in every phase.
// A stand-in kubelet answers /healthz on 127.0.0.1:10248 (the nodes share the host's network), so
// that neither agent's health check restarts a kubelet that was never there.
// Prints progress and the table on stderr, the JSON on stdout, and writes the JSON to
// test/bench/results/compare-<date>.json. About 20 minutes with the defaults (10 of them steady state).
import { readFileSync, statSync } from "node:fs";
import { parseArgs } from "node:util";
import { CoreV1Api, VersionApi } from "@kubernetes/client-node";
import { compress, tarLayer } from "../../build/oci-layout.ts";
import { binaryPathInImage } from "../../build/trellis-image.ts";
import { sha256Hex } from "../../src/api/desired.ts";
import { type AgentNode, mainPid, startAgentNode, unitProperty, waitApplied } from "../harness/agent.ts";
import { type ByteProxy, startByteProxy } from "../harness/byte-proxy.ts";
import { startCluster } from "../harness/cluster.ts";
import { waitFor } from "../harness/exec.ts";
import type { Node } from "../harness/node.ts";
import type { AuditEvent } from "../harness/rbac.ts";
import { type AgentId, type BenchAgent, benchAgents } from "./lib/agents.ts";
import { AuditTail, auditMs, countByKind, waitWatching } from "./lib/audit.ts";
import { expectedStarts, oscYaml, secretBody, starts, UNITS, unitName } from "./lib/bench-osc.ts";
import { nodeCpuMax, ThrottleLog } from "./lib/cpu-limit.ts";
import { type IdleMemory, sampleIdleMemory } from "./lib/idle-memory.ts";
import { journal, type JournalLine } from "./lib/journal.ts";
import { busyCores, cpuSeconds, hostCpu, initClockTicks, machineInfo } from "./lib/proc.ts";
import { saveResult } from "./lib/results.ts";
import { type DemoOscIdle, type WorkerPhaseResult, workerPhase } from "./lib/worker-phase.ts";
import { median, round, type Summary, summary } from "./lib/stats.ts";

const { values: args } = parseArgs({
  options: {
    runs: { type: "string", default: "3" },
    changes: { type: "string", default: "30" },
    startups: { type: "string", default: "5" },
    "steady-minutes": { type: "string", default: "10" },
    "worker-runs": { type: "string", default: "3" },
    "worker-changes": { type: "string", default: "5" },
    "cpu-limit": { type: "string" },
  },
});
const RUNS = Number(args.runs);
const CHANGES = Number(args.changes);
const STARTUPS = Number(args.startups);
const STEADY_MINUTES = Number(args["steady-minutes"]);
const WORKER_RUNS = Number(args["worker-runs"]);
const WORKER_CHANGES = Number(args["worker-changes"]);
const CPU_LIMIT = args["cpu-limit"] === undefined ? undefined : Number(args["cpu-limit"]);
const NOOPS = 10;
// Read by test/harness/node/boot.sh for every node this process boots, the real workers' included.
if (CPU_LIMIT !== undefined) process.env.NODE_CPU_MAX = nodeCpuMax(CPU_LIMIT);
const throttle = CPU_LIMIT === undefined ? undefined : new ThrottleLog();

const benchStart = performance.now();
const progress = (msg: string) => console.error(`[${((performance.now() - benchStart) / 1000).toFixed(1).padStart(7)} s] ${msg}`);
/** The host's CLOCK_REALTIME in ms with sub-ms precision. */
const wallNow = () => performance.timeOrigin + performance.now();
const sleep = (ms: number) => Bun.sleep(ms);
/** Alternates who goes first: run k starts with agent k mod 2. */
const turns = <T>(xs: T[], k: number): T[] => (k % 2 === 0 ? xs : [...xs].reverse());

type Bench = AgentNode & { agent: BenchAgent; proxy: ByteProxy; secretName: string };

// ---------------------------------------------------------------- observing

const noopDone = (b: Bench, lines: JournalLine[]) => lines.filter((l) => l.msg === b.agent.noopDoneMessage);

/** Polls the Node until it carries `checksum`; then the agent's last metadata PATCH of the Node up to that moment is the one that set it. */
async function annotationPatchMs(audit: AuditTail, b: Bench, checksum: string, fromMs: number): Promise<number> {
  await waitApplied(b, checksum, 180_000, 20);
  const seen = wallNow();
  const isPatch = (e: AuditEvent) => e.verb === "patch" && e.stage === "ResponseComplete" && e.objectRef?.resource === "nodes" && !e.requestURI.includes("/status");
  const patch = await waitFor("the annotation PATCH in the audit log", () => audit.by(b.user, fromMs, seen + 5).filter(isPatch).at(-1), 5_000, 20);
  return auditMs(patch.stageTimestamp);
}

async function unitStartsAll(node: Node): Promise<number[][]> {
  return Promise.all(Array.from({ length: UNITS }, (_, u) => starts(node, u)));
}

// ---------------------------------------------------------------- setting up

const phaseCpu: Record<string, number> = {};
let phaseMark = { name: "", cpu: hostCpu() };
const mark = (name: string) => {
  const now = hostCpu();
  if (phaseMark.name) phaseCpu[phaseMark.name] = busyCores(phaseMark.cpu, now);
  phaseMark = { name, cpu: now };
};

await initClockTicks();
const machine = await machineInfo();
progress("building/copying the agents (the first build of gardener-node-agent takes minutes)");
const agents = await benchAgents();
const oscText = oscYaml(0);
const cluster = await startCluster({ controllerManager: false });
const core = cluster.admin().makeApiClient(CoreV1Api);
const audit = new AuditTail(cluster.auditLog);
const benches: Bench[] = [];
let kubelet: ReturnType<typeof Bun.serve> | undefined;
const result: Record<string, unknown> = {};
let seq = 0;

async function startBench(agent: BenchAgent, syncPeriod = "10m"): Promise<Bench> {
  const secretName = `osc-${agent.id}-${++seq}`;
  const proxy = await startByteProxy(cluster.server);
  const a = await startAgentNode(cluster, {
    prefix: `${agent.id}-${seq}`,
    secretName,
    syncPeriod,
    binary: agent.binary,
    configName: agent.configName,
    unit: agent.unit,
    rules: agent.rules([secretName]),
    server: proxy.server,
    containerd: true,
    start: false,
  });
  const b: Bench = { ...a, agent, proxy, secretName };
  benches.push(b);
  await a.node.execOk(["systemctl", "enable", "--now", "gardener-node-agent.service"]);
  return b;
}
/** Stops the node; with `phase`, first reads its CPU limit's counters (--cpu-limit) for that phase. */
async function stopBench(b: Bench, phase?: string): Promise<void> {
  if (phase) throttle?.record(phase, b.agent.id, b.node, await mainPid(b, "gardener-node-agent.service"));
  await b.node.stop();
  await b.proxy.close();
  benches.splice(benches.indexOf(b), 1);
}

try {
  try {
    kubelet = Bun.serve({ hostname: "127.0.0.1", port: 10248, fetch: () => new Response("ok") });
  } catch (err) {
    throw new Error(`the stand-in kubelet cannot listen on 127.0.0.1:10248 (a real kubelet on this machine?): ${String(err)}`);
  }
  const version = await cluster.admin().makeApiClient(VersionApi).getCode();
  result.machine = machine;
  result.versions = {
    ...Object.fromEntries(agents.map((a) => [a.id, { version: a.version, binary: a.binary }])),
    bun: Bun.version,
    kubeApiserver: version.gitVersion,
  };
  result.osc = { files: UNITS * 10, units: UNITS, yamlKiB: round(oscText.length / 1024) };

  // ------------------------------------------------ 1. first apply
  mark("first apply");
  const firstApply: Record<AgentId, { toAnnotationMs: number[]; toAllUnitsMs: number[]; receivedKiB: number[] }> = {
    trellis: { toAnnotationMs: [], toAllUnitsMs: [], receivedKiB: [] },
    gna: { toAnnotationMs: [], toAllUnitsMs: [], receivedKiB: [] },
  };
  const applied = new Map<AgentId, Bench>();
  for (let r = 0; r < RUNS; r++) {
    for (const agent of turns(agents, r)) {
      const b = await startBench(agent);
      await waitWatching(audit, b.user);
      await sleep(1_000); // let the start-up settle
      const bytes0 = b.proxy.counts().received;
      const t0 = wallNow();
      await core.createNamespacedSecret({ namespace: "kube-system", body: secretBody(b.secretName, oscText) });
      const patchAt = await annotationPatchMs(audit, b, sha256Hex(oscText), t0);
      const all = await waitFor("all 50 units to start", async () => {
        const s = await unitStartsAll(b.node);
        return s.every((x) => x.length === 1) ? s : undefined;
      }, 60_000, 20);
      const res = firstApply[agent.id];
      res.toAnnotationMs.push(patchAt - t0);
      res.toAllUnitsMs.push(Math.max(...all.map((x) => x[0] as number)) - t0);
      res.receivedKiB.push((b.proxy.counts().received - bytes0) / 1024);
      progress(`first apply ${r + 1}/${RUNS} ${agent.label}: ${round((patchAt - t0) / 1000, 2)} s to the annotation, ${round(((res.toAllUnitsMs.at(-1) as number) / 1000), 2)} s to the last unit started`);
      const previous = applied.get(agent.id);
      if (previous) await stopBench(previous, "first apply");
      applied.set(agent.id, b);
    }
  }
  const nodes = agents.map((a) => applied.get(a.id) as Bench);

  // ------------------------------------------------ 2. reaction latency
  mark("reaction latency");
  const reaction: Record<AgentId, { toRestartMs: number[]; toAnnotationMs: number[] }> = { trellis: { toRestartMs: [], toAnnotationMs: [] }, gna: { toRestartMs: [], toAnnotationMs: [] } };
  progress(`${CHANGES} changes per agent, each to one file of one unit, taking turns`);
  for (let i = 1; i <= CHANGES; i++) {
    const text = oscYaml(i);
    const u = (i - 1) % UNITS;
    for (const b of turns(nodes, i)) {
      const count = (await starts(b.node, u)).length;
      const t0 = wallNow();
      await core.replaceNamespacedSecret({ name: b.secretName, namespace: "kube-system", body: secretBody(b.secretName, text) });
      const started = await waitFor(`${unitName(u)} to restart on ${b.name} (change ${i})`, async () => (await starts(b.node, u))[count], 60_000, 2);
      const patchAt = await annotationPatchMs(audit, b, sha256Hex(text), t0);
      reaction[b.agent.id].toRestartMs.push(started - t0);
      reaction[b.agent.id].toAnnotationMs.push(patchAt - t0);
      await sleep(300); // the events and the Node's conditions follow the annotation
    }
  }
  const otherRestarts: Record<string, number> = {};
  for (const b of nodes) {
    const after = await unitStartsAll(b.node);
    otherRestarts[b.agent.id] = after.map((s, u) => s.length - expectedStarts(u, CHANGES)).reduce((x, y) => x + Math.abs(y), 0);
  }
  progress(`reaction latency medians: ${nodes.map((b) => `${b.agent.label} ${round(median(reaction[b.agent.id].toRestartMs))} ms`).join(", ")}; unexpected unit starts ${JSON.stringify(otherRestarts)}`);

  // ------------------------------------------------ 3. start-up
  mark("start-up");
  const startup: Record<AgentId, number[]> = { trellis: [], gna: [] };
  // trellis's first reconcile after a restart trusts the Node and its record (as the peer trusts the Node)
  // and checks the node right after it: the end of that check too, which the peer has no counterpart of.
  const nodeChecked: number[] = [];
  const restartAndWait = async (b: Bench): Promise<void> => {
    await b.node.execOk(["systemctl", "restart", "gardener-node-agent.service"]);
    const pid = await mainPid(b, "gardener-node-agent.service");
    const startUs = Number(await unitProperty(b.node, "gardener-node-agent.service", "ExecMainStartTimestampMonotonic"));
    const done = await waitFor(`${b.agent.label}'s first reconcile after a restart`, async () => noopDone(b, await journal(b.node, pid))[0], 60_000, 50);
    startup[b.agent.id].push((done.monoUs - startUs) / 1000);
    if (b.agent.id !== "trellis") return;
    const checked = await waitFor("trellis's check of the node after its start", async () => noopDone(b, await journal(b.node, pid)).find((l) => l.fields.recorded !== true), 60_000, 50);
    nodeChecked.push((checked.monoUs - startUs) / 1000);
  };
  for (let k = 0; k < STARTUPS; k++) {
    for (const b of turns(nodes, k)) {
      await restartAndWait(b);
      await sleep(2_000);
    }
  }
  progress(`start-up medians: ${nodes.map((b) => `${b.agent.label} ${round(median(startup[b.agent.id]))} ms`).join(", ")}; trellis's check of the node done ${round(median(nodeChecked))} ms`);

  // ------------------------------------------------ 4. no-op re-check: an OSC that changes nothing on the node
  // The Secret gets the applied OSC plus a YAML comment (and that text's checksum, as Gardener writes
  // it): both agents must take it in, find that nothing on the node changes, and report the new
  // checksum on the Node; no unit may restart. (Neither agent's periodic re-check compares: the peer
  // does not requeue once it found its checksum applied, trellis re-verifies the files every syncPeriod.)
  mark("no-op re-check");
  const noop: Record<AgentId, { toAnnotationMs: number[]; cpuMs: number[]; apiRequests: number[] }> = {
    trellis: { toAnnotationMs: [], cpuMs: [], apiRequests: [] },
    gna: { toAnnotationMs: [], cpuMs: [], apiRequests: [] },
  };
  const appliedText = oscYaml(CHANGES);
  for (let k = 1; k <= NOOPS; k++) {
    const text = `${appliedText}# no-op re-check ${k}\n`;
    for (const b of turns(nodes, k)) {
      const pid = await mainPid(b, "gardener-node-agent.service");
      const before = await unitStartsAll(b.node);
      const cpu0 = await cpuSeconds(b.node, pid);
      const t0 = wallNow();
      await core.replaceNamespacedSecret({ name: b.secretName, namespace: "kube-system", body: secretBody(b.secretName, text) });
      const patchAt = await annotationPatchMs(audit, b, sha256Hex(text), t0);
      await sleep(500); // what follows the annotation: the event, the Node's conditions
      noop[b.agent.id].cpuMs.push(((await cpuSeconds(b.node, pid)) - cpu0) * 1000);
      noop[b.agent.id].toAnnotationMs.push(patchAt - t0);
      noop[b.agent.id].apiRequests.push(audit.by(b.user, t0, wallNow()).filter((e) => e.verb !== "watch" && e.objectRef?.resource !== "leases").length);
      const after = await unitStartsAll(b.node);
      if (after.some((x, u) => x.length !== (before[u] as number[]).length)) throw new Error(`${b.agent.label} restarted a unit for an OSC that changes nothing`);
    }
  }
  progress(`no-op re-check medians: ${nodes.map((b) => `${b.agent.label} ${round(median(noop[b.agent.id].toAnnotationMs))} ms, ${round(median(noop[b.agent.id].cpuMs))} ms CPU`).join("; ")}`);

  // ------------------------------------------------ 5. steady state, both at once
  mark("steady state");
  progress(`steady state: ${STEADY_MINUTES} min, both agents idle at once (after 30 s to settle)`);
  await sleep(30_000);
  const steadyStart = await Promise.all(
    nodes.map(async (b) => {
      const pid = await mainPid(b, "gardener-node-agent.service");
      return { b, pid, cpu: await cpuSeconds(b.node, pid), bytes: b.proxy.counts() };
    }),
  );
  const t0 = wallNow();
  const memory = await sampleIdleMemory(steadyStart.map((s) => ({ node: s.b.node, pid: s.pid })), STEADY_MINUTES);
  const t1 = wallNow();
  await sleep(2_000); // the audit log is written after the response
  const steady: Record<string, unknown> = {};
  for (const [k, s] of steadyStart.entries()) {
    const cpu = (await cpuSeconds(s.b.node, s.pid)) - s.cpu;
    if ((await mainPid(s.b, "gardener-node-agent.service")) !== s.pid) throw new Error(`${s.b.agent.label} restarted during the steady state`);
    const requests = audit.by(s.b.user, t0, t1).filter((e) => e.stage === "ResponseComplete" || e.verb === "watch");
    const byKind = countByKind(requests.filter((e) => e.stage === "ResponseComplete"));
    const hours = (t1 - t0) / 3_600_000;
    const bytes = s.b.proxy.counts();
    steady[s.b.agent.id] = {
      minutes: round((t1 - t0) / 60_000, 2),
      ...(memory[k] as IdleMemory),
      cpuSeconds: round(cpu, 2),
      apiRequestsPerHour: round(byKind.reduce((x, [, n]) => x + n, 0) / hours, 0),
      byVerbAndResourcePerHour: Object.fromEntries(byKind.map(([k, n]) => [k, round(n / hours, 0)])),
      receivedKiBPerHour: round((bytes.received - s.bytes.received) / 1024 / hours, 1),
      sentKiBPerHour: round((bytes.sent - s.bytes.sent) / 1024 / hours, 1),
      newConnections: bytes.connections - s.bytes.connections,
    };
  }

  // ------------------------------------------------ 6. sizes
  mark("sizes");
  const sizes: Record<string, unknown> = {};
  for (const agent of agents) {
    const content = new Uint8Array(readFileSync(agent.binary));
    const layer = tarLayer({ [binaryPathInImage.slice(1)]: { content, mode: 0o755 } });
    sizes[agent.id] = {
      binaryMiB: round(statSync(agent.binary).size / 1048576),
      imageLayerGzip9MiB: round(compress(layer, "gzip", 9).length / 1048576),
      imageLayerZstd19MiB: round(compress(layer, "zstd", 19).length / 1048576),
    };
  }

  result.firstApply = Object.fromEntries(agents.map((a) => [a.id, { createToAnnotationMs: summary(firstApply[a.id].toAnnotationMs), createToAllUnitsStartedMs: summary(firstApply[a.id].toAllUnitsMs), receivedKiB: summary(firstApply[a.id].receivedKiB) }]));
  result.reactionLatency = {
    ...Object.fromEntries(agents.map((a) => [a.id, { toUnitRestartMs: summary(reaction[a.id].toRestartMs), toAnnotationMs: summary(reaction[a.id].toAnnotationMs) }])),
    otherUnitsRestarted: otherRestarts,
  };
  result.startup = Object.fromEntries(agents.map((a) => [a.id, { processStartToFirstReconcileMs: summary(startup[a.id]), ...(a.id === "trellis" ? { processStartToNodeCheckedMs: summary(nodeChecked) } : {}) }]));
  result.noopRecheck = Object.fromEntries(agents.map((a) => [a.id, { toAnnotationMs: summary(noop[a.id].toAnnotationMs), cpuMs: summary(noop[a.id].cpuMs), apiRequests: summary(noop[a.id].apiRequests, 0) }]));
  result.steady = steady;
  result.sizes = sizes;
  for (const b of nodes) throttle?.record("reaction, start-up, no-op re-check, steady (the last first apply's nodes)", b.agent.id, b.node, await mainPid(b, "gardener-node-agent.service"));
} finally {
  for (const b of [...benches].reverse()) await stopBench(b).catch((err: unknown) => console.error(`stopping node ${b.name}: ${String(err)}`));
  await kubelet?.stop(true);
  await cluster.stop();
}

// What held each node: the quota the kernel kept (read back from the node's cgroup before it stopped) and
// how often CFS throttled it, so that a limit that did not bite shows as one.
const cpuLimitResult = () => (throttle ? { coresPerNode: CPU_LIMIT, nodeCpuMax: process.env.NODE_CPU_MAX, byPhase: throttle.totals(), nodes: throttle.nodes } : null);
// Phases 1-6 are kept even if the real worker fails.
result.cpuLimit = cpuLimitResult();
saveResult("compare", { date: new Date().toISOString().slice(0, 10), ...result }, new Date().toISOString().slice(0, 10));

// ------------------------------------------------ 7. a real worker, Gardener's OSC (its own control plane)
mark("real worker");
progress(`real worker: ${WORKER_RUNS} bare machine(s) per agent brought up with Gardener's OSC, ${WORKER_CHANGES} kubelet configuration changes each`);
const worker = await workerPhase(agents, { runs: WORKER_RUNS, changes: WORKER_CHANGES, idleMinutes: STEADY_MINUTES, progress, turns, ...(throttle ? { throttle } : {}) });
result.worker = worker.timings;
result.steadyDemoOsc = worker.demoOscIdle;
mark("");
result.cpuLimit = cpuLimitResult();
result.hostCpuBusyCores = phaseCpu;
result.benchSeconds = round((performance.now() - benchStart) / 1000);

// ---------------------------------------------------------------- output

const date = new Date().toISOString().slice(0, 10);
const saved = saveResult("compare", { date, ...result }, date);

type PerAgent<T> = Record<AgentId, T>;
const r = result as {
  firstApply: PerAgent<{ createToAnnotationMs: Summary; createToAllUnitsStartedMs: Summary; receivedKiB: Summary }>;
  reactionLatency: PerAgent<{ toUnitRestartMs: Summary; toAnnotationMs: Summary }>;
  startup: PerAgent<{ processStartToFirstReconcileMs: Summary }> & { trellis: { processStartToNodeCheckedMs: Summary } };
  noopRecheck: PerAgent<{ toAnnotationMs: Summary; cpuMs: Summary; apiRequests: Summary }>;
  steady: PerAgent<IdleMemory & { cpuSeconds: number; apiRequestsPerHour: number; receivedKiBPerHour: number; sentKiBPerHour: number }>;
  steadyDemoOsc: DemoOscIdle;
  sizes: PerAgent<{ binaryMiB: number; imageLayerGzip9MiB: number; imageLayerZstd19MiB: number }>;
  worker: WorkerPhaseResult;
};
const w = r.worker;
const cell = (x: Summary | number) => (typeof x === "number" ? `${x}` : `${x.median} (${x.min}–${x.max})`);
const mid = (x: Summary | number) => (typeof x === "number" ? x : x.median);
const rows: [string, PerAgent<Summary | number>, string][] = [
  [`reaction: Secret → changed unit restarted (${CHANGES})`, { trellis: r.reactionLatency.trellis.toUnitRestartMs, gna: r.reactionLatency.gna.toUnitRestartMs }, "ms"],
  [`reaction: Secret → Node annotation (${CHANGES})`, { trellis: r.reactionLatency.trellis.toAnnotationMs, gna: r.reactionLatency.gna.toAnnotationMs }, "ms"],
  [`first apply: Secret → Node annotation (${RUNS})`, { trellis: r.firstApply.trellis.createToAnnotationMs, gna: r.firstApply.gna.createToAnnotationMs }, "ms"],
  [`first apply: Secret → 50th unit started (${RUNS})`, { trellis: r.firstApply.trellis.createToAllUnitsStartedMs, gna: r.firstApply.gna.createToAllUnitsStartedMs }, "ms"],
  [`no-op re-check: Secret → Node annotation (${NOOPS})`, { trellis: r.noopRecheck.trellis.toAnnotationMs, gna: r.noopRecheck.gna.toAnnotationMs }, "ms"],
  [`no-op re-check: agent CPU (${NOOPS})`, { trellis: r.noopRecheck.trellis.cpuMs, gna: r.noopRecheck.gna.cpuMs }, "ms"],
  [`no-op re-check: API requests (${NOOPS})`, { trellis: r.noopRecheck.trellis.apiRequests, gna: r.noopRecheck.gna.apiRequests }, ""],
  [`start-up: process start → first reconcile (${STARTUPS})`, { trellis: r.startup.trellis.processStartToFirstReconcileMs, gna: r.startup.gna.processStartToFirstReconcileMs }, "ms"],
  [`steady RSS (demo OSC, ${STEADY_MINUTES} min)`, { trellis: r.steadyDemoOsc.trellis.rssMiB, gna: r.steadyDemoOsc.gna.rssMiB }, "MiB"],
  [`steady RSS (1 MiB OSC, ${STEADY_MINUTES} min)`, { trellis: r.steady.trellis.rssMiB, gna: r.steady.gna.rssMiB }, "MiB"],
  ["  of which RssAnon (demo OSC)", { trellis: r.steadyDemoOsc.trellis.rssAnonMiB, gna: r.steadyDemoOsc.gna.rssAnonMiB }, "MiB"],
  ["  of which RssAnon (1 MiB OSC)", { trellis: r.steady.trellis.rssAnonMiB, gna: r.steady.gna.rssAnonMiB }, "MiB"],
  ["  of which RssFile+RssShmem¹ (demo OSC)", { trellis: r.steadyDemoOsc.trellis.rssFileShmemMiB, gna: r.steadyDemoOsc.gna.rssFileShmemMiB }, "MiB"],
  ["  of which RssFile+RssShmem¹ (1 MiB OSC)", { trellis: r.steady.trellis.rssFileShmemMiB, gna: r.steady.gna.rssFileShmemMiB }, "MiB"],
  [`steady ${STEADY_MINUTES} min: CPU`, { trellis: r.steady.trellis.cpuSeconds, gna: r.steady.gna.cpuSeconds }, "s"],
  ["steady: API requests", { trellis: r.steady.trellis.apiRequestsPerHour, gna: r.steady.gna.apiRequestsPerHour }, "/h"],
  ["steady: received from the API server", { trellis: r.steady.trellis.receivedKiBPerHour, gna: r.steady.gna.receivedKiBPerHour }, "KiB/h"],
  ["steady: sent to the API server", { trellis: r.steady.trellis.sentKiBPerHour, gna: r.steady.gna.sentKiBPerHour }, "KiB/h"],
  [`first apply: received from the API server (${RUNS})`, { trellis: r.firstApply.trellis.receivedKiB, gna: r.firstApply.gna.receivedKiB }, "KiB"],
  [`worker: install.sh → agent's CSR (${WORKER_RUNS})`, { trellis: w.trellis.installToCsrMs, gna: w.gna.installToCsrMs }, "ms"],
  [`worker: install.sh → Node Ready (${WORKER_RUNS})`, { trellis: w.trellis.installToReadyMs, gna: w.gna.installToReadyMs }, "ms"],
  [`worker: install.sh → OSC applied (${WORKER_RUNS})`, { trellis: w.trellis.installToAppliedMs, gna: w.gna.installToAppliedMs }, "ms"],
  [`worker: install.sh → Pod Ready (${WORKER_RUNS})`, { trellis: w.trellis.installToPodReadyMs, gna: w.gna.installToPodReadyMs }, "ms"],
  [`worker: kubelet config → kubelet restarted (${WORKER_RUNS * WORKER_CHANGES})`, { trellis: w.trellis.kubeletChange.toKubeletRestartMs, gna: w.gna.kubeletChange.toKubeletRestartMs }, "ms"],
  [`worker: kubelet config → Node Ready again (${WORKER_RUNS * WORKER_CHANGES})`, { trellis: w.trellis.kubeletChange.toReadyAgainMs, gna: w.gna.kubeletChange.toReadyAgainMs }, "ms"],
  ["worker: other units restarted by those changes", { trellis: w.trellis.kubeletChange.otherUnitsRestarted, gna: w.gna.kubeletChange.otherUnitsRestarted }, ""],
  ["binary", { trellis: r.sizes.trellis.binaryMiB, gna: r.sizes.gna.binaryMiB }, "MiB"],
  ["image layer, gzip -9", { trellis: r.sizes.trellis.imageLayerGzip9MiB, gna: r.sizes.gna.imageLayerGzip9MiB }, "MiB"],
  ["image layer, zstd -19", { trellis: r.sizes.trellis.imageLayerZstd19MiB, gna: r.sizes.gna.imageLayerZstd19MiB }, "MiB"],
  // What a node pulls: trellis's release layer is zstd -19 (build/trellis-image.ts); Gardener builds the
  // peer's image from its Dockerfile with Docker's default layer compression, gzip.
  ["image layer pulled (trellis zstd -19, peer gzip)", { trellis: r.sizes.trellis.imageLayerZstd19MiB, gna: r.sizes.gna.imageLayerGzip9MiB }, "MiB"],
];
const v = (result.versions as Record<AgentId, { version: string }> & { bun: string; kubeApiserver: string });
const ratio = (t: number, g: number) => (g === 0 ? (t === 0 ? "1.00" : "∞") : (t / g).toFixed(2));
const limits = result.cpuLimit as { byPhase: ReturnType<ThrottleLog["totals"]> } | null;
const throttled = (id: AgentId) => {
  const all = Object.values(limits?.byPhase ?? {}).map((p) => p[id]);
  return `${all.reduce((x, t) => x + (t?.nrThrottled ?? 0), 0)} of ${all.reduce((x, t) => x + (t?.nrPeriods ?? 0), 0)} periods`;
};
console.error(
  [
    "",
    `machine: ${machine.nproc} cores (${machine.cpu}), ${machine.memoryGiB} GiB, kernel ${machine.kernel}; trellis ${v.trellis.version} (bun ${v.bun}), gardener-node-agent ${v.gna.version}, kube-apiserver ${v.kubeApiserver}`,
    CPU_LIMIT === undefined
      ? "CPU limit: none (the nodes share the machine's cores)"
      : `CPU limit: ${CPU_LIMIT} core per node, every phase, both agents (v1 cpu cgroup, cfs_quota_us/cfs_period_us ${process.env.NODE_CPU_MAX?.replace(" ", "/")}); nodes throttled in ${agents.map((a) => `${a.label} ${throttled(a.id)}`).join(", ")}`,
    `${"".padEnd(48)} ${"trellis median (min–max)".padEnd(28)} ${"gardener-node-agent".padEnd(28)} trellis/peer`,
    ...rows.map(([what, x, unit]) => `${what.padEnd(48)} ${cell(x.trellis).padEnd(28)} ${cell(x.gna).padEnd(28)} ${ratio(mid(x.trellis), mid(x.gna)).padStart(6)}  ${unit}`),
    "¹ file-backed and shared pages: mostly the agent's own executable",
    `start-up: trellis's first reconcile trusts the Node and its record, as the peer's trusts the Node; its check of the node (files hashed, units asked), which the peer does not make, was done ${cell(r.startup.trellis.processStartToNodeCheckedMs)} ms after the process's start`,
    `written to ${saved}`,
  ].join("\n"),
);
