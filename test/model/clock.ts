// Virtual time for the model: one monotonic clock (every machine's monotonic clock runs at the same rate,
// and only differences of one machine's readings mean anything), a wall clock per machine (the true time
// plus that machine's skew, which faults change by minutes at once), and timers owned by whoever set them
// (an agent incarnation, a kubelet, the world). Nothing fires by itself: the scheduler advances the clock
// and picks which due timer runs next. `current` is the owner whose code runs now; it decides whose wall
// clock `new Date()` reads while the globals are swapped (installGlobals).

export type Timer = { id: number; owner: string; due: number; seq: number; fn: () => void; everyMs?: number };

/** The machine an owner id belongs to: owners are "<machine>" or "<machine>.<something>". */
export const machineOf = (owner: string): string => owner.split(".", 1)[0] as string;

export class VirtualClock {
  /** Virtual ms since the run began: the monotonic clock of every machine. */
  mono = 0;
  /** Whose code runs now (undefined: the world's). */
  current: string | undefined;
  private readonly skews = new Map<string, number>();
  private readonly timers = new Map<number, Timer>();
  private ids = 0;
  private seq = 0;

  constructor(readonly epochMs: number) {}

  /** The wall clock of `machine` (the true time when undefined or unskewed). */
  wall(machine?: string): number {
    return this.epochMs + this.mono + (machine === undefined ? 0 : (this.skews.get(machine) ?? 0));
  }
  /** The wall clock of whoever runs now. */
  wallNow(): number {
    return this.wall(this.current === undefined ? undefined : machineOf(this.current));
  }
  skew(machine: string): number {
    return this.skews.get(machine) ?? 0;
  }
  /** Steps the wall clock of `machine` by `deltaMs` (NTP stepping it, an operator's date -s, a VM resumed). */
  jump(machine: string, deltaMs: number): void {
    this.skews.set(machine, this.skew(machine) + deltaMs);
  }

  setTimer(owner: string, fn: () => void, ms: number, everyMs?: number): number {
    const id = ++this.ids;
    this.timers.set(id, { id, owner, due: this.mono + Math.max(0, ms), seq: ++this.seq, fn, ...(everyMs !== undefined ? { everyMs: Math.max(1, everyMs) } : {}) });
    return id;
  }
  clearTimer(id: number | undefined): void {
    if (id !== undefined) this.timers.delete(id);
  }
  /** Forgets every timer of `owner` (its process died). */
  dropOwner(owner: string): void {
    for (const [id, t] of this.timers) if (t.owner === owner) this.timers.delete(id);
  }
  /** Timers due now, in the order they were set (the scheduler picks among them). */
  due(): Timer[] {
    const out: Timer[] = [];
    for (const t of this.timers.values()) if (t.due <= this.mono) out.push(t);
    return out;
  }
  nextDue(): number | undefined {
    let next: number | undefined;
    for (const t of this.timers.values()) if (next === undefined || t.due < next) next = t.due;
    return next;
  }
  /** Runs a due timer's callback (as its owner); an interval is set up again first. */
  fire(t: Timer): void {
    if (!this.timers.has(t.id)) return;
    if (t.everyMs !== undefined) this.timers.set(t.id, { ...t, due: this.mono + t.everyMs, seq: ++this.seq });
    else this.timers.delete(t.id);
    t.fn();
  }
  advanceTo(mono: number): void {
    if (mono > this.mono) this.mono = mono;
  }
}

type TimerHandle = { id: number; ref(): TimerHandle; unref(): TimerHandle; hasRef(): boolean; refresh(): TimerHandle; [Symbol.toPrimitive](): number };

/**
 * Swaps the globals the code under test reads time and chance from — Date (and Date.now),
 * setTimeout/setInterval and their clears, Math.random, AbortSignal.timeout (a request's time limit
 * is the model's: memory-api.ts fails requests older than it) — for the run; returns the undo.
 * setImmediate stays real: the scheduler drains microtasks with it.
 */
export function installGlobals(clock: VirtualClock, random: () => number): () => void {
  const g = globalThis as unknown as Record<string, unknown>;
  const saved = { Date: g.Date, setTimeout: g.setTimeout, setInterval: g.setInterval, clearTimeout: g.clearTimeout, clearInterval: g.clearInterval };
  const savedRandom = Math.random;
  const savedTimeout = AbortSignal.timeout;
  const RealDate = Date;

  class VirtualDate extends RealDate {
    constructor(...args: unknown[]) {
      super(...((args.length === 0 ? [clock.wallNow()] : args) as [number]));
    }
    static override now(): number {
      return clock.wallNow();
    }
    static override [Symbol.hasInstance](x: unknown): boolean {
      return x instanceof RealDate;
    }
  }

  const handle = (id: number): TimerHandle => {
    const h: TimerHandle = {
      id,
      ref: () => h,
      unref: () => h,
      hasRef: () => true,
      refresh: () => h,
      [Symbol.toPrimitive]: () => id,
    };
    return h;
  };
  const idOf = (h: unknown): number | undefined => (typeof h === "number" ? h : typeof h === "object" && h !== null && "id" in h ? (h as TimerHandle).id : undefined);
  const owner = () => clock.current ?? "world";
  const call = (fn: unknown, args: unknown[]) => () => (fn as (...a: unknown[]) => void)(...args);

  g.Date = VirtualDate;
  g.setTimeout = (fn: unknown, ms?: number, ...args: unknown[]) => handle(clock.setTimer(owner(), call(fn, args), ms ?? 0));
  g.setInterval = (fn: unknown, ms?: number, ...args: unknown[]) => handle(clock.setTimer(owner(), call(fn, args), ms ?? 0, ms ?? 0));
  g.clearTimeout = (h: unknown) => clock.clearTimer(idOf(h));
  g.clearInterval = (h: unknown) => clock.clearTimer(idOf(h));
  Math.random = random;
  AbortSignal.timeout = () => new AbortController().signal;
  return () => {
    Object.assign(g, saved);
    Math.random = savedRandom;
    AbortSignal.timeout = savedTimeout;
  };
}
