// bun run bench:boot-timeline [-- --cpu-limit 0.5|none --runs 1]
//
// Where the side-by-side benchmark's real-worker boot (install.sh → Node Ready, lib/worker-phase.ts) goes,
// for both agents on the same kind of worker under the same CPU limit: the CPU the whole node used from its
// boot until the Node is Ready and the OSC applied (its cgroup in the host's v1 cpuacct hierarchy, so
// short-lived processes — install.sh's pull and decompression, the agent's image extraction — count too;
// the node's systemd makes no cpuacct cgroups per unit, so there is no split by unit), and a timeline of
// the node's journal on the benchmark's clock: the agent's and install.sh's lines and systemd's unit
// starts and stops. Writes
// test/bench/results/boot-timeline-<date>.json.
import { existsSync, readFileSync } from "node:fs";
import { parseArgs } from "node:util";
import type { Node } from "../harness/node.ts";
import { bringUpWorker, pushAgentImage, startWorkerWorld, type WorkerAgent } from "../harness/worker.ts";
import { type AgentId, benchAgents } from "./lib/agents.ts";
import { nodeCpuMax } from "./lib/cpu-limit.ts";
import { machineInfo } from "./lib/proc.ts";
import { saveResult } from "./lib/results.ts";
import { median, round } from "./lib/stats.ts";

const { values: args } = parseArgs({ options: { "cpu-limit": { type: "string", default: "0.5" }, runs: { type: "string", default: "1" } } });
const CPU_LIMIT = args["cpu-limit"] === "none" ? undefined : Number(args["cpu-limit"]);
const RUNS = Number(args.runs);
if (CPU_LIMIT !== undefined) process.env.NODE_CPU_MAX = nodeCpuMax(CPU_LIMIT);
const progress = (msg: string) => console.error(`[${new Date().toISOString().slice(11, 19)}] ${msg}`);

/** The node's cgroup in the host's v1 cpuacct hierarchy (boot.sh makes one per hierarchy for a worker). */
function cpuacctDir(node: Node): string {
  const line = readFileSync(`${node.root}/proc/1/cgroup`, "utf8").split("\n").find((l) => `,${l.split(":")[1]},`.includes(",cpuacct,"));
  if (!line) throw new Error(`node ${node.name}: its PID 1 is in no cpuacct cgroup`);
  // mountinfo: "… MOUNTPOINT … - FSTYPE SOURCE SUPEROPTIONS" (a variable number of fields before the "-").
  const mount = readFileSync("/proc/self/mountinfo", "utf8")
    .split("\n")
    .map((l) => [l.split(" ")[4], ...(l.split(" - ")[1]?.split(" ") ?? [])])
    .find(([, type, , opts]) => type === "cgroup" && `,${opts},`.includes(",cpuacct,"))?.[0];
  if (!mount) throw new Error("the host has no cgroup v1 cpuacct hierarchy");
  return mount + line.split(":").slice(2).join(":");
}

/** CPU ms the node's cgroup has used since the node booted. */
const nodeCpuMs = (dir: string) => round(Number(readFileSync(`${dir}/cpuacct.usage`, "utf8")) / 1e6, 0);

type Entry = { atMs: number; unit: string; text: string };

/** The node's journal entries that mark progress, as ms after `startedMs` (performance.now() of install.sh's start). */
async function timeline(node: Node, startedMs: number, untilMs: number): Promise<Entry[]> {
  const out = await node.execOk(["journalctl", "-o", "json", "--no-pager", "--output-fields=MESSAGE,_SYSTEMD_UNIT,UNIT,SYSLOG_IDENTIFIER"]);
  const entries: Entry[] = [];
  for (const line of out.split("\n")) {
    if (!line) continue;
    const e = JSON.parse(line) as { MESSAGE?: unknown; _SYSTEMD_UNIT?: string; UNIT?: string; SYSLOG_IDENTIFIER?: string; __REALTIME_TIMESTAMP: string };
    if (typeof e.MESSAGE !== "string") continue;
    const at = Number(e.__REALTIME_TIMESTAMP) / 1000 - performance.timeOrigin - startedMs;
    if (at < -1000 || at > untilMs - startedMs + 500) continue;
    const unit = e._SYSTEMD_UNIT ?? e.SYSLOG_IDENTIFIER ?? "";
    let text: string | undefined;
    if (unit === "init.scope" || e.SYSLOG_IDENTIFIER === "systemd") {
      if (/^(Started|Starting|Stopping|Stopped|Reloading|Finished) /.test(e.MESSAGE) || / Deactivated successfully\.$/.test(e.MESSAGE)) text = e.MESSAGE;
    } else if (unit.startsWith("gardener-node-agent") || unit.startsWith("gardener-node-init") || e.MESSAGE.startsWith("trellis-install")) {
      text = e.MESSAGE.startsWith("{") ? summarize(e.MESSAGE) : e.MESSAGE;
    }
    if (text !== undefined) entries.push({ atMs: round(at, 0), unit: unit === "init.scope" ? "systemd" : unit, text: text.slice(0, 200) });
  }
  return entries;
}

