// One node's side of a fleet rollout as a pure state machine: `step(state, event, ctx)` says what the node
// is doing next, and the state is persisted (by one writer, src/controllers/rollout) before anything it
// implies is done. Everything that can disrupt the node — an OSC update, a requested restart, an in-place
// update, drift repair — is a piece of `Work` that passes the same admission: held back (paused, outside
// the canary or every maintenance window), then asked of the pool, then applied, then gated on the node's
// health. What an admitted piece of work disrupts is stored with it when it is admitted and never worked
// out again, so a retried or resumed apply stays under its admission, its gate and its timeout.
//
// The gate belongs to the disruption, not to a checksum: whatever is applied while the node holds its
// slot (a newer OSC, a fix for a failed one, a file-only change) starts the gate over, and the slot goes
// back once the node stayed healthy for the settle time after the last of them. A node never keeps a slot
// it has no reason to keep, and never lets one go while the change it made is unproven.
//
// Durations are measured on the boot clock (src/host/boot-clock.ts): an agent restart, even a crash loop,
// does not start a gate's timeout over, and a wall-clock step does not move it.
import type { Probe } from "../api/rollout.ts";
import type { BootClockReading } from "../host/boot-clock.ts";
import { elapsedBetween } from "../host/boot-clock.ts";

export type WorkKind = "osc" | "restart" | "drift" | "in-place";

/** What a piece of work disrupts: counted units it restarts or stops, and files running processes read. */
export type Disruption = { units: string[]; paths: string[] };

export type Work = {
  kind: WorkKind;
  /**
   * What the pool admits and stops on: for an OSC change the Secret's revision (osc.yaml and every
   * overlay), so a change that failed its gate on one node stops on every node whatever its overlays;
   * for other work a name of its own, so a failed OSC elsewhere never stops a requested restart.
   */
  revision: string;
  /** The OSC this work leaves applied (effective and osc.yaml checksums). */
  checksum: string;
  base: string;
  disruption: Disruption;
  /**
   * What it changes on the node, one digest per file or unit written or removed (`changesOf`,
   * src/plan/disruption.ts): a failure of this work stops a later revision that still carries all of it.
   */
  changes?: string[];
  /**
   * Every file and unit the work leaves on the node (`carriesOf`): once it passed its gate on a node whose
   * failure is on the pool's record, those changes of the failure are proven and no longer stop anything.
   */
  carries?: string[];
};

export type Phase =
  /** Asked the pool for a slot. */
  | "waiting"
  /** Holds a slot; the work is being applied (an unfinished apply is retried under this admission). */
  | "applying"
  /** Applied; the node must stay healthy for the settle time. */
  | "gating"
  /** Going back to the last good OSC (its own gate follows, under the same slot). */
  | "rolling-back"
  /** Failed (and, if it rolled back, so did the rollback): the slot stays taken, the pool's rollout of this revision stops here. */
  | "failed";

export type Current = {
  work: Work;
  phase: Phase;
  /** When the slot was granted, or the last apply under it started: the gate's timeout counts from here. */
  since?: BootClockReading;
  /** Since when the node has looked healthy without a break (undefined: not yet, or it broke). */
  healthySince?: BootClockReading;
  /** The check that failed last. */
  check?: string;
  /** While rolling back: the OSC gone back to. */
  rollbackTo?: Good;
  /** The gate this work was admitted under: it runs on after an agent restart that cannot read the Secret. */
  gate?: Gate;
  /** The changes of each piece of work applied under this admission, once more than the first was (`piecesOf`). */
  pieces?: string[][];
  /** The check that failed last could not tell the change's fault from a partition's (`look`'s `inconclusive`). */
  inconclusive?: boolean;
  /**
   * It failed on an inconclusive check: once the rollback passed its gate, the slot goes back and the node
   * asks again for the work (`NodeRollout.retry`); with nothing rolled back, the node staying healthy on the
   * work for the settle time is its gate passed late (`pass`).
   */
  retryable?: boolean;
  /**
   * A second try after an inconclusive failure of this revision (the work, or newer work the Secret asks for
   * meanwhile): failing it is final. The pool admits the node that failed although its failure stops the
   * revision for every other node.
   */
  retryOf?: string;
  /**
   * A failure not on the pool's record yet. The node rolls back at once (its change may have cut it off
   * from the API server, and only the rollback brings it back), but it keeps its slot until the failure is
   * recorded: nobody else may take the revision before the pool knows it failed. It names the work that
   * failed, not newer work applied under the slot meanwhile (which must not be stopped for it).
   */
  recordOwed?: OwedFailure;
};

