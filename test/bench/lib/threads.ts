// A process's CPU time by thread, read from /proc/PID/task/*/stat (spawns nothing, so it can be sampled
// often without disturbing what it measures). Threads come and go (JavaScriptCore's JIT and GC helpers
// end when idle and are started again), so a tracker samples every few seconds and keeps each thread's
// last reading; what threads that lived between two samples used is the process's total less the sum
// over the threads seen ("unattributed").
import { readdirSync } from "node:fs";
import { readStat, ticksPerSecond } from "./proc.ts";

type ThreadReading = { comm: string; ticks: number };

/** utime + stime in clock ticks of every thread of `pid` now; `root` is "" for the host. */
export function threadTicks(root: string, pid: number): Map<number, ThreadReading> {
  const out = new Map<number, ThreadReading>();
  let tids: string[];
  try {
    tids = readdirSync(`${root}/proc/${pid}/task`);
  } catch {
    return out; // the process ended
  }
  for (const tid of tids) {
    try {
      const { comm, ticks } = readStat(`${root}/proc/${pid}/task/${tid}/stat`);
      out.set(Number(tid), { comm, ticks });
    } catch {
      // the thread ended between readdir and read
    }
  }
  return out;
}

/** utime + stime of the whole process (its ended threads included), in clock ticks. */
function processTicks(root: string, pid: number): number {
  return readStat(`${root}/proc/${pid}/stat`).ticks;
}

/** Thread names as their role: JavaScriptCore numbers none of its threads, Bun numbers its pool's ("Bun Pool 3"). */
export const threadRole = (comm: string) => comm.replace(/ \d+$/, "");

export type ThreadCpu = {
  seconds: number;
  /** CPU seconds by thread role (the main thread under the executable's name, truncated to 15 bytes by the kernel). */
  byThread: Record<string, number>;
  /** Threads that started and ended between two samples. */
  unattributed: number;
  /** Threads alive at the end, by role. */
  threadsAtEnd: Record<string, number>;
};

/** Samples one process's threads from start() until finish(). */
export class ThreadTracker {
  private readonly first = new Map<number, ThreadReading>();
  private readonly last = new Map<number, ThreadReading>();
  private total0 = 0;
  constructor(
    private readonly root: string,
    private readonly pid: number,
  ) {}
  start(): void {
    this.total0 = processTicks(this.root, this.pid);
    for (const [tid, r] of threadTicks(this.root, this.pid)) {
      this.first.set(tid, r);
      this.last.set(tid, r);
    }
  }
  sample(): void {
    for (const [tid, r] of threadTicks(this.root, this.pid)) this.last.set(tid, r);
  }
  finish(): ThreadCpu {
    const total = processTicks(this.root, this.pid) - this.total0;
    this.sample();
    const alive = threadTicks(this.root, this.pid);
    const byThread: Record<string, number> = {};
    let attributed = 0;
    for (const [tid, r] of this.last) {
      const used = r.ticks - (this.first.get(tid)?.ticks ?? 0);
      if (used === 0) continue;
      attributed += used;
      const role = threadRole(r.comm);
      byThread[role] = (byThread[role] ?? 0) + used;
    }
    const threadsAtEnd: Record<string, number> = {};
    for (const r of alive.values()) threadsAtEnd[threadRole(r.comm)] = (threadsAtEnd[threadRole(r.comm)] ?? 0) + 1;
    const s = (ticks: number) => ticks / ticksPerSecond();
    return {
      seconds: s(total),
      byThread: Object.fromEntries(Object.entries(byThread).sort((a, b) => b[1] - a[1]).map(([k, v]) => [k, s(v)])),
      unattributed: s(Math.max(0, total - attributed)),
      threadsAtEnd,
    };
  }
}
