// bun --preload ./build/shims/preload.ts test/bench/reconcile.ts   (bun run bench:reconcile)
//
// The agent's reconcile loop on a real node (systemd in namespaces, test/harness/agent.ts) against a
// real kube-apiserver, with an OSC of 500 files (1–4 KiB) and 50 units (`sleep infinity`, ~10 files
// each in filePaths):
//   1. first apply: Secret creation → the agent's PATCH of the Node annotation (audit log), 3 fresh
//      nodes; and `trellis apply --osc` of the same OSC in 3 fresh nodes (no API server involved);
//   2. idle agent: VmRSS of its MainPID and its CPU time over 30 s, once it settled;
//   3. reaction latency: start of the Secret replace call → start of the changed unit's new process,
//      30 changes, each to one file of one unit's filePaths;
//   4. no-op re-check: `trellis plan --osc` of the applied OSC inside the node (the same observe +
//      plan engine; wall, user, sys, peak RSS over 10 runs), and the agent's own periodic re-check
//      (syncPeriod 15 s): its CPU time and the API requests it makes (audit log).
// Prints the JSON result on stdout (so `| jq` works), progress and a human table on stderr, and
// writes the JSON to test/bench/results/reconcile-<date>.json. About 2 minutes on 2 cores.
// The binary is dist/trellis (built if missing) or $TRELLIS_BENCH_BINARY, copied once at the start.
// On a shared machine the result records, per phase, other test runs' control planes and the host's
// busy CPU: rerun when a phase had company (see sharedMachine in the JSON).
//
// Restarts are observed by the units themselves (test/bench/lib/bench-osc.ts).
import { chmodSync, copyFileSync, readdirSync, readFileSync, rmSync } from "node:fs";
import { CoreV1Api, VersionApi } from "@kubernetes/client-node";
import { sha256Hex } from "../../src/api/desired.ts";
import { type AgentNode, mainPid, readNode, startAgentNode } from "../harness/agent.ts";
import { trellisBinary } from "../harness/binary.ts";
import { type Cluster, startCluster } from "../harness/cluster.ts";
import { runDir, runOk, waitFor } from "../harness/exec.ts";
import { bootNode, type Node } from "../harness/node.ts";
import type { AuditEvent } from "../harness/rbac.ts";
import { AuditTail, auditMs, waitWatching } from "./lib/audit.ts";
import { baseContents, expectedStarts, FILES_PER_UNIT, oscYaml, secretBody, starts, UNITS, unitName } from "./lib/bench-osc.ts";
import { busyCores, cpuSeconds, hostCpu, initClockTicks, machineInfo, memoryKiB, ticksPerSecond } from "./lib/proc.ts";
import { saveResult } from "./lib/results.ts";
import { median, round, summary } from "./lib/stats.ts";

const FIRST_APPLY_RUNS = 3;
const CHANGES = 30;
const PLAN_RUNS = 10;
const IDLE_SECONDS = 30;
const SYNC_PERIOD_S = 15; // the smallest syncPeriod the configuration allows
const PERIODIC_CHECKS = 2;
const CHECKSUM_ANNOTATION = "checksum/cloud-config-data";

// ---------------------------------------------------------------- helpers

const benchStart = performance.now();
const progress = (msg: string) => console.error(`[${((performance.now() - benchStart) / 1000).toFixed(1).padStart(6)} s] ${msg}`);
/** The host's CLOCK_REALTIME in ms with sub-ms precision (monotonic within this run). */
const wallNow = () => performance.timeOrigin + performance.now();
const sleep = (ms: number) => Bun.sleep(ms);

// ---------------------------------------------------------------- observing the node and the server

const describeRequest = (e: AuditEvent) => `${e.stage} ${e.verb} ${e.requestURI}`;
/** Splits the agent's requests: watches (and their resumptions), its heartbeat Lease (kube-system/gardener-node-agent-<node>, renewed every 10 s), the rest. */
function classify(events: AuditEvent[]) {
  const isLease = (e: AuditEvent) => e.objectRef?.resource === "leases" && (e.objectRef.name ?? "").startsWith("gardener-node-agent-");
  return {
    apiRequests: events.filter((e) => e.verb !== "watch" && !isLease(e)).map(describeRequest),
    leaseRequests: events.filter((e) => e.verb !== "watch" && isLease(e)).length,
    watchRequests: events.filter((e) => e.verb === "watch").map(describeRequest),
  };
}
/** The agent's PATCH that set the Node's checksum annotation (metadata, not status). */
function annotationPatch(audit: AuditTail, a: AgentNode, fromMs: number): AuditEvent | undefined {
  return audit
    .by(a.user, fromMs)
    .find((e) => e.verb === "patch" && e.stage === "ResponseComplete" && e.objectRef?.resource === "nodes" && !e.requestURI.includes("/status"));
}