export type Good = { checksum: string; base: string };

/** What the pool's record is to say of a failed gate: the revision, its own failed check, the changes of each piece of work under the admission. */
export type OwedFailure = { revision: string; failure: string; changes: string[][] };

export type NodeRollout = {
  version: 2;
  current?: Current;
  /** The last OSC that passed its gate here: the rollback target. */
  lastGood?: Good & { at: string };
  /** An OSC revision that failed its gate here and was rolled back from: not applied here again. */
  blocked?: { revision: string; checksum: string; check: string };
  /**
   * This node's inconclusive failure of `revision` is on the pool's record and the rollback passed: its next
   * OSC work is the retry (`Current.retryOf`), admitted as any work is (held back while paused or outside
   * every window, then a slot), so the pool's rollout of that change waits for this node alone.
   */
  retry?: { revision: string };
  /**
   * This node's failure of `revision` went on the pool's record: the next work that passes its gate here
   * proves what of it the node runs then (`proveOwed`).
   */
  recorded?: string;
  /**
   * Work passed its gate here after this node's failure of `revision` went on the pool's record: what of it
   * the node runs now (`proven`: every file and unit the work left) is to come off the record
   * (`provenFailure`, src/rollout/pool.ts), until the pool's record has it (`proven` event).
   */
  proveOwed?: { revision: string; proven?: string[] };
};

export const emptyNodeRollout = (): NodeRollout => ({ version: 2 });

/** How a gate judges the node: the Secret's settings when the work was admitted. */
export type Gate = { settleMs: number; healthTimeoutMs: number; rollback: boolean; probe?: Probe; probeTimeoutMs: number };

/** `pooled`: the Secret has a disruption budget (without one nothing asks for a slot and nothing is gated). */
export type GatePolicy = Gate & { pooled: boolean };

/** Why work is held back before it asks the pool (kured's blockers: one type per reason). */
export type HoldBack = { reason: "Paused" | "NotSelected" | "OutsideMaintenanceWindow" | "Blocked" | "WaitingForSlot" | "RolloutStopped"; message: string; retryAfterMs: number };

export type Event =
  /** The controller found this work to do (each reconcile: level-triggered). `holdBack`: a blocker it found. */
  | { type: "want"; work: Work; holdBack?: HoldBack }
  /** The pool granted this node a slot for `revision`. */
  | { type: "granted"; revision: string }
  /** The slot is gone (its ticket deleted by an operator, or the pool's budget removed): nothing holds the node back any more. */
  | { type: "slot-lost" }
  /** An apply under the current admission ended. */
  /** `checksum`: what the apply was of; an apply of something else (a late end of the work a rollback replaced) is not this one's. */
  | { type: "applied"; complete: boolean; error?: string; checksum?: string }
  /** One look at the node's health. */
  | { type: "look"; healthy: true }
  /** `inconclusive`: the node could not see its own health (cut off from the API server, its Node Unknown). */
  | { type: "look"; healthy: false; check: string; inconclusive?: boolean }
  /** The failure is on the pool's record. */
  | { type: "failure-recorded" }
  /** What the node proved of its failure is off the pool's record (`proveOwed`). */
  | { type: "proven" }
  /**
   * An OSC was applied outside any gate (a fresh node's first, or one that disrupted nothing): it becomes the
   * rollback target only while the node has none — only a passed gate replaces a last good OSC.
   */
  | { type: "baseline"; checksum: string; base: string };

/** What the controller does next. The state is saved before it. */
export type Action =
  | { do: "nothing" }
  /** Apply the work now, outside any admission (it disrupts nothing). */
  | { do: "apply-free" }
  /** Apply under the current admission (`target`: the wanted work, or the last good OSC). */
  | { do: "apply"; target: "work" | "last-good" }
  /** Held back; look again after `retryAfterMs` (or on the next event). */
  | { do: "hold"; reason: string; message: string; retryAfterMs?: number }
  /** Look at the node's health again in a moment. */
  | { do: "look" }
  /** The work is proven: the slot goes back. */
  | { do: "released"; passed: Work };

export type Ctx = { now: BootClockReading; wallIso: string; policy: GatePolicy };

const holding = (p: Phase) => p !== "waiting";
const union = (a: readonly string[], b: readonly string[]) => [...new Set([...a, ...b])];

/** Whether `work` disrupts anything the budget counts. */
export const disrupts = (d: Disruption) => d.units.length > 0 || d.paths.length > 0;

