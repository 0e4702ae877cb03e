// bench:fleet's scale mode (`bun run bench:fleet -- --mode scale`): what a fleet rollout costs the API
// server as the pool grows, for trellis's pool protocol and for gardener-node-agent's serial rollout.
// A real kube-apiserver + etcd hold pools of 200, 1,000 and 5,000 Nodes shaped as kubelet writes them
// (test/bench/lib/scale-pool.ts) and every node's two heartbeat Leases; the agents are simulated in this
// process, each with its own user, running the real protocol code (test/bench/lib/scale-agents.ts).
// Everything is measured at the API server: its /metrics before and after each phase, its CPU time from
// /proc, and its audit log for who listed what.
//
// Time is compressed: an apply takes 200 ms and the settle time 2 s, standing for 6 s and trellis's default
// settle time of 60 s (30×). The protocols' own timers are not compressed (the leader's renewal every 10 s,
// the watches' 4–10 minute reopening), so the rates at real speed are computed, per phase, from the
// event-driven requests spread over 30× the rollout's designed length plus the periodic ones as measured.
//
// Per pool: the heartbeats alone (pools up to --heartbeat-up-to; above, their rate is 2·N/10 s by
// definition); trellis with k = 10 % to the end (agents just started: their first rollout opens their
// watches), a minute of the same agents idle, trellis with k = 1 on those agents (watches open, as in a
// later rollout: to the end in pools up to --full-k1-up-to, else the first --handovers hand-overs), and
// gardener-node-agent serial (informers open from the start, as its are; the first --handovers
// hand-overs). The heartbeats are off during the rollouts, so that the Lease traffic measured there is the
// rollout's. Writes test/bench/results/fleet-scale-<date>.json and docs/fleet-scale.svg.
import { Buffer } from "node:buffer";
import { randomBytes } from "node:crypto";
import { closeSync, fstatSync, openSync, readdirSync, readFileSync, readSync, statSync, writeFileSync } from "node:fs";
import { dirname } from "node:path";
import type { Budget } from "../../../src/api/rollout.ts";
import { leaseApi } from "../../../src/kube/lease-api.ts";
import { poolLeaseLabel, ticketLabel } from "../../../src/rollout/pool.ts";
import { type Cluster, startCluster } from "../../harness/cluster.ts";
import { leaseTotals, scrape, type Scrape, type Window, windowOf } from "./apiserver-metrics.ts";
import { busyCores, cpuSecondsAt, hostCpu, initClockTicks, machineInfo, procKiB } from "./proc.ts";
import { saveResult } from "./results.ts";
import { overlap } from "./rollout-svg.ts";
import { countedLeases, freeSerialLease, gnaAgent, leaseRole, type SimAgent, type Tally, tallyLogger, trellisAgent, type WatchRecord, watchStats, writeAnswerBytes } from "./scale-agents.ts";
import { type Admin, adminOf, agentUser, call, callOk, createLease, grantLeases, heartbeatLeases, type Heartbeat, impersonated, inBatches, nodeBody, nodeName, startHeartbeats } from "./scale-pool.ts";
import { scaleSvg } from "./scale-svg.ts";
import { median, round, summary } from "./stats.ts";

export type ScaleOptions = {
  sizes: number[];
  applyMs: number;
  settleMs: number;
  /** Hand-overs measured where a rollout is not run to its end. */
  handovers: number;
  fullK1UpTo: number;
  heartbeatUpTo: number;
  heartbeatSeconds: number;
  idleSeconds: number;
  controlPlaneNice: number;
  progress: (msg: string) => void;
};

/** trellis's default settle time: what the bench's settle time stands for. */
const realSettleMs = 60_000;
const heartbeatPeriodMs = 10_000;
const leaderInfo = "info: leading the pool's rollout: admitting waiting nodes";

/**
 * Bun's fetch sends at most 256 requests at once (a watch is one for as long as it is open) unless
 * BUN_CONFIG_MAX_HTTP_REQUESTS, read when Bun starts, says more: the bench runs itself again with it set.
 * Returns the exit code of that run, or undefined when this is it.
 */
export async function relaunchForManyWatches(): Promise<number | undefined> {
  if (process.env.BUN_CONFIG_MAX_HTTP_REQUESTS) return undefined;
  const preload = new URL("../../../build/shims/preload.ts", import.meta.url).pathname;
  const child = Bun.spawn([process.execPath, "--preload", preload, ...process.argv.slice(1)], { env: { ...process.env, BUN_CONFIG_MAX_HTTP_REQUESTS: "65535" }, stdio: ["inherit", "inherit", "inherit"] });
  return await child.exited;
}

type NodeRef = { name: string; uid: string };
type Rates = { requestsPerS: number; bytesPerS: number; watchEventsPerS: number; perNode: { requestsPerS: number; bytesPerS: number; watchEventsPerS: number } };
type ListCount = { what: string; count: number; users: number; perUserMax: number };

