// The world's own record of disruption, from which the invariants are judged (never from what an agent
// says about itself):
// - a machine is disrupted from the moment an apply restarts or stops a unit that was running there
//   (every unit counts: the model's Secrets keep disruptive-units at its default "*"), until it has been
//   alive and healthy (no broken unit running) for the settle time without interruption; a dead machine
//   stays disrupted until its Node is deleted;
// - a dead machine whose Node is still there also counts while the API's objects say it holds a slot.
// A fresh machine's first apply disrupts nothing (nothing ran), nor does a reboot (not the rollout's).
//
// I1 at no instant more than k disrupted: checked when a disruption starts (with it, at most k as the
//    Secret and the pool's Node count give k then — or at any time in the last kGraceMs, the time an
//    agent may take between its admission and its restart), and after every step (at most the largest
//    k any running disruption may have been admitted under: the largest of its start's grace window);
// I2 a bad change disrupts at most k nodes in total: machines that restarted a running unit into a
//    broken version, per version, at most the largest k of the run.
// (I3–I5, judged once the faults stopped and the pool had time to finish, are in invariants.ts.)

export type Invariant = "I1" | "I2" | "I3" | "I4" | "I5";
export type Violation = { invariant: Invariant; step: number; atMs: number; message: string; trace: string[] };

export type Disruption = { since: number; k: number; settleMs: number; healthySince: number | undefined; cause: string };

/** The last lines of what happened, for a violation's report. */
export class Trace {
  private readonly lines: string[] = [];
  constructor(
    private readonly now: () => number,
    private keep = 80,
  ) {}
  add(text: string): void {
    this.lines.push(`${(this.now() / 1000).toFixed(1).padStart(7)}s ${text}`);
    if (process.env.MODEL_LIVE) process.stderr.write(`${this.lines.at(-1)}\n`);
    if (this.lines.length > this.keep * 2) this.lines.splice(0, this.lines.length - this.keep);
  }
  /** Keeps every line from now on (a dump of one schedule). */
  keepAll(): void {
    this.keep = Number.POSITIVE_INFINITY;
  }
  tail(n: number): string[] {
    return this.lines.slice(-n);
  }
}

export class Truth {
  readonly disruptions = new Map<string, Disruption>();
  readonly violations: Violation[] = [];
  /** How often each invariant was violated (only the first of each is kept with its trace). */
  readonly counts: Partial<Record<Invariant, number>> = {};
  private readonly brokenRestarts = new Map<string, Set<string>>();
  private readonly kLog: { at: number; k: number }[] = [];
  private readonly healthy = new Map<string, boolean>();
  private readonly last = new Map<Invariant, string>();
  kMax = 0;

  constructor(
    private readonly o: {
      now: () => number;
      step: () => number;
      trace: Trace;
      kGraceMs: number;
      traceLines: number;
      /** A few words on a machine's state for a violation's message (dead, clock skew, ...). */
      about: (machine: string) => string;
      /** A machine's disruption ended: it stayed healthy for the settle time. */
      settled: (machine: string) => void;
    },
  ) {}

  /** The budget's k from now on (Infinity: no budget). */
  recordK(k: number): void {
    if (this.kLog.at(-1)?.k === k) return;
    this.kLog.push({ at: this.o.now(), k });
    if (k !== Number.POSITIVE_INFINITY) this.kMax = Math.max(this.kMax, k);
    this.o.trace.add(`budget: k=${k}`);
  }
  /** The largest k in effect at any time in the last kGraceMs. */
  kAllowed(): number {
    const from = this.o.now() - this.o.kGraceMs;
    let allowed = 0;
    for (let i = this.kLog.length - 1; i >= 0; i--) {
      const e = this.kLog[i] as { at: number; k: number };
      allowed = Math.max(allowed, e.k);
      if (e.at <= from) break;
    }
    return allowed;
  }
  kNow(): number {
    return this.kLog.at(-1)?.k ?? Number.POSITIVE_INFINITY;
  }

  disrupted(machine: string): boolean {
    return this.disruptions.has(machine);
  }