/** The next state and what to do, for one event. */
export function step(s: NodeRollout, e: Event, ctx: Ctx): { state: NodeRollout; action: Action } {
  switch (e.type) {
    case "want":
      return want(s, e.work, e.holdBack, ctx);
    case "granted":
      return granted(s, e.revision, ctx);
    case "slot-lost":
      return { state: { ...s, current: undefined }, action: { do: "nothing" } };
    case "applied":
      return applied(s, e, ctx);
    case "look":
      return look(s, e, ctx);
    case "failure-recorded":
      return failureRecorded(s);
    case "proven": {
      const { proveOwed: _, ...rest } = s;
      return { state: s.proveOwed ? rest : s, action: { do: "nothing" } };
    }
    case "baseline":
      return { state: s.lastGood ? s : { ...s, lastGood: { checksum: e.checksum, base: e.base, at: ctx.wallIso } }, action: { do: "nothing" } };
  }
}

function want(s: NodeRollout, work: Work, holdBack: HoldBack | undefined, ctx: Ctx): { state: NodeRollout; action: Action } {
  const cur = s.current;
  if (s.blocked && s.blocked.revision === work.revision) {
    return { state: s, action: { do: "hold", reason: "Blocked", message: `OSC ${short(work.checksum)} failed its health gate here (${s.blocked.check}) and was rolled back from; a new OSC is applied as usual` } };
  }
  if (cur && holding(cur.phase)) {
    if (cur.phase === "rolling-back") return { state: s, action: { do: "apply", target: "last-good" } };
    if (sameWork(cur.work, work)) {
      if (cur.phase === "applying") return { state: s, action: { do: "apply", target: "work" } };
      if (cur.phase === "failed") return { state: s, action: { do: "hold", reason: "HealthGateFailed", message: `OSC ${short(work.checksum)} failed its health gate here (${cur.check ?? "?"}); the node keeps its disruption slot until it is healthy again or a new OSC comes` } };
      return { state: s, action: { do: "look" } };
    }
    // Paused (or the like) while holding: nothing new is applied, the gate of what was goes on.
    if (holdBack) return { state: s, action: { do: "hold", reason: holdBack.reason, message: holdBack.message, retryAfterMs: holdBack.retryAfterMs } };
    // Still holding the slot: the new work is applied under it (disruptive or not), and the gate starts over
    // for everything it has disrupted since it was admitted.
    const chained: Current = {
      work: { ...work, disruption: { units: union(cur.work.disruption.units, work.disruption.units), paths: union(cur.work.disruption.paths, work.disruption.paths) } },
      pieces: [...piecesOf(cur), ...(work.changes ? [work.changes] : [])],
      phase: "applying",
      since: ctx.now,
      gate: gateOf(ctx),
      // A failure not yet recorded stays owed: the failed change happened whatever comes after it.
      ...(cur.recordOwed ? { recordOwed: cur.recordOwed } : {}),
      // Newer work during a retry is the retry.
      ...(cur.retryOf && !cur.rollbackTo ? { retryOf: cur.retryOf } : {}),
    };
    return { state: { ...s, current: chained }, action: { do: "apply", target: "work" } };
  }
  if (holdBack) return { state: { ...s, current: undefined }, action: { do: "hold", reason: holdBack.reason, message: holdBack.message, retryAfterMs: holdBack.retryAfterMs } };
  if (!disruptsAny(work) || !ctx.policy.pooled) {
    // Another piece of work waiting for its slot (a requested restart) keeps its place in the queue.
    const keep = cur?.phase === "waiting" && cur.work.revision !== work.revision && ctx.policy.pooled ? cur : undefined;
    return { state: keep || !cur ? s : { ...s, current: undefined }, action: { do: "apply-free" } };
  }
  if (cur?.phase === "waiting" && cur.work.revision === work.revision) return { state: { ...s, current: { ...cur, work } }, action: { do: "hold", reason: "WaitingForSlot", message: waitingMessage(work) } };
  const retry = s.retry && work.kind === "osc" ? { retryOf: s.retry.revision } : {};
  return { state: { ...s, current: { work, phase: "waiting", ...retry } }, action: { do: "hold", reason: "WaitingForSlot", message: waitingMessage(work) } };
}

const disruptsAny = (w: Work) => disrupts(w.disruption);
/**
 * What each piece of work applied under the current admission changed: if the gate fails, any of them may be
 * what failed, so a later revision that carries any one of them whole is stopped.
 */