export type PhaseResult = {
  agent: "trellis" | "gardener-node-agent";
  pool: number;
  k: number;
  budget: string;
  /** The agents' watches were open before the change (a later rollout), or opened by it (the first after they started). */
  watchesOpenBefore: boolean;
  /** Every node rolled; false: the run stopped after the first hand-overs. */
  complete: boolean;
  rolled: number;
  seconds: number;
  machine: Load;
  /** What the API server served for Leases in the window (requests without WATCH; watch opens counted by the agents). */
  served: { requests: number; watchOpens: number; readAnswerBytes: number; writeAnswerBytes: number; watchEvents: number; watchEventBytes: number; failures: number; watchesOpenAtEnd: number };
  /** Periodic requests and watch events in the window (the leader's renewals, the watches' reopening): not compressed. */
  periodic: { requests: number; watchEvents: number };
  /** From the change until every node's request was written (gardener-node-agent: none, its start is its first hand-over). */
  start: { seconds: number; requestsPerNode: number; bytesPerNode: number; watchEventsPerNode: number };
  bench: Rates;
  realSpeed: Rates;
  /** The event-driven cost of rolling one node (periodic traffic left out): its share of the start and one hand-over. */
  perNodeRolled: { requests: number; responseBytes: number; watchEvents: number; watchEventBytes: number };
  duration: { seconds: number; perNodeS: number; idealS: number; ratio: number; basis: string; requestsWrittenS: number; firstGrantS: number };
  handoverMs?: ReturnType<typeof summary>;
  maxConcurrentHolders: number;
  /** How many times an agent started leading the pool (trellis). */
  leaderships: number;
  lists: ListCount[];
  window: Window;
  client: Record<string, number>;
  watches: ReturnType<typeof watchStats>;
  warnings: string[];
};

export type HeartbeatResult = { pool: number; measured: boolean; requestsPerS: number; bytesPerS: number; apiserverCores?: number; perNodeRequestsPerS: number; sent?: number; failed?: number; lateMs?: number };

/** A pool of idle trellis agents after a rollout: their watches stay open. */
export type IdleResult = {
  pool: number;
  seconds: number;
  watchesOpen: number;
  /** In the minute measured, which follows a rollout that opened or reopened the watches together. */
  requestsPerS: number;
  watchEventsPerS: number;
  watchEventBytesPerS: number;
  apiserverCores: number;
  /** In the long run: each open watch reopened once per 300 s on average (src/kube/watch.ts: 240–360 s). */
  longRunRequestsPerS: number;
  /** gardener-node-agent's, for comparison: one informer per agent on the serial Lease, reopened every 300–600 s (client-go's reflector). */
  gnaLongRunRequestsPerS: number;
};

export async function scaleMode(o: ScaleOptions): Promise<void> {
  const { progress } = o;
  await initClockTicks();
  const machine = await machineInfo();
  const compression = realSettleMs / o.settleMs;
  const result: Record<string, unknown> = {
    date: new Date().toISOString().slice(0, 10),
    machine,
    controlPlaneNice: o.controlPlaneNice,
    time: {
      applyMs: o.applyMs,
      settleMs: o.settleMs,
      compression,
      standsFor: `apply ${(o.applyMs * compression) / 1000} s, settle ${realSettleMs / 1000} s (trellis's default): ${compression}× compressed; the protocols' timers (leader renewal 10 s, watch reopening) run at real speed`,
    },
    code: provenance(),
  };
  const cluster = await startCluster({ controllerManager: false, controlPlaneNice: o.controlPlaneNice });
  const admin = adminOf(cluster);
  const nodes: NodeRef[] = [];
  const beats: Heartbeat[] = [];
  const heartbeats: HeartbeatResult[] = [];
  const idle: IdleResult[] = [];
  const phases: PhaseResult[] = [];
  const nodeBytes: Record<number, number> = {};
  try {
    await grantLeases(admin);
    const poolSecret = await createSecret(admin, "gardener-node-agent-worker-scale");
    const env = { o, cluster, admin, compression, statusBytes: await conflictBytes(admin), auditAt: auditMark(cluster.auditLog) };
    for (const n of o.sizes) {
      progress(`pool of ${n}: creating ${n - nodes.length} Nodes and their ${2 * (n - nodes.length)} heartbeat Leases`);
      await grow(admin, n, poolSecret.name, nodes, beats);
      nodeBytes[n] = (await call(admin, "GET", `/api/v1/nodes/${nodes[0]?.name}`)).text.length;
      progress(`pool of ${n}: a Node is ${nodeBytes[n]} bytes of JSON as served`);
      heartbeats.push(n <= o.heartbeatUpTo ? await heartbeatPhase(o, cluster, admin, beats) : computedHeartbeats(n, heartbeats));
      const pool = { ...env, nodes: nodes.slice(0, n) };
      const t = await trellisRollouts(pool);
      phases.push(...t.phases);
      idle.push(t.idle);
      phases.push(await gnaPhase(pool, Math.min(n, o.handovers)));
      for (const p of phases.filter((x) => x.pool === n)) progress(`pool of ${n}: ${line(p, heartbeats)}`);
    }
  } finally {
    await cluster.stop();
  }
  Object.assign(result, { nodeBytes, heartbeats, idle, phases, goals: goals(phases, heartbeats, o.sizes, compression) });
  const saved = saveResult("fleet-scale", result, result.date as string);
  writeFileSync(new URL("../../../docs/fleet-scale.svg", import.meta.url), scaleSvg(phases, heartbeats, `fleet rollout cost at the API server against pool size, at real speed (${compression}× the bench's time; ${result.date})`));
  console.error(["", ...table(phases, heartbeats, idle), "", ...(result.goals as string[]), `written to ${saved} and docs/fleet-scale.svg`].join("\n"));
}

async function createSecret(admin: Admin, name: string): Promise<{ name: string; uid: string }> {
  const s = (await callOk(admin, "POST", "/api/v1/namespaces/kube-system/secrets", { metadata: { name, labels: { "gardener.cloud/role": "operating-system-config" } }, data: {} })) as { metadata: { uid: string } };
  return { name, uid: s.metadata.uid };
}