type AgentLog = { ts: string; msg: string; durationMs?: number; steps?: number; restarted?: string[] };
/** The agent's JSON log lines from the node's journal. */
async function agentLog(a: AgentNode, pid?: number): Promise<AgentLog[]> {
  const filter = pid ? [`_PID=${pid}`] : ["-u", "gardener-node-agent.service"];
  const out = await a.node.execOk(["journalctl", ...filter, "-o", "cat", "--no-pager"]);
  return out.split("\n").flatMap((line) => {
    if (!line.startsWith("{")) return [];
    try {
      return [JSON.parse(line) as AgentLog];
    } catch {
      return [];
    }
  });
}
const applied = (logs: AgentLog[]) => logs.filter((l) => l.msg === "OSC applied");

// Runs a command in the node under bash's `time` (ms resolution for real/user/sys of the command
// and its children) and GNU time (peak RSS). Prints "exit real user sys maxrssKiB".
const timeitScript = `#!/bin/bash
TIMEFORMAT='%3R %3U %3S'
t=$( { time /usr/bin/time -f '%M' -o /tmp/timeit.rss "$@" >/tmp/timeit.out 2>/tmp/timeit.err; echo $? >/tmp/timeit.code; } 2>&1 )
echo "$(cat /tmp/timeit.code) $t $(tail -n 1 /tmp/timeit.rss)"
`;
type Timed = { code: number; wallMs: number; userMs: number; sysMs: number; cpuMs: number; maxRssKiB: number };
async function timeIn(node: Node, cmd: string[]): Promise<Timed> {
  const out = (await node.execOk(["/root/timeit.sh", ...cmd], { timeoutMs: 120_000 })).trim().split(/\s+/).map(Number);
  const [code, real, user, sys, rss] = out as [number, number, number, number, number];
  return { code, wallMs: real * 1000, userMs: user * 1000, sysMs: sys * 1000, cpuMs: (user + sys) * 1000, maxRssKiB: rss };
}
function timedSummary(runs: Timed[]) {
  return {
    runs: runs.length,
    wallMs: summary(runs.map((r) => r.wallMs)),
    cpuMs: summary(runs.map((r) => r.cpuMs)),
    userMsMedian: round(median(runs.map((r) => r.userMs))),
    sysMsMedian: round(median(runs.map((r) => r.sysMs))),
    maxRssMiBMedian: round(median(runs.map((r) => r.maxRssKiB)) / 1024),
  };
}

async function waitAnnotation(a: AgentNode, checksum: string, timeoutMs = 120_000): Promise<number> {
  await waitFor(`${a.name} to report ${checksum.slice(0, 12)}`, async () => (await readNode(a)).metadata?.annotations?.[CHECKSUM_ANNOTATION] === checksum, timeoutMs, 20);
  return wallNow();
}

// The machine may be shared (other test runs start their own control planes): every 500 ms the
// benchmark counts the kube-apiservers other than its own, and records the most seen in each phase.
function apiserversRunning(): number {
  let n = 0;
  for (const pid of readdirSync("/proc")) {
    if (!/^\d+$/.test(pid)) continue;
    try {
      if (readFileSync(`/proc/${pid}/comm`, "utf8").trim() === "kube-apiserver") n++;
    } catch {
      // gone meanwhile
    }
  }
  return n;
}
const foreignApiservers: Record<string, number> = {};
/** The host's busy CPU (all processes, this benchmark's included) per phase, in cores: compare runs. */
const hostCpuBusyCores: Record<string, number> = {};
let phaseCpu = hostCpu();
let phase = "";
let foreignSampler: ReturnType<typeof setInterval> | undefined;
const samplePhase = () => {
  foreignApiservers[phase] = Math.max(foreignApiservers[phase] ?? 0, apiserversRunning() - 1);
};
/** Starts a phase (after this run's own kube-apiserver is up). */
const mark = (name: string) => {
  const now = hostCpu();
  if (phase) hostCpuBusyCores[phase] = busyCores(phaseCpu, now);
  phaseCpu = now;
  phase = name;
  if (!name) return clearInterval(foreignSampler); // the end
  foreignSampler ??= setInterval(samplePhase, 500);
  samplePhase();
};