const piecesOf = (cur: Current): string[][] => cur.pieces ?? (cur.work.changes ? [cur.work.changes] : []);
const gateOf = ({ policy: { pooled: _, ...gate } }: Ctx): Gate => gate;

function granted(s: NodeRollout, revision: string, ctx: Ctx): { state: NodeRollout; action: Action } {
  const cur = s.current;
  if (!cur || cur.phase !== "waiting" || cur.work.revision !== revision) return { state: s, action: { do: "nothing" } };
  return { state: { ...s, current: { ...cur, phase: "applying", since: ctx.now, gate: gateOf(ctx) } }, action: { do: "apply", target: "work" } };
}

function applied(s: NodeRollout, e: { complete: boolean; error?: string; checksum?: string }, ctx: Ctx): { state: NodeRollout; action: Action } {
  const cur = s.current;
  if (!cur || (cur.phase !== "applying" && cur.phase !== "rolling-back")) return { state: s, action: { do: "nothing" } };
  const expected = cur.phase === "rolling-back" ? cur.rollbackTo?.checksum : cur.work.checksum;
  if (e.checksum !== undefined && e.checksum !== expected) return { state: s, action: { do: "nothing" } };
  if (!e.complete) {
    // Retried under the same admission; the gate's timeout runs on, so an apply that never completes fails it.
    const { inconclusive: _, ...rest } = cur;
    const next: Current = { ...rest, check: `apply: ${e.error ?? "incomplete"}` };
    return timedOut(next, ctx) ? fail(s, next, ctx) : { state: { ...s, current: next }, action: { do: "apply", target: cur.phase === "rolling-back" ? "last-good" : "work" } };
  }
  // A rollback's gate is the gate of the OSC gone back to (`rollbackTo` says so).
  return { state: { ...s, current: { ...cur, phase: "gating", healthySince: undefined } }, action: { do: "look" } };
}

function look(s: NodeRollout, e: { healthy: true } | { healthy: false; check: string; inconclusive?: boolean }, ctx: Ctx): { state: NodeRollout; action: Action } {
  const cur = s.current;
  if (!cur || cur.phase === "waiting") return { state: s, action: { do: "nothing" } };
  if (cur.phase === "applying" || cur.phase === "rolling-back") {
    return timedOut(cur, ctx) ? fail(s, cur, ctx) : { state: s, action: { do: "apply", target: cur.phase === "rolling-back" ? "last-good" : "work" } };
  }
  if (e.healthy) {
    // Healthy without a break since then only within one boot: a machine that booted again was down between
    // the two looks (nobody looked while it was), so its settle time starts over.
    const since = cur.healthySince?.bootId === ctx.now.bootId ? cur.healthySince : ctx.now;
    // A failed node that recovers by itself gives its slot back too; the pool's record of the failure stays.
    if (elapsedBetween(since, ctx.now) >= ctx.policy.settleMs) return pass(s, cur, ctx);
    return { state: { ...s, current: { ...cur, healthySince: since } }, action: { do: "look" } };
  }
  if (cur.phase === "failed") return { state: { ...s, current: { ...cur, healthySince: undefined } }, action: { do: "look" } };
  const { inconclusive: _, ...was } = cur;
  const next: Current = { ...was, healthySince: undefined, check: e.check, ...(e.inconclusive ? { inconclusive: true } : {}) };
  return timedOut(next, ctx) ? fail(s, next, ctx) : { state: { ...s, current: next }, action: { do: "look" } };
}

const timedOut = (cur: Current, ctx: Ctx) => cur.since !== undefined && elapsedBetween(cur.since, ctx.now) >= ctx.policy.healthTimeoutMs;