const newPoolSecret = (admin: Admin) => createSecret(admin, `gardener-node-agent-worker-${randomBytes(4).toString("hex")}`);

async function grow(admin: Admin, n: number, secret: string, nodes: NodeRef[], beats: Heartbeat[]): Promise<void> {
  const fresh = await inBatches(
    Array.from({ length: n - nodes.length }, (_, j) => nodes.length + j),
    32,
    async (i) => {
      const created = (await callOk(admin, "POST", "/api/v1/nodes?fieldManager=kubelet", nodeBody(i, secret))) as { metadata: { name: string; uid: string } };
      const node = { name: created.metadata.name, uid: created.metadata.uid };
      const leases = heartbeatLeases(node.name, node.uid);
      for (const l of leases) await createLease(admin, l.beat, l.body);
      return { node, beats: leases.map((l) => l.beat) };
    },
  );
  for (const f of fresh) {
    nodes.push(f.node);
    beats.push(...f.beats);
  }
}

/** The size of the Status a refused write of a pool Lease gets back (a 409), measured once. */
async function conflictBytes(admin: Admin): Promise<number> {
  const name = `gardener-node-agent-worker-00000000-node-${nodeName(0)}`;
  const path = "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases";
  const created = (await callOk(admin, "POST", path, { metadata: { name }, spec: {} })) as { metadata: { resourceVersion: string } };
  await callOk(admin, "PUT", `${path}/${name}`, { metadata: { name, resourceVersion: created.metadata.resourceVersion }, spec: { holderIdentity: "x" } });
  const refused = await call(admin, "PUT", `${path}/${name}`, { metadata: { name, resourceVersion: created.metadata.resourceVersion }, spec: {} });
  await callOk(admin, "DELETE", `${path}/${name}`);
  if (refused.status !== 409) throw new Error(`a stale write was answered ${refused.status}, not 409`);
  return refused.text.length;
}

/** Which code ran: the commit, and the protocol's files that differ from it. */
function provenance(): { commit: string; uncommitted: string[] } {
  const git = (args: string[]) => Bun.spawnSync(["git", ...args], { cwd: new URL("../../..", import.meta.url).pathname }).stdout.toString().trim();
  return { commit: git(["rev-parse", "HEAD"]), uncommitted: git(["status", "--short", "--", "src/kube", "src/rollout", "src/loops.ts"]).split("\n").filter(Boolean) };
}

// ---------------------------------------------------------------- what the machine did in a window

type Sample = { at: number; apiserver: number; etcd: number; bench: number; host: ReturnType<typeof hostCpu> };
type Load = { apiserverCores: number; etcdCores: number; benchCores: number; hostBusyCores: number; loadAvg: string; apiserverRssMiB: number; benchRssMiB: number };

function sample(cluster: Cluster): Sample {
  const { apiserver, etcd } = cluster.pids();
  if (!apiserver || !etcd) throw new Error("the control plane is not running");
  return { at: performance.now(), apiserver: cpuSecondsAt("", apiserver), etcd: cpuSecondsAt("", etcd), bench: cpuSecondsAt("", process.pid), host: hostCpu() };
}

/** The window's CPU by process, and the whole machine's (other work on it shows as the difference). */
function load(cluster: Cluster, a: Sample, b: Sample): Load {
  const s = (b.at - a.at) / 1000;
  const rss = (pid: number | undefined) => (pid ? round(procKiB("", pid, "status", ["VmRSS"]).VmRSS / 1024, 0) : 0);
  return {
    apiserverCores: round((b.apiserver - a.apiserver) / s, 3),
    etcdCores: round((b.etcd - a.etcd) / s, 3),
    benchCores: round((b.bench - a.bench) / s, 3),
    hostBusyCores: busyCores(a.host, b.host),
    loadAvg: readFileSync("/proc/loadavg", "utf8").split(" ").slice(0, 3).join(" "),
    apiserverRssMiB: rss(cluster.pids().apiserver),
    benchRssMiB: rss(process.pid),
  };
}

async function heartbeatPhase(o: ScaleOptions, cluster: Cluster, admin: Admin, beats: Heartbeat[]): Promise<HeartbeatResult> {
  const n = beats.length / 2;
  o.progress(`pool of ${n}: heartbeats alone, ${beats.length} Leases every ${heartbeatPeriodMs / 1000} s, for ${o.heartbeatSeconds} s after one period to warm up`);
  const gen = startHeartbeats(admin, beats, heartbeatPeriodMs);
  await Bun.sleep(heartbeatPeriodMs + 2_000);
  const c0 = sample(cluster);
  gen.measure();
  await Bun.sleep(o.heartbeatSeconds * 1000);
  const stats = await gen.stop();
  const c1 = sample(cluster);
  return {
    pool: n,
    measured: true,
    requestsPerS: round(stats.sent / stats.seconds, 1),
    // PUTs: the API server does not measure their answers; the generator did.
    bytesPerS: round(stats.answerBytes / stats.seconds, 0),
    apiserverCores: load(cluster, c0, c1).apiserverCores,
    perNodeRequestsPerS: round(stats.sent / stats.seconds / n, 4),
    sent: stats.sent,
    failed: stats.failed,
    lateMs: stats.lateMs,
  };
}