/** A JSON log line as its message and a few telling fields (trellis: msg; gardener-node-agent: msg too). */
function summarize(json: string): string {
  try {
    const f = JSON.parse(json) as Record<string, unknown>;
    const extra = ["ms", "image", "unit", "units", "path", "file"].filter((k) => f[k] !== undefined).map((k) => `${k}=${typeof f[k] === "string" ? f[k] : JSON.stringify(f[k])}`);
    return `${String(f.msg)}${extra.length ? ` (${extra.join(", ").slice(0, 140)})` : ""}`;
  } catch {
    return json;
  }
}

const agents = await benchAgents();
const world = await startWorkerWorld({ release: true });
const result: Record<string, unknown> = { date: new Date().toISOString().slice(0, 10), machine: await machineInfo(), cpuLimitCores: CPU_LIMIT ?? "none", runs: RUNS };
const runs: Record<AgentId, { readyMs: number; appliedMs: number; csrMs: number; nodeCpuMs: number; timeline: Entry[] }[]> = { trellis: [], gna: [] };
try {
  const images = new Map<AgentId, WorkerAgent>();
  for (const a of agents) images.set(a.id, await pushAgentImage(world, a, { release: true }));
  for (let r = 0; r < RUNS; r++) {
    for (const agent of r % 2 === 0 ? agents : [...agents].reverse()) {
      const w = await bringUpWorker(world, `bt${agent.id}${r}`, { agent: images.get(agent.id) as WorkerAgent, pool: `pool-${agent.id}`, machineContainerd: "containerd-default" });
      try {
        const dir = cpuacctDir(w.bare.node);
        if (!existsSync(`${dir}/cpuacct.usage`)) throw new Error(`${dir}: no cpuacct.usage`);
        const cpu = nodeCpuMs(dir);
        const until = Math.max(w.readyMs, w.appliedMs);
        const entries = await timeline(w.bare.node, w.startedMs, until);
        runs[agent.id].push({ readyMs: round(w.readyMs - w.startedMs, 0), appliedMs: round(w.appliedMs - w.startedMs, 0), csrMs: round(w.csrSeenMs - w.startedMs, 0), nodeCpuMs: cpu, timeline: entries });
        progress(`${agent.label} run ${r + 1}/${RUNS}: Node Ready ${round((w.readyMs - w.startedMs) / 1000, 2)} s, applied ${round((w.appliedMs - w.startedMs) / 1000, 2)} s; the node's CPU ${cpu} ms`);
      } finally {
        await w.bare.stop();
      }
    }
  }
} finally {
  await world.stop();
}
result.agents = Object.fromEntries(
  agents.map((a) => {
    const rs = runs[a.id];
    return [a.id, { label: a.label, readyMsMedian: median(rs.map((x) => x.readyMs)), appliedMsMedian: median(rs.map((x) => x.appliedMs)), nodeCpuMsMedian: median(rs.map((x) => x.nodeCpuMs)), runs: rs }];
  }),
);
const file = saveResult("boot-timeline", result, result.date as string);
for (const a of Object.values(result.agents as Record<string, { label: string; readyMsMedian: number; appliedMsMedian: number; nodeCpuMsMedian: number; runs: { timeline: Entry[] }[] }>)) {
  console.error(`\n${a.label}: Node Ready ${a.readyMsMedian} ms, applied ${a.appliedMsMedian} ms, the node's CPU ${a.nodeCpuMsMedian} ms`);
  for (const e of a.runs[0]?.timeline ?? []) console.error(`  ${String(e.atMs).padStart(7)} ms  ${e.unit.padEnd(28)} ${e.text}`);
}
console.error(`\n${file}`);
