// The side-by-side benchmark's CPU-constrained mode (--cpu-limit CORES): every node the run boots — the
// agent, the node's systemd, containerd and, on a real worker, kubelet and install.sh — is held to the same
// CFS quota through the node's cgroup in the host's v1 cpu hierarchy (test/harness/node/boot.sh,
// NODE_CPU_MAX). The control plane, the byte relays and the stand-in kubelet stay unlimited: they play the
// rest of the cluster. Each node's limit is read back before it stops: the quota the kernel holds, the
// agent's process inside it, and how often CFS throttled the node.
import { readFileSync } from "node:fs";
import type { Node } from "../../harness/node.ts";
import type { AgentId } from "./agents.ts";
import { round } from "./stats.ts";

const PERIOD_US = 100_000;

/** NODE_CPU_MAX for `cores` (quota and period in µs); set in the environment before the first node boots. */
export function nodeCpuMax(cores: number): string {
  if (!(cores > 0)) throw new Error(`--cpu-limit wants a positive number of cores, got ${cores}`);
  return `${Math.round(cores * PERIOD_US)} ${PERIOD_US}`;
}

export type Throttling = { quotaUs: number; periodUs: number; nrPeriods: number; nrThrottled: number; throttledMs: number };

/** The node's limit as the kernel holds it, after checking that `pid` (in the node's pid namespace) runs under it. */
export function readThrottling(node: Node, pid: number): Throttling {
  const limit = node.cpuLimit;
  if (!limit) throw new Error(`node ${node.name} has no CPU limit (NODE_CPU_MAX was not set when it booted)`);
  // Paths in /proc/PID/cgroup are relative to the reader's cgroup namespace, the host's here.
  const line = readFileSync(`${node.root}/proc/${pid}/cgroup`, "utf8").split("\n").find((l) => `,${l.split(":")[1]},`.includes(",cpu,"));
  const path = line?.split(":").slice(2).join(":") ?? "";
  if (path !== limit.path && !path.startsWith(`${limit.path}/`)) throw new Error(`node ${node.name}: process ${pid} is in cpu cgroup "${path}", outside the limited ${limit.path}`);
  const dir = limit.mount + limit.path;
  const read = (file: string) => readFileSync(`${dir}/${file}`, "utf8");
  const stat = Object.fromEntries(read("cpu.stat").trim().split("\n").map((l) => l.split(" ") as [string, string]));
  return {
    quotaUs: Number(read("cpu.cfs_quota_us")),
    periodUs: Number(read("cpu.cfs_period_us")),
    nrPeriods: Number(stat.nr_periods),
    nrThrottled: Number(stat.nr_throttled),
    throttledMs: round(Number(stat.throttled_time) / 1e6, 0),
  };
}

/** Every limited node's counters over its life, read just before it stopped, by phase and agent. */
export class ThrottleLog {
  readonly nodes: ({ phase: string; agent: AgentId; node: string } & Throttling)[] = [];

  record(phase: string, agent: AgentId, node: Node, pid: number): void {
    this.nodes.push({ phase, agent, node: node.name, ...readThrottling(node, pid) });
  }

  /** Sums per phase and agent: the periods a node was throttled in, out of those it ran in. */
  totals(): Record<string, Partial<Record<AgentId, { nodes: number; nrPeriods: number; nrThrottled: number; throttledMs: number }>>> {
    const out: ReturnType<ThrottleLog["totals"]> = {};
    for (const n of this.nodes) {
      const t = ((out[n.phase] ??= {})[n.agent] ??= { nodes: 0, nrPeriods: 0, nrThrottled: 0, throttledMs: 0 });
      t.nodes++;
      t.nrPeriods += n.nrPeriods;
      t.nrThrottled += n.nrThrottled;
      t.throttledMs += n.throttledMs;
    }
    return out;
  }
}