/** A pool too large to renew its heartbeats beside the bench on this machine: their rate by definition, their bytes and CPU per request as measured on the largest pool that ran them. */
function computedHeartbeats(n: number, measured: HeartbeatResult[]): HeartbeatResult {
  const ran = measured.filter((h) => h.measured).at(-1);
  const requestsPerS = (2 * n) / (heartbeatPeriodMs / 1000);
  const per = (x: number | undefined) => (ran && x !== undefined ? round((x / ran.requestsPerS) * requestsPerS, 2) : undefined);
  return { pool: n, measured: false, requestsPerS, bytesPerS: per(ran?.bytesPerS) ?? 0, apiserverCores: per(ran?.apiserverCores), perNodeRequestsPerS: requestsPerS / n };
}

// ---------------------------------------------------------------- phases

type Env = { o: ScaleOptions; cluster: Cluster; admin: Admin; nodes: NodeRef[]; compression: number; statusBytes: number; auditAt: AuditAt };

/** The agents of a phase: each with its user and counted Lease port, all sharing the tallies. */
function kitFor(env: Env, secret: string) {
  const tally: Tally = new Map();
  const watches: WatchRecord[] = [];
  const warnings: string[] = [];
  const log = tallyLogger(tally, warnings);
  const role = leaseRole(secret);
  const forNode = (node: NodeRef) => {
    const kube = impersonated(env.admin, agentUser(node.name));
    return { kube, api: countedLeases(leaseApi(kube, "kube-system", log), tally, role, watches, env.statusBytes) };
  };
  return { tally, watches, warnings, log, forNode };
}
type Kit = ReturnType<typeof kitFor>;

/** The tallies and watch statistics as they stand: a window's are the difference of two. */
type Snapshot = { tally: Map<string, number>; watches: ReturnType<typeof watchStats>; warnings: number };
const snapshot = (kit: Kit): Snapshot => ({ tally: new Map(kit.tally), watches: watchStats(kit.watches), warnings: kit.warnings.length });

type Mark = { scrape: Scrape; sample: Sample; snapshot: Snapshot };

const mark = async (env: Env, kit: Kit): Promise<Mark> => ({ scrape: await scrape(env.admin), sample: sample(env.cluster), snapshot: snapshot(kit) });

async function begin(env: Env, kit: Kit): Promise<Mark> {
  env.auditAt = auditMark(env.cluster.auditLog);
  return mark(env, kit);
}

type End = Mark & { window: Window; lists: ListCount[]; load: Load };

async function end(env: Env, kit: Kit, before: Mark): Promise<End> {
  const after = await mark(env, kit);
  // The audit log is written after the response.
  await Bun.sleep(1_000);
  return { ...after, window: windowOf(before.scrape, after.scrape), lists: auditLists(env.cluster.auditLog, env.auditAt), load: load(env.cluster, before.sample, after.sample) };
}

/** trellis on one pool: a k = 10 % rollout by agents just started, a minute idle, a k = 1 rollout by the same agents. */
async function trellisRollouts(env: Env): Promise<{ phases: PhaseResult[]; idle: IdleResult }> {
  const { o, admin, nodes } = env;
  const n = nodes.length;
  const secret = await newPoolSecret(admin);
  const kit = kitFor(env, secret.name);
  let budget: Budget = { text: "10%", percent: 10 };
  const agents = nodes.map((node) => trellisAgent({ api: kit.forNode(node).api, ref: { secret, node }, budget: () => budget, applyMs: o.applyMs, settleMs: o.settleMs, log: kit.log.with({ node: node.name }), tally: kit.tally }));
  o.progress(`pool of ${n}: trellis: starting ${n} agents (each creates its ticket)`);
  await inBatches(agents, 64, (a) => a.start());
  await Bun.sleep(2_000);
  const phases = [await trellisRollout(env, kit, agents, budget, n, false)];
  o.progress(`pool of ${n}: trellis: ${o.idleSeconds} s with every agent idle`);
  const i0 = await begin(env, kit);
  await Bun.sleep(o.idleSeconds * 1000);
  const i1 = await end(env, kit, i0);
  budget = { text: "1", count: 1 };
  phases.push(await trellisRollout(env, kit, agents, budget, n <= o.fullK1UpTo ? n : o.handovers, true));
  await Promise.all(agents.map((a) => a.stop()));
  for (const label of [`${ticketLabel}=${secret.name}`, `${poolLeaseLabel}=${secret.name}`]) await callOk(admin, "DELETE", `/apis/coordination.k8s.io/v1/namespaces/kube-system/leases?labelSelector=${label}`);
  const t = leaseTotals(i1.window);
  const requests = t.requests + t.watchRequests;
  return {
    phases,
    idle: {
      pool: n,
      seconds: round(i1.window.seconds),
      watchesOpen: t.watchesOpen,
      requestsPerS: round(requests / i1.window.seconds, 2),
      watchEventsPerS: round(t.watchEvents / i1.window.seconds, 2),
      watchEventBytesPerS: round(t.watchEventBytes / i1.window.seconds, 0),
      apiserverCores: i1.load.apiserverCores,
      longRunRequestsPerS: round(t.watchesOpen / 300, 2),
      gnaLongRunRequestsPerS: round(n / 450, 2),
    },
  };
}

async function trellisRollout(env: Env, kit: Kit, agents: ReturnType<typeof trellisAgent>[], budget: Budget, target: number, warm: boolean): Promise<PhaseResult> {
  const { o } = env;
  const n = agents.length;
  const k = "count" in budget ? budget.count : Math.max(1, Math.floor((budget.percent * n) / 100));
  o.progress(`pool of ${n}: trellis, k = ${budget.text} (${k}), ${target === n ? "every node" : `the first ${target} hand-overs`}, watches ${warm ? "open from the rollout before" : "opened by this rollout"}`);
  const before = await begin(env, kit);
  const revision = randomBytes(8).toString("hex");
  await Promise.all(agents.map((a) => a.roll(revision)));
  const written = await mark(env, kit);
  o.progress(`pool of ${n}: trellis k = ${budget.text}: all ${n} requests written after ${round((written.sample.at - before.sample.at) / 1000)} s`);
  await until(o, agents, target, k);
  const after = await end(env, kit, before);
  return summarise(env, { agent: "trellis", k, budget: budget.text, warm, agents, kit, before, written, after });
}

