// bun run bench:startup-cpu [-- --cpu-limit 0.5|none --startups 5]
//
// Where the side-by-side benchmark's start-up (test/bench/compare.ts, phase 3: process start → the first
// reconcile's log line) goes, for both agents on the same kind of node under the same CPU limit: the CPU
// every process of the node used in that window (the agent — by thread —, systemd, dbus-daemon, journald,
// …), and the agent's log lines on the same clock, so that a slow start-up can be told apart into the
// runtime starting, the agent's own work, and the work it makes the node's other processes do.
//
// Each start is `systemctl stop`, a reading of every process of the node, `systemctl start`, the first
// reconcile's line in the journal, a second reading. The new agent process's CPU is all of its life (it
// began in the window); the node's long-lived processes count their difference; a process that began and
// ended inside the window is not seen (trellis and the peer start none). The second reading comes when the
// journal poll (every 50 ms, from the host, outside the node's limit) sees the line: up to ~60 ms of work
// after it counts too. Readings are utime+stime from /proc (clock ticks, 10 ms).
// Writes test/bench/results/startup-cpu-<date>.json.
import { readdirSync } from "node:fs";
import { parseArgs } from "node:util";
import { CoreV1Api } from "@kubernetes/client-node";
import { sha256Hex } from "../../src/api/desired.ts";
import { type AgentNode, mainPid, startAgentNode, unitProperty, waitApplied } from "../harness/agent.ts";
import { startCluster } from "../harness/cluster.ts";
import { waitFor } from "../harness/exec.ts";
import { type AgentId, type BenchAgent, benchAgents } from "./lib/agents.ts";
import { oscYaml, secretBody } from "./lib/bench-osc.ts";
import { nodeCpuMax, readThrottling } from "./lib/cpu-limit.ts";
import { journal } from "./lib/journal.ts";
import { initClockTicks, machineInfo, readStat, type Stat, ticksPerSecond } from "./lib/proc.ts";
import { saveResult } from "./lib/results.ts";
import { median, round } from "./lib/stats.ts";
import { threadRole, threadTicks } from "./lib/threads.ts";

const { values: args } = parseArgs({ options: { "cpu-limit": { type: "string", default: "0.5" }, startups: { type: "string", default: "5" } } });
const CPU_LIMIT = args["cpu-limit"] === "none" ? undefined : Number(args["cpu-limit"]);
const STARTUPS = Number(args.startups);
if (CPU_LIMIT !== undefined) process.env.NODE_CPU_MAX = nodeCpuMax(CPU_LIMIT);
const progress = (msg: string) => console.error(`[${new Date().toISOString().slice(11, 19)}] ${msg}`);

/**
 * utime + stime of every process of the node now, by pid (the node's pid namespace): those that descend
 * from its PID 1. The harness's observers (journalctl, systemctl, entered with nsenter from the host) are
 * in the node's pid namespace too, but their parent is outside it (ppid 0 there).
 */
function nodeProcesses(root: string): Map<number, Stat> {
  const all = new Map<number, Stat>();
  for (const entry of readdirSync(`${root}/proc`)) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      all.set(Number(entry), readStat(`${root}/proc/${entry}/stat`));
    } catch {
      // the process ended between readdir and read
    }
  }
  const fromInit = (pid: number): boolean => {
    for (let p = pid, hops = 0; hops < 64; hops++) {
      if (p === 1) return true;
      const r = all.get(p);
      if (!r || r.ppid === 0) return false;
      p = r.ppid;
    }
    return false;
  };
  return new Map([...all].filter(([pid]) => fromInit(pid)));
}

type Start = {
  wallMs: number;
  /** CPU ms in the window: the agent's new process, and every other process of the node by name. */
  agentCpuMs: number;
  agentThreadsMs: Record<string, number>;
  othersMs: Record<string, number>;
  /** The agent's log lines in the window: ms after its process started, by message (the first of each). */
  lines: Record<string, number>;
};

const ms = (ticks: number) => (ticks * 1000) / ticksPerSecond();