  /**
   * `machine` restarted or stopped running `units` (a restart during a disruption starts its settle time
   * over); `deadHolders` are the dead machines counted besides disruptions. health() follows.
   */
  restarted(machine: string, units: string[], o: { settleMs: number; cause: string; deadHolders: readonly string[] }): void {
    const ongoing = this.disruptions.get(machine);
    if (ongoing) {
      ongoing.healthySince = undefined;
      return;
    }
    const k = this.kAllowed();
    this.disruptions.set(machine, { since: this.o.now(), k, settleMs: o.settleMs, healthySince: undefined, cause: o.cause });
    this.o.trace.add(`TRUTH ${machine} disrupted (restarted ${units.join(", ")} for ${o.cause.slice(0, 8)})`);
    const counted = this.countedWith(o.deadHolders);
    if (counted.length > k) this.violate("I1", `${machine} restarted ${units.join(", ")} while ${counted.length} nodes were disrupted with k=${k}: ${this.describe(counted)}`);
  }

  /** `machine` restarted `unit` into a broken `version` (it ran the unit before). */
  brokenRestart(machine: string, key: string): void {
    const set = this.brokenRestarts.get(key) ?? new Set<string>();
    set.add(machine);
    this.brokenRestarts.set(key, set);
    if (set.size > this.kMax) this.violate("I2", `the bad change ${key} disrupted ${set.size} nodes (${[...set].join(", ")}); the largest k of the run is ${this.kMax}`);
  }

  /** Whether `machine` is alive and runs nothing broken, as of now. */
  health(machine: string, healthy: boolean): void {
    this.healthy.set(machine, healthy);
    const d = this.disruptions.get(machine);
    if (!d) return;
    if (!healthy) d.healthySince = undefined;
    else d.healthySince ??= this.o.now();
  }

  /** Ends the disruptions of machines healthy for their settle time. */
  settle(): void {
    const now = this.o.now();
    for (const [machine, d] of this.disruptions) {
      if (d.healthySince !== undefined && now - d.healthySince >= d.settleMs) {
        this.disruptions.delete(machine);
        this.o.trace.add(`TRUTH ${machine} no longer disrupted (healthy for ${d.settleMs / 1000}s)`);
        this.o.settled(machine);
      }
    }
  }

  /** The machine's Node is gone (it no longer belongs to the pool). */
  forget(machine: string): void {
    this.disruptions.delete(machine);
    this.healthy.delete(machine);
  }

  /** I1 after a step: at most the largest k any running disruption was admitted under (or k now). */
  check(deadHolders: readonly string[]): void {
    if (this.disruptions.size + deadHolders.length <= 1) return;
    const counted = this.countedWith(deadHolders);
    if (counted.length === 0) return;
    let bound = this.kAllowed();
    for (const d of this.disruptions.values()) bound = Math.max(bound, d.k);
    if (counted.length > bound) this.violate("I1", `${counted.length} nodes disrupted at once with k=${bound}: ${this.describe(counted)}`);
  }

  /** Records a violation; the same one seen again at the next step is the same episode, not counted again. */
  violate(invariant: Invariant, message: string): void {
    if (this.last.get(invariant) === message) return;
    this.last.set(invariant, message);
    this.counts[invariant] = (this.counts[invariant] ?? 0) + 1;
    this.o.trace.add(`VIOLATION ${invariant}: ${message}`);
    if (this.violations.some((v) => v.invariant === invariant)) return;
    this.violations.push({ invariant, step: this.o.step(), atMs: this.o.now(), message, trace: this.o.trace.tail(this.o.traceLines) });
  }

  private countedWith(deadHolders: readonly string[]): string[] {
    return [...new Set([...this.disruptions.keys(), ...deadHolders])];
  }
  private describe(machines: string[]): string {
    return machines
      .map((m) => {
        const d = this.disruptions.get(m);
        const about = this.o.about(m);
        return d ? `${m} (disrupted since ${(d.since / 1000).toFixed(1)}s${about ? `, ${about}` : ""})` : `${m} (holding a slot${about ? `, ${about}` : ""})`;
      })
      .join(", ");
  }
}