async function gnaPhase(env: Env, target: number): Promise<PhaseResult> {
  const { o, admin, nodes } = env;
  const n = nodes.length;
  const secret = await newPoolSecret(admin);
  await callOk(admin, "POST", "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases", freeSerialLease(secret));
  const kit = kitFor(env, secret.name);
  o.progress(`pool of ${n}: gardener-node-agent serial, the first ${target} hand-overs: starting ${n} agents and their informers`);
  const agents = nodes.map((node) => {
    const { kube, api } = kit.forNode(node);
    return gnaAgent({ kube, api, secret, identity: node.name, applyMs: o.applyMs, settleMs: o.settleMs, log: kit.log.with({ node: node.name }), tally: kit.tally, watches: kit.watches });
  });
  await Promise.all(agents.map((a) => a.start()));
  await Bun.sleep(2_000);
  const before = await begin(env, kit);
  for (const a of agents) a.roll();
  // Its first hand-over's storm is its start: every node's Update at once, as at every hand-over.
  const written = await mark(env, kit);
  await until(o, agents, target, 1);
  const after = await end(env, kit, before);
  await Promise.all(agents.map((a) => a.stop()));
  await callOk(admin, "DELETE", `/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/${secret.name}`);
  return summarise(env, { agent: "gardener-node-agent", k: 1, budget: "serial", warm: true, agents, kit, before, written, after });
}

/** Until `target` nodes have released, or the rollout has taken three times as long as it should and ten minutes more (then the phase reports what it got). */
async function until(o: ScaleOptions, agents: SimAgent[], target: number, k: number): Promise<void> {
  const limitMs = 3 * Math.ceil(target / k) * (o.applyMs + o.settleMs) + 600_000;
  const start = performance.now();
  let shown = 0;
  for (;;) {
    const done = agents.filter((a) => a.timeline.released !== undefined).length;
    if (done >= target) return;
    if (performance.now() - start > limitMs) {
      o.progress(`  stopped waiting after ${round(limitMs / 1000)} s: ${done} of ${target} released`);
      return;
    }
    if (performance.now() - start > shown + 15_000) {
      shown = performance.now() - start;
      o.progress(`  ${done} of ${target} released, ${agents.filter((a) => a.timeline.granted !== undefined && a.timeline.released === undefined).length} holding`);
    }
    await Bun.sleep(100);
  }
}

/** A window's tallies and watch statistics, and the watchers created in it, by role. */
function delta(a: Snapshot, b: Snapshot) {
  const tally = new Map([...b.tally].map(([k, v]) => [k, v - (a.tally.get(k) ?? 0)] as const).filter(([, v]) => v !== 0));
  const watches: ReturnType<typeof watchStats> = {};
  const created: Record<string, number> = {};
  for (const [role, s] of Object.entries(b.watches)) {
    const was = a.watches[role];
    watches[role] = Object.fromEntries(Object.entries(s).map(([k, v]) => [k, v - ((was as Record<string, number> | undefined)?.[k] ?? 0)])) as (typeof watches)[string];
    created[role] = s.created - (was?.created ?? 0);
  }
  return { tally, watches, created };
}

type Cost = { seconds: number; requests: number; responseBytes: number; watchEvents: number; watchEventBytes: number; periodic: { requests: number; responseBytes: number; watchEvents: number; watchEventBytes: number } };

/**
 * The Lease traffic between two marks: the API server's count of requests (without WATCH) and watch
 * events, the agents' count of watch requests and of the answers to their writes, and the periodic part:
 * the watches' reopening, and the leader's renewals (a GET and a PUT each) with the event each sends every
 * agent watching the leader's Lease.
 */
function cost(a: { scrape: Scrape; snapshot: Snapshot }, b: { scrape: Scrape; snapshot: Snapshot }): Cost & { window: Window; delta: ReturnType<typeof delta> } {
  const window = windowOf(a.scrape, b.scrape);
  const d = delta(a.snapshot, b.snapshot);
  const served = leaseTotals(window);
  const watchRequests = Object.values(d.watches).reduce((x, st) => x + st.watches, 0);
  const reopens = Object.entries(d.watches).reduce((x, [role, st]) => x + st.watches - (d.created[role] ?? 0), 0);
  const renewals = Math.max(0, (d.tally.get("PUT leader ok") ?? 0) - (d.tally.get(leaderInfo) ?? 0));
  const requests = served.requests + watchRequests;
  // The API server measures the answers to reads only; the agents measured the answers to their writes.
  const responseBytes = served.responseBytes + (d.tally.get(writeAnswerBytes) ?? 0);
  const avgResponse = served.requests > 0 ? responseBytes / served.requests : 0;
  const avgEvent = served.watchEvents > 0 ? served.watchEventBytes / served.watchEvents : 0;
  const periodicRequests = reopens + 2 * renewals;
  const periodicEvents = Math.min(served.watchEvents, Math.max(0, (d.tally.get("event leader") ?? 0) - (d.created.leader ?? 0)));
  return {
    window,
    delta: d,
    seconds: window.seconds,
    requests,
    responseBytes,
    watchEvents: served.watchEvents,
    watchEventBytes: served.watchEventBytes,
    periodic: { requests: periodicRequests, responseBytes: periodicRequests * avgResponse, watchEvents: periodicEvents, watchEventBytes: periodicEvents * avgEvent },
  };
}