async function oneStart(b: AgentNode & { agent: BenchAgent }): Promise<Start> {
  const unit = "gardener-node-agent.service";
  await b.node.execOk(["systemctl", "stop", unit]);
  const before = nodeProcesses(b.node.root);
  await b.node.execOk(["systemctl", "start", unit]);
  const pid = await mainPid(b, unit);
  const startUs = Number(await unitProperty(b.node, unit, "ExecMainStartTimestampMonotonic"));
  const lines = await waitFor(`${b.agent.label}'s first reconcile`, async () => {
    const l = await journal(b.node, pid);
    return l.some((x) => x.msg === b.agent.noopDoneMessage) ? l : undefined;
  }, 60_000, 50);
  const after = nodeProcesses(b.node.root);
  const threads = threadTicks(b.node.root, pid);
  const done = lines.find((x) => x.msg === b.agent.noopDoneMessage) as (typeof lines)[number];
  const othersMs: Record<string, number> = {};
  let agentTicks = 0;
  for (const [p, now] of after) {
    if (p === pid) {
      agentTicks = now.ticks;
      continue;
    }
    const delta = now.ticks - (before.get(p)?.ticks ?? 0);
    if (delta > 0) othersMs[now.comm] = (othersMs[now.comm] ?? 0) + ms(delta);
  }
  const agentThreadsMs: Record<string, number> = {};
  let seen = 0;
  for (const t of threads.values()) {
    agentThreadsMs[threadRole(t.comm)] = (agentThreadsMs[threadRole(t.comm)] ?? 0) + ms(t.ticks);
    seen += t.ticks;
  }
  if (agentTicks > seen) agentThreadsMs["(threads that ended)"] = ms(agentTicks - seen);
  const firstLines: Record<string, number> = {};
  for (const l of lines) if (l.monoUs <= done.monoUs) firstLines[l.msg] ??= round((l.monoUs - startUs) / 1000, 0);
  return { wallMs: round((done.monoUs - startUs) / 1000, 0), agentCpuMs: ms(agentTicks), agentThreadsMs, othersMs, lines: firstLines };
}

/** Medians over the starts, by key, keys sorted by their median, largest first. */
function medians(rows: Record<string, number>[]): Record<string, number> {
  const keys = [...new Set(rows.flatMap((r) => Object.keys(r)))];
  const m = keys.map((k) => [k, round(median(rows.map((r) => r[k] ?? 0)), 0)] as const);
  return Object.fromEntries(m.sort((x, y) => y[1] - x[1]));
}

await initClockTicks();
const agents = await benchAgents();
const cluster = await startCluster({ controllerManager: false });
const kubelet = Bun.serve({ hostname: "127.0.0.1", port: 10248, fetch: () => new Response("ok") });
const core = cluster.admin().makeApiClient(CoreV1Api);
const text = oscYaml(0);
const nodes: (AgentNode & { agent: BenchAgent })[] = [];
const result: Record<string, unknown> = { date: new Date().toISOString().slice(0, 10), machine: await machineInfo(), cpuLimitCores: CPU_LIMIT ?? "none", startups: STARTUPS };
try {
  for (const agent of agents) {
    const secretName = `osc-startup-${agent.id}`;
    const a = await startAgentNode(cluster, { prefix: `su-${agent.id}`, secretName, syncPeriod: "10m", binary: agent.binary, configName: agent.configName, unit: agent.unit, rules: agent.rules([secretName]), containerd: true });
    nodes.push({ ...a, agent });
    await core.createNamespacedSecret({ namespace: "kube-system", body: secretBody(secretName, text) });
    await waitApplied(a, sha256Hex(text), 180_000, 50);
    progress(`${agent.label}: the bench OSC applied`);
  }
  const starts: Record<AgentId, Start[]> = { trellis: [], gna: [] };
  for (let r = 0; r < STARTUPS; r++) {
    for (const b of r % 2 === 0 ? nodes : [...nodes].reverse()) {
      const s = await oneStart(b);
      starts[b.agent.id].push(s);
      progress(`start ${r + 1}/${STARTUPS} ${b.agent.label}: ${s.wallMs} ms, agent ${s.agentCpuMs} ms CPU, others ${JSON.stringify(s.othersMs)}`);
    }
  }
  const summaries: Record<string, unknown> = {};
  for (const b of nodes) {
    const s = starts[b.agent.id];
    const others = s.map((x) => x.othersMs);
    summaries[b.agent.id] = {
      label: b.agent.label,
      wallMsMedian: median(s.map((x) => x.wallMs)),
      agentCpuMsMedian: median(s.map((x) => x.agentCpuMs)),
      othersCpuMsMedian: round(median(others.map((o) => Object.values(o).reduce((x, y) => x + y, 0))), 0),
      agentThreadsMsMedian: medians(s.map((x) => x.agentThreadsMs)),
      othersMsMedian: medians(others),
      linesMsMedian: Object.fromEntries(Object.entries(medians(s.map((x) => x.lines))).sort((x, y) => x[1] - y[1])),
      throttling: CPU_LIMIT === undefined ? undefined : readThrottling(b.node, await mainPid(b, "gardener-node-agent.service")),
      starts: s,
    };
  }
  result.agents = summaries;
} finally {
  for (const b of nodes) await b.node.stop();
  kubelet.stop(true);
  await cluster.stop();
}

const file = saveResult("startup-cpu", result, result.date as string);
for (const [id, a] of Object.entries(result.agents as Record<string, Record<string, unknown>>)) {
  console.error(`\n${a.label}: ${a.wallMsMedian} ms wall, agent ${a.agentCpuMsMedian} ms CPU, the node's other processes ${a.othersCpuMsMedian} ms (medians, ${id})`);
  console.error(`  agent by thread: ${JSON.stringify(a.agentThreadsMsMedian)}`);
  console.error(`  others: ${JSON.stringify(a.othersMsMedian)}`);
  console.error(`  log lines (ms after the process started): ${JSON.stringify(a.linesMsMedian)}`);
}
console.error(`\n${file}`);
