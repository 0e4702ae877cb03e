// What a process inside a node costs, read from the host through /proc (spawns nothing, so sampling
// it often does not disturb what is measured), and what the machine is.
import { readFileSync } from "node:fs";
import { runOk } from "../../harness/exec.ts";
import type { Node } from "../../harness/node.ts";
import { round } from "./stats.ts";

let clockTicks = 100;
/** Reads the kernel's clock tick (CLK_TCK) once; cpuSeconds() divides by it. */
export async function initClockTicks(): Promise<number> {
  clockTicks = Number((await runOk(["getconf", "CLK_TCK"])).trim());
  return clockTicks;
}
export const ticksPerSecond = () => clockTicks;

export type Stat = { comm: string; ppid: number; ticks: number };

/**
 * /proc/PID/stat (or task/TID/stat) as read from `file` (of proc(5)): the name (which may hold spaces and
 * parentheses, so it is cut at the last ")"), the parent, and utime + stime (fields 14 and 15) in clock ticks.
 */
export function readStat(file: string): Stat {
  const stat = readFileSync(file, "utf8");
  const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
  return { comm: stat.slice(stat.indexOf("(") + 1, stat.lastIndexOf(")")), ppid: Number(fields[1]), ticks: Number(fields[11]) + Number(fields[12]) };
}

/** utime + stime of a process in seconds; `root` is "" for the host. */
export function cpuSecondsAt(root: string, pid: number): number {
  return readStat(`${root}/proc/${pid}/stat`).ticks / clockTicks;
}

/** utime + stime of a process inside the node, in seconds. */
export const cpuSeconds = async (node: Node, pid: number): Promise<number> => cpuSecondsAt(node.root, pid);

/** Fields of a /proc file made of "Key:  N kB" lines (status, smaps_rollup), in KiB; `root` is "" for the host. */
export function procKiB<K extends string>(root: string, pid: number, file: string, keys: K[]): Record<K, number> {
  const text = readFileSync(`${root}/proc/${pid}/${file}`, "utf8");
  const kib = (key: string) => Number(new RegExp(`^${key}:\\s+(\\d+) kB`, "m").exec(text)?.[1] ?? NaN);
  return Object.fromEntries(keys.map((k) => [k, kib(k)])) as Record<K, number>;
}

/** VmRSS split as the kernel counts it: RssAnon (heap, stacks: what the process made) and RssFile + RssShmem (mapped files, the executable's pages among them). */
export async function memoryKiB(node: Node, pid: number): Promise<{ vmRssKiB: number; vmHwmKiB: number; rssAnonKiB: number; rssFileShmemKiB: number }> {
  const { VmRSS, VmHWM, RssAnon, RssFile, RssShmem } = procKiB(node.root, pid, "status", ["VmRSS", "VmHWM", "RssAnon", "RssFile", "RssShmem"]);
  return { vmRssKiB: VmRSS, vmHwmKiB: VmHWM, rssAnonKiB: RssAnon, rssFileShmemKiB: RssFile + RssShmem };
}

export async function machineInfo() {
  const cpuModel = /^model name\s*:\s*(.*)$/m.exec(readFileSync("/proc/cpuinfo", "utf8"))?.[1] ?? "unknown";
  const memTotalKiB = Number(/^MemTotal:\s+(\d+)/m.exec(readFileSync("/proc/meminfo", "utf8"))?.[1]);
  return {
    nproc: Number((await runOk(["nproc"])).trim()),
    cpu: cpuModel,
    memoryGiB: round(memTotalKiB / 1048576),
    kernel: (await runOk(["uname", "-r"])).trim(),
    loadAvgAtStart: readFileSync("/proc/loadavg", "utf8").split(" ").slice(0, 3).join(" "),
  };
}

/** The whole machine's busy CPU between two readings, in cores. */
export function hostCpu(): { busy: number; at: number } {
  const f = (readFileSync("/proc/stat", "utf8").split("\n")[0] ?? "").split(/\s+/).slice(1).map(Number);
  const idle = (f[3] ?? 0) + (f[4] ?? 0);
  return { busy: f.slice(0, 8).reduce((a, b) => a + b, 0) - idle, at: performance.now() };
}
export const busyCores = (from: { busy: number; at: number }, to: { busy: number; at: number }) =>
  round((to.busy - from.busy) / clockTicks / ((to.at - from.at) / 1000), 2);