const eventDriven = (c: Cost) => ({
  requests: c.requests - c.periodic.requests,
  responseBytes: c.responseBytes - c.periodic.responseBytes,
  watchEvents: c.watchEvents - c.periodic.watchEvents,
  watchEventBytes: c.watchEventBytes - c.periodic.watchEventBytes,
});

function summarise(env: Env, p: { agent: PhaseResult["agent"]; k: number; budget: string; warm: boolean; agents: SimAgent[]; kit: Kit; before: Mark; written: Mark; after: End }): PhaseResult {
  const n = env.nodes.length;
  const t0 = p.before.sample.at;
  const tw = p.written.sample.at;
  const t1 = p.after.sample.at;
  const whole = cost(p.before, p.after);
  const start = cost(p.before, p.written);
  const steady = cost(p.written, p.after);
  const tl = p.agents.map((a) => a.timeline).filter((t) => t.requested !== undefined && t.requested >= t0);
  const released = tl.filter((t) => t.released !== undefined && t.released <= t1);
  const rolled = released.length;
  const complete = rolled >= n;
  const perNode = tl.filter((t) => t.granted !== undefined && t.settled !== undefined).map((t) => (t.settled as number) - (t.granted as number));
  const perNodeMs = perNode.length > 0 ? median(perNode) : Number.NaN;
  // A rollout stopped after its first hand-overs is judged once every request was written: its start (every
  // node's request, the election) is paid once per rollout, its hand-overs once per node.
  const paced = released.filter((t) => (t.granted as number) >= tw);
  const judged = complete || paced.length < 5 ? released : paced;
  const from = complete ? t0 : Math.min(...judged.map((t) => t.granted as number));
  const waves = Math.ceil(judged.length / p.k);
  const durationMs = Math.max(...judged.map((t) => t.released as number)) - from;
  const idealMs = waves * perNodeMs;
  const grants = tl.map((t) => t.granted).filter((x): x is number => x !== undefined && x <= t1).sort((a, b) => a - b);
  const releases = released.map((t) => t.released as number).sort((a, b) => a - b);
  const gaps = grants.slice(p.k).map((g, i) => g - (releases[i] ?? g)).filter((g) => g >= 0);
  // The cost of rolling one node: every node's share of the start, and one hand-over as measured once the
  // start was over (for a rollout run to its end, simply the whole window over the pool).
  const steadyRolled = released.filter((t) => (t.released as number) > tw).length;
  const ws = eventDriven(whole);
  const ss = eventDriven(steady);
  const st = eventDriven(start);
  const perRolled = (pick: (x: ReturnType<typeof eventDriven>) => number) => (complete ? pick(ws) / n : pick(st) / n + pick(ss) / Math.max(1, steadyRolled));
  // At real speed the event-driven traffic is spread over the rollout as designed (its waves at 30× the
  // per-node time: an upper bound on the rate where the bench ran slower), the periodic comes as measured.
  const designed = (nodes: number) => (env.compression * Math.ceil(nodes / p.k) * perNodeMs) / 1000;
  const [base, designedS] = complete ? [whole, designed(n)] : [steady, designed(steadyRolled)];
  const real = eventDriven(base);
  const rates = (r: { requests: number; bytes: number; events: number }): Rates => ({
    requestsPerS: round(r.requests, 2),
    bytesPerS: round(r.bytes, 0),
    watchEventsPerS: round(r.events, 2),
    perNode: { requestsPerS: round(r.requests / n, 5), bytesPerS: round(r.bytes / n, 2), watchEventsPerS: round(r.events / n, 5) },
  });
  const served = leaseTotals(whole.window);
  return {
    agent: p.agent,
    pool: n,
    k: p.k,
    budget: p.budget,
    watchesOpenBefore: p.warm,
    complete,
    rolled,
    seconds: round(whole.seconds),
    machine: p.after.load,
    served: {
      requests: whole.requests,
      watchOpens: whole.requests - served.requests,
      readAnswerBytes: served.responseBytes,
      writeAnswerBytes: whole.responseBytes - served.responseBytes,
      watchEvents: whole.watchEvents,
      watchEventBytes: whole.watchEventBytes,
      failures: served.failures,
      watchesOpenAtEnd: served.watchesOpen,
    },
    periodic: { requests: whole.periodic.requests, watchEvents: whole.periodic.watchEvents },
    start: { seconds: round(start.seconds, 2), requestsPerNode: round(start.requests / n, 2), bytesPerNode: Math.round((start.responseBytes + start.watchEventBytes) / n), watchEventsPerNode: round(start.watchEvents / n, 2) },
    bench: rates({ requests: whole.requests / whole.seconds, bytes: (whole.responseBytes + whole.watchEventBytes) / whole.seconds, events: whole.watchEvents / whole.seconds }),
    realSpeed: rates({
      requests: real.requests / designedS + base.periodic.requests / base.seconds,
      bytes: (real.responseBytes + real.watchEventBytes) / designedS + (base.periodic.responseBytes + base.periodic.watchEventBytes) / base.seconds,
      events: real.watchEvents / designedS + base.periodic.watchEvents / base.seconds,
    }),
    perNodeRolled: {
      requests: round(perRolled((x) => x.requests), 2),
      responseBytes: Math.round(perRolled((x) => x.responseBytes)),
      watchEvents: round(perRolled((x) => x.watchEvents), 2),
      watchEventBytes: Math.round(perRolled((x) => x.watchEventBytes)),
    },
    duration: {
      seconds: round(durationMs / 1000, 2),
      perNodeS: round(perNodeMs / 1000, 3),
      idealS: round(idealMs / 1000, 2),
      ratio: round(durationMs / idealMs, 3),
      basis: complete
        ? `every node: ⌈${n}/${p.k}⌉ = ${waves} waves from the change`
        : `${judged.length} hand-overs ${judged === paced ? "granted after every request was written" : "from the first grant"}: ⌈${judged.length}/${p.k}⌉ = ${waves} waves (${n - rolled} still waiting)`,
      requestsWrittenS: round((tw - t0) / 1000, 2),
      firstGrantS: round((Math.min(...grants) - t0) / 1000, 2),
    },
    ...(gaps.length > 0 ? { handoverMs: summary(gaps, 0) } : {}),
    // Disrupted from the grant to the end of the settle time (the release that follows disrupts nothing).
    maxConcurrentHolders: overlap(tl.filter((t) => t.granted !== undefined && t.granted <= t1).map((t) => ({ from: t.granted as number, to: t.settled ?? t1 }))).max,
    leaderships: whole.delta.tally.get(leaderInfo) ?? 0,
    lists: p.after.lists,
    window: whole.window,
    client: Object.fromEntries([...whole.delta.tally].sort((a, b) => b[1] - a[1])),
    watches: whole.delta.watches,
    warnings: p.kit.warnings.slice(p.before.snapshot.warnings, p.before.snapshot.warnings + 10),
  };
}