function pass(s: NodeRollout, cur: Current, ctx: Ctx): { state: NodeRollout; action: Action } {
  // Healthy again, but the pool does not know yet that the change failed: the slot stays until it does.
  if (cur.recordOwed) return { state: { ...s, current: cur }, action: { do: "look" } };
  if (cur.rollbackTo && cur.retryable) {
    // The change failed where the node could not see itself (cut off, its Node Unknown), and the node is
    // healthy and reachable again on its last good OSC: the slot goes back, and the change is tried once
    // more, admitted again (the node may be paused by now, or outside its windows: a retry under the old
    // slot would wait there and time out untried). A change that cuts the node off fails again, for good;
    // a partition's failure passes and is cleared.
    return { state: { ...s, current: undefined, retry: { revision: cur.work.revision } }, action: { do: "released", passed: { ...cur.work, ...cur.rollbackTo } } };
  }
  // Failed where it could not see itself, and nothing was rolled back: healthy on the work itself for the
  // settle time is its gate passed late.
  const passedLate = cur.phase === "failed" && !cur.rollbackTo && cur.retryable === true;
  if ((cur.rollbackTo || cur.phase === "failed") && !passedLate) {
    // Healthy again on its last good OSC (or by itself): the slot goes back; the failed revision stays
    // blocked here and on the pool's record.
    const back = cur.rollbackTo ?? { checksum: cur.work.checksum, base: cur.work.base };
    return {
      state: { ...s, current: undefined, blocked: { revision: cur.work.revision, checksum: cur.work.checksum, check: cur.check ?? "?" } },
      action: { do: "released", passed: { ...cur.work, ...back } },
    };
  }
  const lastGood = cur.work.kind === "osc" || cur.work.kind === "in-place" ? { checksum: cur.work.checksum, base: cur.work.base, at: ctx.wallIso } : s.lastGood;
  // The node's own failure on the record (a retry, a gate passed late, a fix after a failure) is proven as
  // far as the node runs it now: one try, a change newer work replaced stays suspect.
  const { recorded, ...kept } = s;
  const { retry: _, ...retried } = kept;
  const proveOwed = recorded !== undefined ? { proveOwed: { revision: recorded, ...(cur.work.carries ? { proven: cur.work.carries } : {}) } } : {};
  return { state: { ...(cur.retryOf ? retried : kept), ...proveOwed, current: undefined, ...(lastGood ? { lastGood } : {}) }, action: { do: "released", passed: cur.work } };
}

function fail(state: NodeRollout, cur: Current, ctx: Ctx): { state: NodeRollout; action: Action } {
  const check = cur.check ?? "not healthy within the health timeout";
  // A retry that fails is final: nothing is tried again.
  const { retry: _, ...rest } = state;
  const s = cur.retryOf ? rest : state;
  if (cur.rollbackTo) return { state: { ...s, current: { ...cur, phase: "failed", check: `${check} (after rolling back)` } }, action: { do: "look" } };
  // Only an OSC change is the pool's to stop: a requested restart or drift repair that fails here is this node's.
  const owed = cur.work.kind === "osc" || cur.work.kind === "in-place" ? { recordOwed: { revision: cur.work.revision, failure: check, changes: piecesOf(cur) } } : {};
  const back = s.lastGood;
  // Failed where the node could not see itself (cut off, its Node Unknown, or down: the machine booted again
  // during the gate): an OSC change gets a second chance (`pass`): tried once more after the rollback, or
  // without a rollback judged again as it runs.
  const unseen = cur.inconclusive || (cur.since !== undefined && cur.since.bootId !== ctx.now.bootId);
  const retryable = unseen && !cur.retryOf && cur.work.kind === "osc" ? { retryable: true } : {};
  if (owed.recordOwed && ctx.policy.rollback && back && back.checksum !== cur.work.checksum) {
    const rollingBack: Current = { ...cur, ...owed, ...retryable, phase: "rolling-back", check, since: ctx.now, healthySince: undefined, rollbackTo: { checksum: back.checksum, base: back.base } };
    return { state: { ...s, current: rollingBack }, action: { do: "apply", target: "last-good" } };
  }
  return { state: { ...s, current: { ...cur, ...owed, ...retryable, phase: "failed", check } }, action: { do: "look" } };
}

function failureRecorded(s: NodeRollout): { state: NodeRollout; action: Action } {
  const cur = s.current;
  if (!cur?.recordOwed) return { state: s, action: { do: "nothing" } };
  const { recordOwed: _, ...rest } = cur;
  // What the node does next is unchanged (this step follows whatever event found the record reachable, and
  // its answer is this one's): the rollback goes on, or the gate's looks.
  return { state: { ...s, current: rest, recorded: cur.recordOwed.revision }, action: cur.phase === "rolling-back" ? { do: "apply", target: "last-good" } : { do: "look" } };
}

// Not the kind: the OSC controller offers an OSC it has applied as "drift" (its state says it is current), and
// that is the same work as the "osc" it was admitted as, not new work to apply under the slot with its gate
// and timeout started over and its failure no longer the pool's.
const sameWork = (a: Work, b: Work) => a.revision === b.revision && a.checksum === b.checksum;
const short = (c: string) => c.slice(0, 12);
const waitingMessage = (w: Work) => `${w.kind === "osc" ? `OSC ${short(w.checksum)}` : w.kind} restarts ${[...w.disruption.units, ...w.disruption.paths].join(", ")} and waits for a disruption slot`;
