// A reading that lets a duration be measured across an agent restart: the kernel's boot id, the time
// since boot (CLOCK_BOOTTIME, /proc/uptime: monotonic across process restarts, unlike performance.now)
// and the wall clock, which is all that links two boots.
import { readFileSync } from "node:fs";

export type BootClockReading = { bootId: string; uptimeMs: number; wallMs: number };

/** Milliseconds since boot (CLOCK_BOOTTIME): comparable with systemd's *TimestampMonotonic, across agent restarts. */
export function sinceBootMs(): number {
  const uptime = Number.parseFloat(readFileSync("/proc/uptime", "utf8").split(" ")[0] ?? "");
  if (!Number.isFinite(uptime)) throw new Error("/proc/uptime is unreadable: no clock to measure how long a unit has been in its state");
  return uptime * 1000;
}

export function readBootClock(): BootClockReading {
  const bootId = readFileSync("/proc/sys/kernel/random/boot_id", "utf8").trim();
  if (!bootId) throw new Error("/proc/sys/kernel/random/boot_id is empty: no clock to measure the reconciliation delay by");
  return { bootId, uptimeMs: sinceBootMs(), wallMs: Date.now() };
}

/**
 * Milliseconds from `then` to `now`. Within one boot: the time since boot, which wall-clock steps do not
 * move. Across a reboot only the wall clock spans the gap; a wall clock that went backwards (a machine
 * without a battery-backed clock, before NTP) counts as no time at all, so a wait is never cut short.
 */
export function elapsedBetween(then: BootClockReading, now: BootClockReading): number {
  return Math.max(0, then.bootId === now.bootId ? now.uptimeMs - then.uptimeMs : now.wallMs - then.wallMs);
}

/**
 * This boot of the machine: the kernel's boot id and when its init (PID 1) started, in clock ticks since
 * the kernel booted. The second part changes when the machine's init restarts without a new kernel (a
 * container or nspawn machine that rebooted, the test harness's nodes), which the boot id alone misses.
 */
export function machineBoot(): string {
  const bootId = readFileSync("/proc/sys/kernel/random/boot_id", "utf8").trim();
  const stat = readFileSync("/proc/1/stat", "utf8");
  // Fields after the command name, which may itself contain spaces and parentheses: state is field 3, starttime 22.
  const started = stat.slice(stat.lastIndexOf(")") + 2).split(" ")[19];
  if (!bootId || !started || !/^\d+$/.test(started)) throw new Error(`cannot tell this boot of the machine: boot_id "${bootId}", /proc/1/stat "${stat.trim().slice(0, 200)}"`);
  return `${bootId}/${started}`;
}