// ---------------------------------------------------------------- the benchmark

const text0 = oscYaml(0);
let binary: string | undefined;
const nodes: Node[] = [];
const stopNode = async (n: Node) => {
  await n.stop();
  nodes.splice(nodes.indexOf(n), 1);
};
let cluster: Cluster | undefined;
const result: Record<string, unknown> = {};

try {
  // Every node gets a private copy taken now: build/test.sh recompiles dist/trellis whenever a test
  // run starts, and a run must not mix two builds.
  const source = process.env.TRELLIS_BENCH_BINARY ?? (await trellisBinary());
  binary = `${runDir("bench")}/trellis`;
  copyFileSync(source, binary);
  chmodSync(binary, 0o755);
  await initClockTicks();
  result.machine = await machineInfo();
  result.osc = {
    files: UNITS * FILES_PER_UNIT,
    units: UNITS,
    filesPerUnit: FILES_PER_UNIT,
    fileSizeKiB: { min: round(Math.min(...baseContents.map((c) => c.length)) / 1024, 2), mean: round(baseContents.reduce((s, c) => s + c.length, 0) / baseContents.length / 1024, 2), max: round(Math.max(...baseContents.map((c) => c.length)) / 1024, 2) },
    yamlKiB: round(text0.length / 1024),
  };

  progress("starting the control plane (etcd + kube-apiserver)");
  cluster = await startCluster({ controllerManager: false });
  const core = cluster.admin().makeApiClient(CoreV1Api);
  const audit = new AuditTail(cluster.auditLog);
  mark("first apply");
  const version = await cluster.admin().makeApiClient(VersionApi).getCode();
  result.versions = {
    trellis: { ...JSON.parse(await runOk([binary, "version", "--json"])), binary: source },
    kubeApiserver: version.gitVersion,
  };

  // ------------------------------------------------ 1. first apply through the API, fresh node each run
  const firstApply: { createToAnnotationMs: number; createToPolledMs: number; createCallMs: number; agentApplyMs: number; steps: number }[] = [];
  let agent: AgentNode | undefined;
  for (let r = 1; r <= FIRST_APPLY_RUNS; r++) {
    const secretName = `osc-bench-${r}`;
    const a = await startAgentNode(cluster, { prefix: `bench${r}`, secretName, start: false });
    nodes.push(a.node);
    await a.node.install(binary, "/opt/bin/gardener-node-agent");
    await a.node.execOk(["systemctl", "enable", "--now", "gardener-node-agent.service"]);
    await waitWatching(audit, a.user);
    await sleep(500); // let the agent's start-up settle
    const body = secretBody(secretName, text0);
    const checksum = sha256Hex(text0);
    const t0 = wallNow();
    await core.createNamespacedSecret({ namespace: "kube-system", body });
    const t1 = wallNow();
    const polled = await waitAnnotation(a, checksum);
    const patch = await waitFor("the annotation PATCH in the audit log", () => annotationPatch(audit, a, t0), 5_000, 20);
    const log = await waitFor("the agent's 'OSC applied' log line", async () => applied(await agentLog(a))[0], 10_000, 200);
    firstApply.push({
      createToAnnotationMs: auditMs(patch.stageTimestamp) - t0,
      createToPolledMs: polled - t0,
      createCallMs: t1 - t0,
      agentApplyMs: log.durationMs ?? NaN,
      steps: log.steps ?? NaN,
    });
    progress(`first apply ${r}/${FIRST_APPLY_RUNS}: ${round((auditMs(patch.stageTimestamp) - t0) / 1000, 2)} s to the Node annotation (agent's apply ${log.durationMs} ms, ${log.steps} steps)`);
    if (r < FIRST_APPLY_RUNS) await stopNode(a.node);
    else agent = a;
  }
  if (!agent) throw new Error("no agent node");
  const a = agent;

  mark("idle");
  // ------------------------------------------------ 2. idle agent: RSS and CPU over 30 s
  await sleep(2_000); // the events and the Node condition follow the annotation
  const pid = await mainPid(a, "gardener-node-agent.service");
  const idleFrom = wallNow();
  const cpu0 = await cpuSeconds(a.node, pid);
  progress(`agent idle for ${IDLE_SECONDS} s (MainPID ${pid} in the node)`);
  await sleep(IDLE_SECONDS * 1000);
  const cpu1 = await cpuSeconds(a.node, pid);
  const idleTo = wallNow();
  const memIdle = await memoryKiB(a.node, pid);
  const idleRequests = audit.by(a.user, idleFrom, idleTo);
  const idleCpuPerS = (cpu1 - cpu0) / ((idleTo - idleFrom) / 1000);
  result.idleAgent = {
    seconds: IDLE_SECONDS,
    vmRssMiB: round(memIdle.vmRssKiB / 1024),
    vmHwmMiB: round(memIdle.vmHwmKiB / 1024),
    cpuSeconds: round(cpu1 - cpu0, 2),
    cpuTickSeconds: 1 / ticksPerSecond(),
    ...classify(idleRequests),
  };

  mark("reaction latency");
  // ------------------------------------------------ 3. reaction latency: 30 changes, one unit each
  const secretName = `osc-bench-${FIRST_APPLY_RUNS}`;
  const latency: number[] = [];
  const callMs: number[] = [];
  const afterResponse: number[] = [];
  const toAnnotation: number[] = [];
  const agentApply: number[] = [];
  const before = await Promise.all(Array.from({ length: UNITS }, (_, u) => starts(a.node, u)));
  if (before.some((s) => s.length !== 1)) throw new Error(`every unit should have started once: ${before.map((s) => s.length).join(",")}`);
  let logsSoFar = applied(await agentLog(a, pid)).length;
  let lastText = text0;
  progress(`${CHANGES} changes, each to one file of one unit`);
  for (let i = 1; i <= CHANGES; i++) {
    const u = (i - 1) % UNITS;
    const count = (await starts(a.node, u)).length;
    lastText = oscYaml(i);
    const body = secretBody(secretName, lastText);
    const checksum = sha256Hex(lastText);
    const t0 = wallNow();
    await core.replaceNamespacedSecret({ name: secretName, namespace: "kube-system", body });
    const t1 = wallNow();
    callMs.push(t1 - t0);
    const started = await waitFor(`${unitName(u)} to restart (change ${i})`, async () => (await starts(a.node, u))[count], 30_000, 2);
    latency.push(started - t0);
    afterResponse.push(started - t1);
    await waitAnnotation(a, checksum, 30_000);
    const patch = await waitFor("the annotation PATCH in the audit log", () => annotationPatch(audit, a, t0), 5_000, 20);
    toAnnotation.push(auditMs(patch.stageTimestamp) - t0);
    const logs = await waitFor("the agent's log line", async () => {
      const l = applied(await agentLog(a, pid));
      return l.length > logsSoFar ? l : undefined;
    }, 10_000, 100);
    logsSoFar = logs.length;
    agentApply.push(logs.at(-1)?.durationMs ?? NaN);
    await sleep(300); // the Node condition and the event follow the annotation
  }
  const after = await Promise.all(Array.from({ length: UNITS }, (_, u) => starts(a.node, u)));
  const unexpected = after.map((s, u) => s.length - expectedStarts(u, CHANGES)).reduce((x, y) => x + Math.abs(y), 0);
  if (unexpected !== 0) throw new Error(`unexpected unit starts: ${after.map((s) => s.length).join(",")}`);
  result.reactionLatency = {
    changes: CHANGES,
    note: "ms from the start of the Secret replace call to the start of the changed unit's new process (its own $EPOCHREALTIME); p99 is nearest-rank, i.e. the largest of 30 samples",
    toUnitRestartMs: summary(latency),
    replaceCallMs: summary(callMs),
    replaceResponseToUnitRestartMs: summary(afterResponse),
    toNodeAnnotationMs: summary(toAnnotation),
    agentApplyMs: summary(agentApply),
    otherUnitsRestarted: unexpected,
  };
  progress(`reaction latency median ${round(median(latency))} ms, max ${round(Math.max(...latency))} ms`);

  mark("trellis plan");
  // ------------------------------------------------ 4a. no-op re-check: `trellis plan` of the applied OSC
  await a.node.writeFile("/root/timeit.sh", timeitScript, 0o755);
  await a.node.writeFile("/root/osc.yaml", lastText, 0o600);
  const agentBin = "/opt/bin/gardener-node-agent";
  const versionRuns: Timed[] = [];
  const planRuns: Timed[] = [];
  const planFilesOnlyRuns: Timed[] = [];
  await timeIn(a.node, [agentBin, "plan", "--osc", "/root/osc.yaml"]); // warm-up (page cache)
  for (let i = 0; i < PLAN_RUNS; i++) {
    planRuns.push(await timeIn(a.node, [agentBin, "plan", "--osc", "/root/osc.yaml"]));
    // --root other than "/" does not consult systemd; "/." is the same files.
    planFilesOnlyRuns.push(await timeIn(a.node, [agentBin, "plan", "--osc", "/root/osc.yaml", "--root", "/."]));
    versionRuns.push(await timeIn(a.node, [agentBin, "version"]));
  }
  if ([...planRuns, ...planFilesOnlyRuns].some((r) => r.code !== 0)) {
    throw new Error(`trellis plan found changes on the applied node (exit ${planRuns.map((r) => r.code).join(",")}):\n${await a.node.readFile("/tmp/timeit.out")}`);
  }
  progress(`trellis plan (no-op): median ${round(median(planRuns.map((r) => r.wallMs)))} ms wall`);

  mark("periodic re-checks");
  // ------------------------------------------------ 4b. the agent's own periodic re-check (syncPeriod 15 s)
  const config = await a.node.readFile("/var/lib/gardener-node-agent/config.yaml");
  await a.node.writeFile("/var/lib/gardener-node-agent/config.yaml", config.replace(/syncPeriod: .*/, `syncPeriod: ${SYNC_PERIOD_S}s`), 0o600);
  await a.node.execOk(["systemctl", "restart", "gardener-node-agent.service"]);
  const pid2 = await mainPid(a, "gardener-node-agent.service");
  progress(`agent restarted with syncPeriod ${SYNC_PERIOD_S}s; waiting for ${PERIODIC_CHECKS} periodic re-checks`);
  const startupCheck = await waitFor("the agent's start-up reconcile", async () => applied(await agentLog(a, pid2))[0], 30_000, 200);
  // Sample the agent's CPU time every 20 ms from the host (reads /proc only, spawns nothing).
  const samples: { at: number; cpu: number }[] = [];
  let sampling = true;
  const sampler = (async () => {
    while (sampling) {
      samples.push({ at: wallNow(), cpu: await cpuSeconds(a.node, pid2) });
      await sleep(20);
    }
  })();
  const checks = await waitFor(
    `${PERIODIC_CHECKS} periodic re-checks`,
    async () => {
      const l = applied(await agentLog(a, pid2));
      return l.length > PERIODIC_CHECKS ? l : undefined;
    },
    (PERIODIC_CHECKS + 1) * SYNC_PERIOD_S * 1000 + 10_000,
    1_000,
  );
  await sleep(1_000);
  sampling = false;
  await sampler;
  const cpuAt = (t: number) => (samples.findLast((s) => s.at <= t) ?? (samples[0] as { cpu: number })).cpu;
  const periodic = checks.slice(1, PERIODIC_CHECKS + 1).map((line, k) => {
    const prevEnd = Date.parse((checks[k] as AgentLog).ts);
    const end = Date.parse(line.ts);
    // The window: from 10 s after the previous reconcile (the agent idles until prevEnd + 15 s) to
    // 1 s after this one logged; the idle CPU in between is ~0 (measured above).
    const from = prevEnd + 10_000;
    const to = end + 1_000;
    const requests = audit.by(a.user, from, to);
    const windowCpuMs = (cpuAt(to) - cpuAt(from)) * 1000;
    return {
      cpuMs: round(windowCpuMs - idleCpuPerS * (to - from)), // idle s/s × window ms = ms
      windowCpuMs: round(windowCpuMs),
      windowS: round((to - from) / 1000, 1),
      // The timer fires syncPeriod after the previous reconcile ended (just after its log line).
      wallMs: end - prevEnd - SYNC_PERIOD_S * 1000,
      applyDesiredMs: line.durationMs ?? NaN,
      ...classify(requests),
    };
  });
  const memAfter = await memoryKiB(a.node, pid2);
  const phase = audit.by(a.user, Date.parse(startupCheck.ts) + 1_000, wallNow());
  result.noopRecheck = {
    trellisPlan: {
      ...timedSummary(planRuns),
      note: `\`trellis plan --osc\` of the last applied OSC inside the node (exit 0: nothing to do): parse the ${round(text0.length / 1048576, 2)} MiB OSC, hash all 500 files + 50 unit files, ask systemd for 50 units, plan; process start-up included`,
    },
    trellisPlanFilesOnly: {
      ...timedSummary(planFilesOnlyRuns),
      note: "the same with --root /. (systemd is not consulted for any --root but /): the difference is the 50 units' status over D-Bus",
    },
    trellisVersion: { ...timedSummary(versionRuns), note: "`trellis version` the same way: the process start-up part of the above" },
    agentPeriodic: {
      syncPeriod: `${SYNC_PERIOD_S}s`,
      checks: periodic,
      wholePhase: { seconds: round((wallNow() - Date.parse(startupCheck.ts) - 1_000) / 1000), ...classify(phase) },
      note: "cpuMs: the agent's utime+stime (/proc/PID/stat, 10 ms ticks, sampled every 20 ms) from 10 s after the previous reconcile to 1 s after this one, less the idle rate (the agent's other periodic work, health checks every 30 s and the unit check every minute, may still fall into a window); wallMs: interval between consecutive 'OSC applied' log lines less syncPeriod (decode, parse, observe, plan, state write; ms resolution); applyDesiredMs: the agent's own log (observe+plan+state write, without decoding and parsing the Secret); apiRequests: from the audit log, without watches and the liveness Lease's requests (counted apart)",
    },
    agentRssAfterPeriodicChecksMiB: round(memAfter.vmRssKiB / 1024),
  };
  progress(`periodic re-checks: ${periodic.map((p) => `${p.cpuMs} ms CPU, ${p.apiRequests.length} API requests`).join("; ")}`);
  await stopNode(a.node);

  mark("trellis apply");
  // ------------------------------------------------ 5. the same OSC with `trellis apply --osc`, no API server
  const localApply: Timed[] = [];
  for (let r = 1; r <= FIRST_APPLY_RUNS; r++) {
    const n = await bootNode(`benchapply${r}`, { net: "private" });
    nodes.push(n);
    await n.install(binary, "/opt/bin/trellis");
    await n.writeFile("/root/timeit.sh", timeitScript, 0o755);
    await n.writeFile("/root/osc.yaml", text0, 0o600);
    await sleep(500);
    const t = await timeIn(n, ["/opt/bin/trellis", "apply", "--osc", "/root/osc.yaml"]);
    if (t.code !== 0) throw new Error(`trellis apply exited ${t.code}:\n${await n.readFile("/tmp/timeit.err")}`);
    // A started job of a simple service is done once its process is forked: its own record of the start may follow.
    const startedOnce = async () => (await Promise.all(Array.from({ length: UNITS }, (_, u) => starts(n, u)))).filter((s) => s.length === 1).length;
    await waitFor(`all ${UNITS} units started once after trellis apply`, async () => (await startedOnce()) === UNITS, 10_000, 100).catch(async () => {
      throw new Error(`after trellis apply only ${await startedOnce()} of ${UNITS} units started once`);
    });
    localApply.push(t);
    progress(`trellis apply --osc ${r}/${FIRST_APPLY_RUNS}: ${round(t.wallMs)} ms`);
    await stopNode(n);
  }

  result.firstApply = {
    runs: FIRST_APPLY_RUNS,
    viaApiServer: {
      createToNodeAnnotationMs: summary(firstApply.map((f) => f.createToAnnotationMs)),
      createToAnnotationPolledMs: summary(firstApply.map((f) => f.createToPolledMs)),
      createCallMs: summary(firstApply.map((f) => f.createCallMs)),
      agentApplyMs: summary(firstApply.map((f) => f.agentApplyMs)),
      steps: firstApply[0]?.steps,
      note: "from the start of the Secret create call to the agent's PATCH of the Node annotation (its ResponseComplete in the audit log); Polled: seen by polling the Node every 20 ms; agentApplyMs: the agent's own log (observe + plan + execute)",
    },
    trellisApplyOsc: { ...timedSummary(localApply), note: "`trellis apply --osc` in a fresh node, no API server: process start-up included" },
  };
  mark("");
  result.sharedMachine = {
    foreignApiservers,
    hostCpuBusyCores,
    note: "foreignApiservers: the most kube-apiservers of other runs seen during each phase (sampled every 500 ms); hostCpuBusyCores: the whole machine's busy CPU per phase, this run's included (compare with a quiet run): figures from a phase with other test runs are less trustworthy",
  };
  result.finishedAt = new Date().toISOString();
  result.benchSeconds = round((performance.now() - benchStart) / 1000);
} finally {
  clearInterval(foreignSampler);
  for (const n of [...nodes].reverse()) await n.stop().catch((err: unknown) => console.error(`stopping node ${n.name}: ${String(err)}`));
  await cluster?.stop();
  if (binary) rmSync(binary, { force: true });
}