/** Where the audit log stands: kube-apiserver renames it every 100 MB (the file keeps its inode) and starts a new one. */
type AuditAt = { ino: number; offset: number; sinceMs: number };

function auditMark(path: string): AuditAt {
  const st = statSync(path);
  return { ino: st.ino, offset: st.size, sinceMs: Date.now() };
}

/** The agents' LISTs in the audit log since `at` (the file it was in, and every file begun since), by resource and selector, with how many agents sent them and the most any one sent. */
function auditLists(path: string, at: AuditAt): ListCount[] {
  const by = new Map<string, Map<string, number>>();
  for (const name of readdirSync(dirname(path)).filter((f) => /^audit.*\.log$/.test(f))) {
    const file = `${dirname(path)}/${name}`;
    const st = statSync(file);
    if (st.ino === at.ino) countLists(file, at.offset, by);
    else if (st.mtimeMs >= at.sinceMs) countLists(file, 0, by);
  }
  return [...by].map(([what, users]) => ({ what, count: [...users.values()].reduce((a, b) => a + b, 0), users: users.size, perUserMax: Math.max(...users.values()) }));
}

function countLists(path: string, offset: number, by: Map<string, Map<string, number>>): void {
  const fd = openSync(path, "r");
  try {
    const size = fstatSync(fd).size;
    const chunk = Buffer.alloc(8 << 20);
    let rest = "";
    for (let at = offset; at < size; ) {
      const got = readSync(fd, chunk, 0, Math.min(chunk.length, size - at), at);
      at += got;
      const lines = (rest + chunk.toString("utf8", 0, got)).split("\n");
      rest = lines.pop() ?? "";
      for (const l of lines) {
        if (!l.includes('"verb":"list"')) continue;
        const e = JSON.parse(l) as { requestURI: string; objectRef?: { resource?: string }; impersonatedUser?: { username: string } };
        // The API server's own lists and the bench's are not the pool's.
        if (!e.impersonatedUser) continue;
        const q = new URL(e.requestURI, "https://x").searchParams;
        const selector = q.get("labelSelector") ? `labelSelector ${q.get("labelSelector")?.split("=")[0]}` : q.get("fieldSelector") ? `fieldSelector ${q.get("fieldSelector")?.split("=")[0]}` : "everything";
        const key = `${e.objectRef?.resource ?? "?"} by ${selector}`;
        const users = by.get(key) ?? new Map<string, number>();
        users.set(e.impersonatedUser.username, (users.get(e.impersonatedUser.username) ?? 0) + 1);
        by.set(key, users);
      }
    }
  } finally {
    closeSync(fd);
  }
}

// ---------------------------------------------------------------- report

const kb = (bytes: number) => `${round(bytes / 1024, 1)}`;
const share = (p: PhaseResult, hb: HeartbeatResult[]) => round((100 * p.realSpeed.requestsPerS) / (hb.find((h) => h.pool === p.pool)?.requestsPerS ?? Number.NaN), 2);

function line(p: PhaseResult, hb: HeartbeatResult[]): string {
  return `${p.agent} k=${p.budget}: ${p.rolled} rolled in ${p.duration.seconds} s (${p.duration.ratio}× ideal), bench ${p.bench.requestsPerS} req/s ${kb(p.bench.bytesPerS)} KB/s; real speed ${p.realSpeed.requestsPerS} req/s = ${share(p, hb)} % of heartbeats; apiserver ${p.machine.apiserverCores} cores, machine busy ${p.machine.hostBusyCores}`;
}

