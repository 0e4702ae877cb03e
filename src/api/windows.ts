// Maintenance windows: when a disruptive change may be applied. A window is days of the week, a range of
// wall-clock time and a time zone, e.g. "Mon-Fri 22:00-06:00 Europe/Berlin"; several are separated by
// ";". A range that ends before it starts runs past midnight and belongs to the day it starts on
// (Fri 22:00-06:00 is Friday night into Saturday morning); 24:00 ends a range at midnight.
//
// Windows are judged by the wall clock of their zone at the instant asked about, so daylight saving
// needs no rule of its own: a window of 02:00-03:00 is empty on the night the clocks skip that hour,
// and open for both passes of it on the night they repeat it (two hours of real time: each instant's
// local time is within the range). Pure: the zone data is the runtime's.
import type { Result } from "./result.ts";

const dayNames = ["sun", "mon", "tue", "wed", "thu", "fri", "sat"] as const;

export type Window = {
  /** The text it was parsed from, for messages. */
  text: string;
  /** Days the window starts on, 0 = Sunday. */
  days: ReadonlySet<number>;
  /** Minutes after local midnight; end may be ≤ start (past midnight) and is at most 1440. */
  startMin: number;
  endMin: number;
  zone: string;
};

const time = /^([01]\d|2[0-4]):([0-5]\d)$/;

function parseTime(t: string, allow2400: boolean): number | undefined {
  const m = time.exec(t);
  if (!m) return undefined;
  const min = Number(m[1]) * 60 + Number(m[2]);
  return min > 1440 || (min === 1440 && !allow2400) ? undefined : min;
}

const dayOf = (name: string): number | undefined => {
  const i = dayNames.indexOf(name.toLowerCase().slice(0, 3) as (typeof dayNames)[number]);
  // "Mon" or "Monday", nothing in between.
  return i >= 0 && (name.length === 3 || `${dayNames[i]}${["day", "day", "sday", "nesday", "rsday", "day", "urday"][i]}` === name.toLowerCase()) ? i : undefined;
};

function parseDays(text: string): Set<number> | string {
  if (text === "*" || text.toLowerCase() === "daily") return new Set([0, 1, 2, 3, 4, 5, 6]);
  const days = new Set<number>();
  for (const part of text.split(",")) {
    const m = /^([a-z]+)(?:-([a-z]+))?$/i.exec(part);
    const from = m?.[1] === undefined ? undefined : dayOf(m[1]);
    const to = m?.[2] === undefined ? from : dayOf(m[2]);
    if (from === undefined || to === undefined) return `"${part}" is not a day or a range of days (Mon, Tue-Fri, Sat,Sun, daily)`;
    for (let d = from; ; d = (d + 1) % 7) {
      days.add(d);
      if (d === to) break;
    }
  }
  return days;
}

function validZone(zone: string): boolean {
  try {
    new Intl.DateTimeFormat("en-US", { timeZone: zone });
    return true;
  } catch {
    return false;
  }
}

/** Parses "DAYS HH:MM-HH:MM [ZONE]; …" (zone default UTC). Each problem names the window. */
export function parseWindows(text: string): Result<Window[]> {
  const windows: Window[] = [];
  const errors: string[] = [];
  for (const raw of text.split(";").map((w) => w.trim())) {
    if (raw === "") continue;
    const [days, range, zone = "UTC", ...rest] = raw.split(/\s+/);
    const problem = (why: string) => errors.push(`window "${raw}": ${why}`);
    if (!days || !range || rest.length > 0) {
      problem('expected "DAYS HH:MM-HH:MM [TIME ZONE]", e.g. "Mon-Fri 22:00-06:00 Europe/Berlin"');
      continue;
    }
    const parsedDays = parseDays(days);
    if (typeof parsedDays === "string") {
      problem(parsedDays);
      continue;
    }
    const [from, to, extra] = range.split("-");
    const startMin = from === undefined ? undefined : parseTime(from, false);
    const endMin = to === undefined ? undefined : parseTime(to, true);
    if (extra !== undefined || startMin === undefined || endMin === undefined) {
      problem(`"${range}" is not a time range (HH:MM-HH:MM, 00:00 to 24:00)`);
      continue;
    }
    if (startMin === endMin) {
      problem(`"${range}" is empty (a whole day is 00:00-24:00)`);
      continue;
    }
    if (!validZone(zone)) {
      problem(`"${zone}" is not a time zone (an IANA name such as Europe/Berlin, or UTC)`);
      continue;
    }
    windows.push({ text: raw, days: parsedDays, startMin, endMin, zone });
  }
  if (errors.length > 0) return { ok: false, errors };
  if (windows.length === 0) return { ok: false, errors: ["no window in it"] };
  return { ok: true, value: windows };
}

const formatters = new Map<string, Intl.DateTimeFormat>();

/** The wall clock of `zone` at `at`: weekday (0 = Sunday) and minutes after midnight. */
export function wallClock(at: Date, zone: string): { day: number; minute: number } {
  let f = formatters.get(zone);
  if (!f) {
    f = new Intl.DateTimeFormat("en-US", { timeZone: zone, weekday: "short", hour: "2-digit", minute: "2-digit", hourCycle: "h23" });
    formatters.set(zone, f);
  }
  const parts = Object.fromEntries(f.formatToParts(at).map((p) => [p.type, p.value]));
  return { day: dayNames.indexOf(String(parts.weekday).toLowerCase() as (typeof dayNames)[number]), minute: Number(parts.hour) * 60 + Number(parts.minute) };
}

/** Whether `at` lies in the window. */
export function inWindow(w: Window, at: Date): boolean {
  const { day, minute } = wallClock(at, w.zone);
  if (w.startMin < w.endMin) return w.days.has(day) && minute >= w.startMin && minute < w.endMin;
  // Past midnight: the evening part on a listed day, the morning part on the day after one.
  return (w.days.has(day) && minute >= w.startMin) || (w.days.has((day + 6) % 7) && minute < w.endMin);
}

/** The window `at` lies in, if any. */
export function openWindow(windows: readonly Window[], at: Date): Window | undefined {
  return windows.find((w) => inWindow(w, at));
}

/**
 * When the next window opens after `at` (to the minute), within 8 days; undefined if none does (every
 * window lies in a skipped daylight-saving hour, say). Walks the wall clock minute by minute, so that
 * zone rules are those of the runtime, not re-derived here.
 */
export function nextOpening(windows: readonly Window[], at: Date): Date | undefined {
  const start = Math.ceil(at.getTime() / 60_000) * 60_000;
  for (let t = start; t <= start + 8 * 24 * 60 * 60_000; t += 60_000) {
    const d = new Date(t);
    if (openWindow(windows, d)) return d;
  }
  return undefined;
}