// ---------------------------------------------------------------- output

const date = new Date().toISOString().slice(0, 10);
const saved = saveResult("reconcile", { date, ...result }, date);

type S = { median: number; p99: number; min: number; max: number };
const r = result as {
  firstApply: { viaApiServer: { createToNodeAnnotationMs: S; agentApplyMs: S }; trellisApplyOsc: { wallMs: S; cpuMs: S } };
  reactionLatency: { toUnitRestartMs: S; toNodeAnnotationMs: S; agentApplyMs: S };
  noopRecheck: {
    trellisPlan: { wallMs: S; cpuMs: S; maxRssMiBMedian: number };
    trellisPlanFilesOnly: { wallMs: S };
    trellisVersion: { wallMs: S };
    agentPeriodic: { checks: { cpuMs: number; wallMs: number; applyDesiredMs: number; apiRequests: string[] }[] };
  };
  idleAgent: { vmRssMiB: number; cpuSeconds: number; apiRequests: string[]; leaseRequests: number };
};
const row = (what: string, s: S, unit = "ms") => `${what.padEnd(52)} ${`${s.median}`.padStart(8)} ${`${s.p99}`.padStart(8)} ${`${s.min}`.padStart(8)} ${`${s.max}`.padStart(8)}  ${unit}`;
const checks = r.noopRecheck.agentPeriodic.checks;
console.error(
  [
    "",
    `${"".padEnd(52)} ${"median".padStart(8)} ${"p99".padStart(8)} ${"min".padStart(8)} ${"max".padStart(8)}`,
    row("reaction: replace → changed unit restarted (30)", r.reactionLatency.toUnitRestartMs),
    row("reaction: replace → Node annotation (30)", r.reactionLatency.toNodeAnnotationMs),
    row("reaction: agent's apply (its log) (30)", r.reactionLatency.agentApplyMs),
    row("first apply: create → Node annotation (3)", r.firstApply.viaApiServer.createToNodeAnnotationMs),
    row("first apply: agent's apply (its log) (3)", r.firstApply.viaApiServer.agentApplyMs),
    row("first apply: trellis apply --osc, wall (3)", r.firstApply.trellisApplyOsc.wallMs),
    row("no-op: trellis plan --osc, wall (10)", r.noopRecheck.trellisPlan.wallMs),
    row("no-op: trellis plan --osc, CPU (10)", r.noopRecheck.trellisPlan.cpuMs),
    row("no-op: trellis plan --osc --root /., wall (10)", r.noopRecheck.trellisPlanFilesOnly.wallMs),
    row("start-up: trellis version, wall (10)", r.noopRecheck.trellisVersion.wallMs),
    `no-op periodic re-check in the agent: CPU ${checks.map((c) => `${c.cpuMs} ms`).join(", ")}; wall ${checks.map((c) => `${c.wallMs} ms`).join(", ")}; applyDesired ${checks.map((c) => `${c.applyDesiredMs} ms`).join(", ")}; API requests ${checks.map((c) => c.apiRequests.length).join(", ")}`,
    `idle agent: VmRSS ${r.idleAgent.vmRssMiB} MiB, CPU ${r.idleAgent.cpuSeconds} s in ${IDLE_SECONDS} s, API requests ${r.idleAgent.apiRequests.length} (+${r.idleAgent.leaseRequests} for its Lease); trellis plan peak RSS ${r.noopRecheck.trellisPlan.maxRssMiBMedian} MiB`,
    `other test runs' kube-apiservers seen per phase: ${Object.entries(foreignApiservers).map(([p, n]) => `${p} ${n}`).join(", ")}`,
    `host CPU busy per phase (cores of ${(result.machine as { nproc: number }).nproc}, this run included): ${Object.entries(hostCpuBusyCores).map(([p, n]) => `${p} ${n}`).join(", ")}`,
    `written to ${saved}`,
  ].join("\n"),
);