function table(phases: PhaseResult[], hb: HeartbeatResult[], idle: IdleResult[]): string[] {
  const head = ["agent", "pool", "k", "rolled", "duration", "⌈N/k⌉·t", "ratio", "bench req/s", "bench KB/s", "ev/s", "real req/s", "% hb", "real KB/s", "req/node", "KB/node", "ev/node", "apiserver", "busy"];
  const rows = phases.map((p) => [
    p.agent === "trellis" ? "trellis" : "GNA serial",
    String(p.pool),
    p.budget === "serial" ? "1" : p.budget === "10%" ? `10% (${p.k})` : String(p.k),
    p.complete ? `${p.rolled}` : `${p.rolled}/${p.pool}`,
    `${p.duration.seconds} s`,
    `${p.duration.idealS} s`,
    String(p.duration.ratio),
    String(p.bench.requestsPerS),
    kb(p.bench.bytesPerS),
    String(p.bench.watchEventsPerS),
    String(p.realSpeed.requestsPerS),
    String(share(p, hb)),
    kb(p.realSpeed.bytesPerS),
    String(p.perNodeRolled.requests),
    kb(p.perNodeRolled.responseBytes + p.perNodeRolled.watchEventBytes),
    String(p.perNodeRolled.watchEvents),
    String(p.machine.apiserverCores),
    String(p.machine.hostBusyCores),
  ]);
  const hbRows = hb.map((h) => ["heartbeats", String(h.pool), "", "", "", "", "", "", "", "", String(h.requestsPerS), "100", kb(h.bytesPerS), "", "", "", `${h.apiserverCores ?? "?"}${h.measured ? "" : " (computed)"}`, ""]);
  const pct = (pool: number, x: number) => String(round((100 * x) / (hb.find((h) => h.pool === pool)?.requestsPerS ?? Number.NaN), 2));
  const idleRows = idle.flatMap((i) => [
    ["trellis idle", String(i.pool), "", "", "", "", "", String(i.requestsPerS), "", String(i.watchEventsPerS), String(i.longRunRequestsPerS), pct(i.pool, i.longRunRequestsPerS), kb(i.watchEventBytesPerS), "", "", "", String(i.apiserverCores), ""],
    ["GNA idle", String(i.pool), "", "", "", "", "", "", "", "", String(i.gnaLongRunRequestsPerS), pct(i.pool, i.gnaLongRunRequestsPerS), "", "", "", "", "(computed)", ""],
  ]);
  const all = [head, ...rows, ...hbRows, ...idleRows];
  const widths = head.map((_, i) => Math.max(...all.map((r) => (r[i] ?? "").length)));
  return all.map((r) => r.map((c, i) => (i < 3 ? c.padEnd(widths[i] ?? 0) : c.padStart(widths[i] ?? 0))).join("  "));
}

/** Each goal of the issue against what was measured, one line each. */
function goals(phases: PhaseResult[], hb: HeartbeatResult[], sizes: number[], compression: number): string[] {
  const out: string[] = [];
  for (const budget of ["10%", "1"]) {
    const series = phases.filter((p) => p.agent === "trellis" && p.budget === budget);
    const flat = (pick: (p: PhaseResult) => number, what: string) => {
      const xs = series.map(pick);
      const ref = xs[0] ?? Number.NaN;
      const spread = xs.map((x) => round((100 * (x - ref)) / ref, 1));
      const ok = spread.every((d) => Math.abs(d) <= 20);
      out.push(`${ok ? "MET" : "NOT MET"}: trellis per-node cost flat ±20 % (${what}, k = ${budget}): ${series.map((p, i) => `${p.pool}: ${round(xs[i] ?? Number.NaN, 4)} (${(spread[i] ?? 0) >= 0 ? "+" : ""}${spread[i]} %)`).join(", ")}`);
    };
    flat((p) => p.perNodeRolled.requests, "requests per node rolled");
    flat((p) => p.perNodeRolled.responseBytes + p.perNodeRolled.watchEventBytes, "bytes per node rolled");
    flat((p) => p.realSpeed.perNode.requestsPerS, "requests/s per node at real speed");
  }
  const largest = Math.max(...sizes);
  for (const p of phases.filter((x) => x.pool === largest)) {
    const pct = share(p, hb);
    out.push(`${pct <= 10 ? "MET" : "NOT MET"}: at ${largest}, ${p.agent} k = ${p.budget}: ${p.realSpeed.requestsPerS} req/s at real speed = ${pct} % of the heartbeats' ${hb.find((h) => h.pool === largest)?.requestsPerS} req/s (goal ≤ 10 %)`);
  }
  for (const p of phases) {
    const growing = p.lists.filter((l) => l.what.includes("labelSelector") || l.what.includes("everything"));
    const worst = Math.max(0, ...growing.map((l) => l.perUserMax));
    out.push(
      `${worst <= 1 ? "MET" : "NOT MET"}: ${p.agent} k = ${p.budget}, pool ${p.pool}: lists that grow with the pool: ${growing.length === 0 ? "none" : growing.map((l) => `${l.what}: ${l.count} by ${l.users} node(s), at most ${l.perUserMax} by one`).join("; ")}${p.agent === "trellis" ? ` (${p.leaderships} leaderships)` : ""}; at most ${worst} per node in a window of ${round((compression * p.seconds) / 60, 0)} min at real speed`,
    );
  }
  for (const p of phases) out.push(`${p.duration.ratio <= 1.1 ? "MET" : "NOT MET"}: ${p.agent} k = ${p.budget}, pool ${p.pool}: ${p.duration.seconds} s against ${p.duration.idealS} s = ${p.duration.ratio}× (goal ≤ 1.1×; ${p.duration.basis}; per node ${p.duration.perNodeS} s; machine busy ${p.machine.hostBusyCores} of 2 cores)`);
  return out;
}
