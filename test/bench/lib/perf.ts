// Linux perf on an agent inside a node: where its CPU time goes below JavaScript (kernel, runtime,
// garbage collector and JIT threads), which a JS profiler cannot see.
import { readdirSync, readFileSync, readlinkSync } from "node:fs";
import { run, runOk } from "../../harness/exec.ts";
import type { Node } from "../../harness/node.ts";

/** The host's PID of process `pid` of the node: the one whose NSpid ends in `pid`, in the same PID namespace. */
export function hostPid(node: Node, pid: number): number {
  const ns = readlinkSync(`${node.root}/proc/${pid}/ns/pid`);
  for (const entry of readdirSync("/proc")) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      const nspid = /^NSpid:\s+(.*)$/m.exec(readFileSync(`/proc/${entry}/status`, "utf8"))?.[1]?.split(/\s+/);
      if (nspid?.at(-1) === String(pid) && nspid.length > 1 && readlinkSync(`/proc/${entry}/ns/pid`) === ns) return Number(entry);
    } catch {
      // the process ended while the list was read
    }
  }
  throw new Error(`no host PID for PID ${pid} of node ${node.name}`);
}

export const PERF_HZ = 499;

/** Samples every thread of `pid` (a host PID) on CPU time at PERF_HZ, with call graphs, for `seconds`. */
export async function perfRecord(pid: number, seconds: number, out: string): Promise<void> {
  await runOk(["perf", "record", "-q", "-F", String(PERF_HZ), "-g", "-p", String(pid), "-o", out, "--", "sleep", String(seconds)], { timeoutMs: (seconds + 60) * 1000 });
}

export type PerfRow = { percent: number; samples: number; key: string };

/**
 * `perf report` grouped by `sort` (comm, dso, sym, …): share and samples of each group, largest first.
 * JIT code is one group however many threads it ran on ("[JIT] tid N"); `extra` narrows, e.g. --dsos.
 */
export async function perfReport(file: string, sort: string, limit = 12, extra: string[] = []): Promise<PerfRow[]> {
  const r = await run(["perf", "report", "-i", file, "--stdio", "--no-children", "-g", "none", "-n", "--sort", sort, ...extra], { timeoutMs: 120_000 });
  if (r.code !== 0) throw new Error(`perf report --sort ${sort} of ${file}: ${r.stderr.trim()}`);
  const groups = new Map<string, PerfRow>();
  for (const line of r.stdout.split("\n")) {
    const m = /^\s+([\d.]+)%\s+(\d+)\s+(.*?)\s*$/.exec(line);
    if (!m) continue;
    const key = (m[3] ?? "").replace(/\[JIT\] tid \d+/, "[JIT]").replace(/\s+/g, " ");
    const g = groups.get(key) ?? { percent: 0, samples: 0, key };
    g.percent = Number((g.percent + Number(m[1])).toFixed(2));
    g.samples += Number(m[2]);
    groups.set(key, g);
  }
  return [...groups.values()].sort((a, b) => b.samples - a.samples).slice(0, limit);
}

/** Threads of a process by name (their comm), with how many share each name. */
export function threadNames(pid: number): Record<string, number> {
  const names: Record<string, number> = {};
  for (const tid of readdirSync(`/proc/${pid}/task`)) {
    const comm = readFileSync(`/proc/${pid}/task/${tid}/comm`, "utf8").trim().replace(/\d+$/, "N");
    names[comm] = (names[comm] ?? 0) + 1;
  }
  return names;
}
