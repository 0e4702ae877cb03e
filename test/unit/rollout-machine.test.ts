// The per-node rollout state machine (src/rollout/machine.ts), transition by transition, and the pool's
// pure decisions (src/rollout/pool.ts). Each case names the defect of issue 19 it guards against where
// there is one.
import { describe, expect, test } from "bun:test";
import type { BootClockReading } from "../../src/host/boot-clock.ts";
import { type Action, type Ctx, emptyNodeRollout, type Event, type NodeRollout, step, type Work } from "../../src/rollout/machine.ts";
import { admitted, budgetSlots, decide, decodePool, shardCapacity, shardLeaseName, shardOf, shardsFor, shardSlots, dropCandidates, holderView, encodePool, grantsOwed, movesOwed, type PoolRecord, provenFailure, stops, stopsOwed, stopsRequest, type Ticket, withHolder, withLostHolders, workRevision } from "../../src/rollout/pool.ts";

const policy = { pooled: true, settleMs: 60_000, healthTimeoutMs: 300_000, rollback: true, probeTimeoutMs: 10_000 };
const at = (s: number, bootId = "b1"): BootClockReading => ({ bootId, uptimeMs: s * 1000, wallMs: 1_700_000_000_000 + s * 1000 });
const ctx = (s: number, p = policy): Ctx => ({ now: at(s), wallIso: new Date(at(s).wallMs).toISOString(), policy: p });
const work = (o: Partial<Work> & { revision: string }): Work => ({ kind: "osc", checksum: `c-${o.revision}`, base: `b-${o.revision}`, disruption: { units: ["kubelet.service"], paths: [] }, ...o });
const quiet = (revision: string): Work => work({ revision, disruption: { units: [], paths: [] } });

/** Runs events in order (each at its second), returning every state and action. */
function run(start: NodeRollout, events: [number, Event][], p = policy): { state: NodeRollout; actions: Action[] } {
  let state = start;
  const actions: Action[] = [];
  for (const [s, e] of events) {
    const r = step(state, e, ctx(s, p));
    state = r.state;
    actions.push(r.action);
  }
  return { state, actions };
}

describe("admission", () => {
  test("a change that disrupts nothing is applied at once, outside any admission, and is not the last good OSC", () => {
    const r = step(emptyNodeRollout(), { type: "want", work: quiet("r1") }, ctx(0));
    expect(r.action).toEqual({ do: "apply-free" });
    expect(r.state.lastGood).toBeUndefined();
  });

  test("an OSC applied outside any gate is the rollback target only while the node has none (a fresh node's first)", () => {
    const first = step(emptyNodeRollout(), { type: "baseline", checksum: "c0", base: "b0" }, ctx(0)).state;
    expect(first.lastGood).toMatchObject({ checksum: "c0", base: "b0" });
    expect(step(first, { type: "baseline", checksum: "c1", base: "b1" }, ctx(1)).state).toBe(first);
  });

  test("a disruptive change waits for a slot; the grant starts its apply and its timeout", () => {
    const w = work({ revision: "r1" });
    const a = step(emptyNodeRollout(), { type: "want", work: w }, ctx(0));
    expect(a.action).toMatchObject({ do: "hold", reason: "WaitingForSlot" });
    expect(a.state.current).toEqual({ work: w, phase: "waiting" });
    const b = step(a.state, { type: "granted", revision: "r1" }, ctx(5));
    expect(b.action).toEqual({ do: "apply", target: "work" });
    expect(b.state.current).toMatchObject({ phase: "applying", since: at(5) });
  });

  test("a blocker (pause, canary, window) holds the work back before it asks the pool, and withdraws a waiting request", () => {
    const holdBack = { reason: "Paused" as const, message: "paused", retryAfterMs: 60_000 };
    const waiting = step(emptyNodeRollout(), { type: "want", work: work({ revision: "r1" }) }, ctx(0)).state;
    const r = step(waiting, { type: "want", work: work({ revision: "r1" }), holdBack }, ctx(1));
    expect(r.action).toMatchObject({ do: "hold", reason: "Paused" });
    expect(r.state.current).toBeUndefined();
  });

  test("a paused node applies nothing new, not even what disrupts nothing; while it holds a slot its gate goes on", () => {
    const holdBack = { reason: "Paused" as const, message: "paused", retryAfterMs: 60_000 };
    expect(step(emptyNodeRollout(), { type: "want", work: quiet("r1"), holdBack }, ctx(0)).action).toMatchObject({ do: "hold", reason: "Paused" });
    const gating: NodeRollout = { version: 2, current: { work: work({ revision: "r1" }), phase: "gating", since: at(0) } };
    const r = step(gating, { type: "want", work: work({ revision: "r2" }), holdBack }, ctx(1));
    expect(r.action).toMatchObject({ do: "hold", reason: "Paused" });
    expect(r.state).toEqual(gating);
  });

  test("without a budget a disruptive change is applied at once (after its blockers), with no slot and no gate", () => {
    const unpooled = { ...policy, pooled: false };
    expect(step(emptyNodeRollout(), { type: "want", work: work({ revision: "r1" }) }, ctx(0, unpooled))).toEqual({ state: emptyNodeRollout(), action: { do: "apply-free" } });
  });

  test("a change that disrupts nothing is applied without taking the place of another piece of work waiting for its slot", () => {
    const waiting = step(emptyNodeRollout(), { type: "want", work: work({ kind: "restart", revision: "restart/n/x" }) }, ctx(0)).state;
    const r = step(waiting, { type: "want", work: quiet("r2") }, ctx(1));
    expect(r).toEqual({ state: waiting, action: { do: "apply-free" } });
    // The same revision now disrupting nothing (the node got there another way): its request goes.
    const osc = step(emptyNodeRollout(), { type: "want", work: work({ revision: "r3" }) }, ctx(0)).state;
    expect(step(osc, { type: "want", work: quiet("r3") }, ctx(1)).state.current).toBeUndefined();
  });

  test("a grant for another revision than the one waited for changes nothing", () => {
    const waiting = step(emptyNodeRollout(), { type: "want", work: work({ revision: "r2" }) }, ctx(0)).state;
    expect(step(waiting, { type: "granted", revision: "r1" }, ctx(1))).toEqual({ state: waiting, action: { do: "nothing" } });
  });
});

describe("the gate (issue 19 items 2, 3, 8)", () => {
  const admittedState = () => run(emptyNodeRollout(), [[0, { type: "want", work: work({ revision: "r1" }) }], [1, { type: "granted", revision: "r1" }]]).state;

  test("healthy for the settle time after a complete apply: the slot goes back and the OSC is the last good one", () => {
    const r = run(admittedState(), [
      [2, { type: "applied", complete: true }],
      [3, { type: "look", healthy: true }],
      [62, { type: "look", healthy: true }],
      [63, { type: "look", healthy: true }],
    ]);
    expect(r.actions.at(-1)).toMatchObject({ do: "released" });
    expect(r.state.current).toBeUndefined();
    expect(r.state.lastGood).toMatchObject({ checksum: "c-r1", base: "b-r1" });
  });

  test("an unhealthy look starts the settle time over", () => {
    const r = run(admittedState(), [
      [2, { type: "applied", complete: true }],
      [3, { type: "look", healthy: true }],
      [50, { type: "look", healthy: false, check: "Node Ready: False" }],
      [70, { type: "look", healthy: true }],
      [100, { type: "look", healthy: true }],
    ]);
    expect(r.actions.at(-1)).toEqual({ do: "look" });
    expect(r.state.current?.healthySince).toEqual(at(70));
  });

  test("item 2a: an apply that never completes fails its gate at the health timeout (the timeout counts from the grant)", () => {
    const r = run(admittedState(), [
      [10, { type: "applied", complete: false, error: "containerd.service: failed" }],
      [200, { type: "applied", complete: false, error: "containerd.service: failed" }],
      [301, { type: "applied", complete: false, error: "containerd.service: failed" }],
    ]);
    expect(r.actions.map((a) => a.do)).toEqual(["apply", "apply", "look"]);
    expect(r.state.current).toMatchObject({ phase: "failed", recordOwed: { revision: "r1" }, check: "apply: containerd.service: failed" });
  });

  test("item 2b: an interrupted apply is retried under its admission and gated; it is the last good OSC only after the gate", () => {
    const s = admittedState();
    // The agent restarts: it reads the same state and the controller wants the same work again.
    const again = step(s, { type: "want", work: work({ revision: "r1", disruption: { units: [], paths: [] } }) }, ctx(20));
    expect(again.action).toEqual({ do: "apply", target: "work" });
    expect(again.state.current?.work.disruption.units).toEqual(["kubelet.service"]);
    const done = step(again.state, { type: "applied", complete: true }, ctx(21));
    expect(done.state.current?.phase).toBe("gating");
    expect(done.state.lastGood).toBeUndefined();
  });

  test("a machine that boots again starts its settle time over: nobody looked while it was down", () => {
    const s: NodeRollout = { version: 2, current: { work: work({ revision: "r1" }), phase: "gating", since: at(0), healthySince: at(10) } };
    const r = step(s, { type: "look", healthy: true }, { ...ctx(0), now: at(100, "b2") });
    expect(r.action).toEqual({ do: "look" });
    expect(r.state.current?.healthySince).toEqual(at(100, "b2"));
  });

  test("item 8: a crash loop does not start the gate's timeout over (boot clock)", () => {
    const s = run(admittedState(), [[2, { type: "applied", complete: true }]]).state;
    const r = run(s, [
      [100, { type: "look", healthy: false, check: "unit kubelet.service: restarting after a failure (auto-restart)" }],
      [302, { type: "look", healthy: false, check: "unit kubelet.service: restarting after a failure (auto-restart)" }],
    ]);
    expect(r.state.current).toMatchObject({ phase: "failed", recordOwed: { revision: "r1" }, work: { revision: "r1" } });
  });

  test("item 3: a non-disruptive OSC pushed during the settle time is applied under the slot, and the gate then passes", () => {
    const s = run(admittedState(), [[2, { type: "applied", complete: true }], [3, { type: "look", healthy: true }]]).state;
    const r = run(s, [
      [30, { type: "want", work: quiet("r2") }],
      [31, { type: "applied", complete: true }],
      [32, { type: "look", healthy: true }],
      [92, { type: "look", healthy: true }],
    ]);
    expect(r.actions.map((a) => a.do)).toEqual(["apply", "look", "look", "released"]);
    expect(r.state.current).toBeUndefined();
    expect(r.state.lastGood?.checksum).toBe("c-r2");
  });

  test("item 3: the fix for a failed OSC that touches only a file is applied, and the slot goes back once healthy", () => {
    const failed: NodeRollout = { version: 2, current: { work: work({ revision: "r1" }), phase: "failed", since: at(0), check: "probe" } };
    const r = run(failed, [
      [400, { type: "want", work: quiet("r2") }],
      [401, { type: "applied", complete: true }],
      [402, { type: "look", healthy: true }],
      [462, { type: "look", healthy: true }],
    ]);
    expect(r.actions.at(-1)).toMatchObject({ do: "released" });
    expect(r.state.current).toBeUndefined();
  });

  test("the admitted OSC offered again as drift once applied (an agent restart, a Secret annotation changed) is the same work: its gate and timeout go on", () => {
    const w = work({ revision: "r1" });
    const gating: NodeRollout = { version: 2, current: { work: w, phase: "gating", since: at(0) } };
    const r = step(gating, { type: "want", work: { ...w, kind: "drift", disruption: { units: [], paths: [] } } }, ctx(100));
    expect(r.action).toEqual({ do: "look" });
    expect(r.state).toBe(gating);
    const failed = run(gating, [[310, { type: "look", healthy: false, check: "kubelet" }]]);
    expect(failed.state.current).toMatchObject({ phase: "failed", recordOwed: { revision: "r1" }, check: "kubelet" });
  });

  test("a disruptive change pushed during the gate is applied under the same slot, its units added to the gate", () => {
    const s = run(admittedState(), [[2, { type: "applied", complete: true }]]).state;
    const r = step(s, { type: "want", work: work({ revision: "r2", disruption: { units: ["containerd.service"], paths: [] } }) }, ctx(10));
    expect(r.action).toEqual({ do: "apply", target: "work" });
    expect(r.state.current?.work.disruption.units).toEqual(["kubelet.service", "containerd.service"]);
    expect(r.state.current?.since).toEqual(at(10));
  });
});

describe("failure and rollback", () => {
  const gating = (): NodeRollout => ({ version: 2, lastGood: { checksum: "c-r0", base: "b-r0", at: "t" }, current: { work: work({ revision: "r1" }), phase: "gating", since: at(0) } });

  test("failing: the node rolls back under its slot at once, the failure is recorded on the pool, and the rollback's gate passing blocks the change here", () => {
    const r = run(gating(), [
      [301, { type: "look", healthy: false, check: "Node Ready: False" }],
      [302, { type: "failure-recorded" }],
      [310, { type: "applied", complete: true }],
      [311, { type: "look", healthy: true }],
      [371, { type: "look", healthy: true }],
    ]);
    // The failure recorded while the rollback's apply runs: the answer stays "apply the last good OSC".
    expect(r.actions.map((a) => a.do)).toEqual(["apply", "apply", "look", "look", "released"]);
    expect(r.actions[0]).toEqual({ do: "apply", target: "last-good" });
    expect(r.state.blocked).toEqual({ revision: "r1", checksum: "c-r1", check: "Node Ready: False" });
    expect(r.state.lastGood?.checksum).toBe("c-r0");
    expect(step(r.state, { type: "want", work: work({ revision: "r1" }) }, ctx(400)).action).toMatchObject({ do: "hold", reason: "Blocked" });
  });

  test("item 8: a failure not yet on the pool's record (the change cut the node off) does not stop the rollback, but the slot stays until it is recorded", () => {
    const cutOff = run(gating(), [
      [301, { type: "look", healthy: false, check: "the Node as the API server has it: unreachable" }],
      [310, { type: "applied", complete: true }],
      [311, { type: "look", healthy: true }],
      [371, { type: "look", healthy: true }],
      [500, { type: "look", healthy: true }],
    ]);
    expect(cutOff.actions.map((a) => a.do)).toEqual(["apply", "look", "look", "look", "look"]);
    expect(cutOff.state.current).toMatchObject({ phase: "gating", recordOwed: { revision: "r1" }, rollbackTo: { checksum: "c-r0" } });
    // Work pushed meanwhile keeps the debt: the failed change happened whatever comes after it.
    expect(step(cutOff.state, { type: "want", work: work({ revision: "r2" }) }, ctx(501)).state.current?.recordOwed).toMatchObject({ revision: "r1" });
    const back = run(cutOff.state, [
      [502, { type: "failure-recorded" }],
      [503, { type: "look", healthy: true }],
    ]);
    expect(back.actions.map((a) => a.do)).toEqual(["look", "released"]);
    expect(back.state.blocked?.revision).toBe("r1");
  });

  test("a failure the node could not see (cut off, its Node Unknown) is tried once more after the rollback, admitted again: a pass clears it on the pool, a second failure is final", () => {
    const rolledBack = run(gating(), [
      [301, { type: "look", healthy: false, check: "the Node as the API server has it: unreachable", inconclusive: true }],
      [302, { type: "failure-recorded" }],
      [310, { type: "applied", complete: true }],
      [311, { type: "look", healthy: true }],
      [371, { type: "look", healthy: true }],
    ]);
    // Healthy and reachable again on its last good OSC: the slot goes back, and the change is asked for again.
    expect(rolledBack.actions.at(-1)).toMatchObject({ do: "released", passed: { checksum: "c-r0" } });
    expect(rolledBack.state.current).toBeUndefined();
    expect(rolledBack.state.retry).toEqual({ revision: "r1" });
    expect(rolledBack.state.blocked).toBeUndefined();
    const asked = run(rolledBack.state, [[372, { type: "want", work: work({ revision: "r1" }) }]]);
    expect(asked.state.current).toMatchObject({ phase: "waiting", retryOf: "r1" });
    const passed = run(asked.state, [
      [379, { type: "granted", revision: "r1" }],
      [380, { type: "applied", complete: true }],
      [381, { type: "look", healthy: true }],
      [441, { type: "look", healthy: true }],
    ]);
    expect(passed.actions.at(-1)).toMatchObject({ do: "released" });
    expect(passed.state.proveOwed).toMatchObject({ revision: "r1" });
    // Owed until the pool's record has it (an API server out of reach: the next look tries again).
    expect(step(passed.state, { type: "proven" }, ctx(442)).state.proveOwed).toBeUndefined();
    expect(passed.state.lastGood?.checksum).toBe("c-r1");
    expect(passed.state.retry).toBeUndefined();
    const again = run(asked.state, [
      [379, { type: "granted", revision: "r1" }],
      [380, { type: "applied", complete: true }],
      [700, { type: "look", healthy: false, check: "the Node as the API server has it: unreachable", inconclusive: true }],
      [701, { type: "failure-recorded" }],
      [710, { type: "applied", complete: true }],
      [711, { type: "look", healthy: true }],
      [771, { type: "look", healthy: true }],
    ]);
    expect(again.actions.at(-1)).toMatchObject({ do: "released" });
    expect(again.state.proveOwed).toBeUndefined();
    expect(again.state.recorded).toBe("r1");
    expect(again.state.blocked?.revision).toBe("r1");
    expect(again.state.retry).toBeUndefined();
    // A failure the node saw (a unit failed) is final at once.
    const seen = run(gating(), [
      [301, { type: "look", healthy: false, check: "unit kubelet.service: failed" }],
      [302, { type: "failure-recorded" }],
      [310, { type: "applied", complete: true }],
      [311, { type: "look", healthy: true }],
      [371, { type: "look", healthy: true }],
    ]);
    expect(seen.actions.at(-1)).toMatchObject({ do: "released" });
    expect(seen.state.blocked?.revision).toBe("r1");
    expect(seen.state.retry).toBeUndefined();
  });

  test("a retry waits while the node is paused, without a slot and without a timeout, and newer work is the retry (model crash-partition seed 5040: the retry timed out untried under its old slot, and a good change stopped for ever)", () => {
    const holdBack = { reason: "Paused" as const, message: "paused", retryAfterMs: 60_000 };
    const pending: NodeRollout = { ...emptyNodeRollout(), lastGood: { checksum: "c-r0", base: "b-r0", at: "t" }, retry: { revision: "r1" }, recorded: "r1" };
    const paused = run(pending, [[400, { type: "want", work: work({ revision: "r2" }), holdBack }], [4000, { type: "want", work: work({ revision: "r2" }), holdBack }]]);
    expect(paused.actions.map((a) => a.do)).toEqual(["hold", "hold"]);
    expect(paused.state.current).toBeUndefined();
    expect(paused.state.retry).toEqual({ revision: "r1" });
    const resumed = run(paused.state, [
      [4001, { type: "want", work: work({ revision: "r2" }) }],
      [4002, { type: "granted", revision: "r2" }],
      [4003, { type: "applied", complete: true }],
      [4004, { type: "look", healthy: true }],
      [4064, { type: "look", healthy: true }],
    ]);
    expect(resumed.actions.at(-1)).toMatchObject({ do: "released", passed: { revision: "r2" } });
    expect(resumed.state.proveOwed).toMatchObject({ revision: "r1" });
    expect(resumed.state.retry).toBeUndefined();
    expect(resumed.state.recorded).toBeUndefined();
  });

  test("without rollback, a failure the node could not see is judged on: healthy on the change for the settle time passes it late and clears it; newer work under the slot that passes proves what it runs (model crash-partition seeds 5012, 5063)", () => {
    const noRollback = { ...policy, rollback: false };
    const failed = run(gating(), [[301, { type: "look", healthy: false, check: "the Node as the API server has it: unreachable", inconclusive: true }], [302, { type: "failure-recorded" }]], noRollback);
    expect(failed.state.current).toMatchObject({ phase: "failed", retryable: true });
    const late = run(failed.state, [[310, { type: "look", healthy: true }], [370, { type: "look", healthy: true }]], noRollback);
    expect(late.actions.at(-1)).toMatchObject({ do: "released" });
    expect(late.state.proveOwed).toMatchObject({ revision: "r1" });
    expect(late.state.lastGood?.checksum).toBe("c-r1");
    const newer = run(failed.state, [[303, { type: "want", work: work({ revision: "r2", carries: ["k@2"] }) }], [304, { type: "applied", complete: true }], [305, { type: "look", healthy: true }], [365, { type: "look", healthy: true }]], noRollback);
    expect(newer.actions.at(-1)).toMatchObject({ do: "released", passed: { revision: "r2" } });
    expect(newer.state.proveOwed).toEqual({ revision: "r1", proven: ["k@2"] });
    // A failure the node saw stays final without rollback too.
    const seen = run(gating(), [[301, { type: "look", healthy: false, check: "unit kubelet.service: failed" }], [302, { type: "failure-recorded" }], [310, { type: "look", healthy: true }], [370, { type: "look", healthy: true }]], noRollback);
    expect(seen.state.proveOwed).toBeUndefined();
    expect(seen.state.blocked?.revision).toBe("r1");
  });

  test("item 8: a failure recorded late names the work that failed, not newer work applied under the slot meanwhile (model crash-partition seed 5025: a good change stopped)", () => {
    const owed = run(gating(), [[301, { type: "look", healthy: false, check: "unit kubelet.service: failed" }], [302, { type: "applied", complete: true }]]);
    expect(owed.state.current?.recordOwed).toEqual({ revision: "r1", failure: "unit kubelet.service: failed", changes: [] });
    const fixed = step(owed.state, { type: "want", work: work({ revision: "r2", changes: ["x"] }) }, ctx(303)).state;
    expect(fixed.current).toMatchObject({ work: { revision: "r2" }, recordOwed: { revision: "r1" } });
  });

  test("a gate admitted under the Secret's settings keeps them (an agent restarted without the Secret judges by them)", () => {
    const s = run(emptyNodeRollout(), [[0, { type: "want", work: work({ revision: "r1" }) }], [1, { type: "granted", revision: "r1" }]], { ...policy, settleMs: 5_000 }).state;
    expect(s.current?.gate).toEqual({ settleMs: 5_000, healthTimeoutMs: 300_000, rollback: true, probeTimeoutMs: 10_000 });
  });

  test("without rollback the node keeps its slot until it is healthy again on its own", () => {
    const noRollback = { ...policy, rollback: false };
    const r = run(gating(), [
      [301, { type: "look", healthy: false, check: "x" }],
      [302, { type: "failure-recorded" }],
      [303, { type: "want", work: work({ revision: "r1" }) }],
      [400, { type: "look", healthy: true }],
      [460, { type: "look", healthy: true }],
    ], noRollback);
    expect(r.actions.map((a) => a.do)).toEqual(["look", "look", "hold", "look", "released"]);
    expect(r.state.blocked?.revision).toBe("r1");
  });

  test("a requested restart that fails its gate is not the pool's to stop: no failure record", () => {
    const s: NodeRollout = { version: 2, current: { work: work({ kind: "restart", revision: "restart/x" }), phase: "gating", since: at(0) } };
    const r = step(s, { type: "look", healthy: false, check: "x" }, ctx(301));
    expect(r.action).toEqual({ do: "look" });
    expect(r.state.current?.phase).toBe("failed");
  });

  test("the late end of the failed work's apply is not taken for the rollback's", () => {
    const rolling = run(gating(), [
      [301, { type: "look", healthy: false, check: "x" }],
      [302, { type: "failure-recorded" }],
    ]).state;
    expect(step(rolling, { type: "applied", complete: true, checksum: "c-r1" }, ctx(303)).state).toEqual(rolling);
    expect(step(rolling, { type: "applied", complete: true, checksum: "c-r0" }, ctx(303)).state.current?.phase).toBe("gating");
  });

  test("a failed rollback ends failed, the slot kept", () => {
    const r = run(gating(), [
      [301, { type: "look", healthy: false, check: "x" }],
      [302, { type: "failure-recorded" }],
      [310, { type: "applied", complete: true }],
      [700, { type: "look", healthy: false, check: "y" }],
    ]);
    expect(r.state.current).toMatchObject({ phase: "failed", check: "y (after rolling back)" });
  });

  test("a slot freed by an operator ends the work", () => {
    expect(step(gating(), { type: "slot-lost" }, ctx(1)).state.current).toBeUndefined();
  });
});

describe("the pool's decisions", () => {
  const t = (node: string, revision?: string, since = "2026-01-01T00:00:00Z", grant?: string): Ticket => ({ node, ...(revision ? { request: { revision, reason: "osc", since } } : {}), ...(grant ? { grant: { revision: grant, at: since } } : {}) });
  const tickets = (...ts: Ticket[]) => new Map(ts.map((x) => [x.node, x]));

  test("admits the oldest requests while fewer than k hold", () => {
    const rec: PoolRecord = { holders: [{ node: "a", revision: "r1", since: "t" }] };
    const d = decide(rec, tickets(t("a", "r1"), t("b", "r1", "2026-01-01T00:00:02Z"), t("c", "r1", "2026-01-01T00:00:01Z"), t("d")), 2);
    expect(d).toEqual({ admit: [t("c", "r1", "2026-01-01T00:00:01Z")], drop: [] });
  });

  test("item 1: a holder whose ticket went (its Node deleted in its gate) stops its revision as failed; a failure recorded for it stays; a restart's never stops the pool", () => {
    const rec: PoolRecord = { holders: [{ node: "a", revision: "r1", since: "t" }] };
    const lost = withLostHolders(rec, tickets(t("b", "r1")), "now", () => undefined);
    expect(lost.failed).toMatchObject({ revision: "r1", node: "a", at: "now" });
    expect(decide(lost, tickets(t("b", "r1"), t("c", "r2")), 1)).toEqual({ admit: [t("c", "r2")], drop: ["a"] });
    expect(stopsOwed(lost, tickets(t("b", "r1")))).toEqual([t("b", "r1")]);
    const same: PoolRecord = { ...rec, failed: { revision: "r1", node: "x", failure: "Node Ready: False", at: "t" } };
    expect(withLostHolders(same, tickets(), "now", () => undefined)).toBe(same);
    const older: PoolRecord = { ...rec, failed: { revision: "r0", node: "x", failure: "y", at: "t" } };
    expect(withLostHolders(older, tickets(), "now", () => undefined).failed).toMatchObject({ revision: "r1", node: "a" });
    expect(withLostHolders(rec, tickets(t("a")), "now", () => undefined)).toBe(rec); // gave back, asks nothing: not lost
    const restart: PoolRecord = { holders: [{ node: "a", revision: workRevision("restart", "a", "h"), since: "t" }] };
    expect(withLostHolders(restart, tickets(), "now", () => undefined)).toBe(restart);
  });

  test("a leader's view behind another leader's admission drops nobody: a holder is dropped on its ticket read fresh", () => {
    const rec: PoolRecord = { holders: [{ node: "a", revision: "r1", since: "t" }, { node: "b", revision: "r1", since: "t" }] };
    const watched = tickets(t("a"), t("c", "r1")); // a's request and b's ticket not seen yet
    expect(dropCandidates(rec, watched)).toEqual(["a", "b"]);
    const unread = holderView(rec, watched, new Map());
    expect(decide(rec, unread, 2)).toEqual({ admit: [], drop: [] });
    expect(withLostHolders(rec, unread, "now", () => undefined)).toBe(rec);
    const read = holderView(rec, watched, new Map([["a", t("a")], ["b", null]]));
    expect(decide(rec, read, 2).drop).toEqual(["a", "b"]);
    expect(withLostHolders(rec, read, "now", () => undefined).failed).toMatchObject({ revision: "r1", node: "b" });
  });

  test("a failure stops the revision that failed and any work that would bring a node one of its changes no node proved since; the node that failed is where they are proven", () => {
    // The failed admission applied two pieces: app v1, then (pushed during its gate) kubelet v2.
    const failed = { revision: "r1", node: "a", failure: "x", at: "t", changes: [["app@v1"], ["kubelet@v2", "conf@f1"]] };
    const rec: PoolRecord = { holders: [], failed };
    expect(stops(failed, "r1", undefined)).toBe(true);
    expect(stops(failed, "r2", ["app@v1", "conf@f7"])).toBe(true);
    // A "fix" that changes one part but brings another (model holder-death seed 5192: the part it kept was
    // the bad one, and it reached a third node with k = 2), and a node that runs part of a piece already
    // and would get the rest (holder-death seed 5058).
    expect(stops(failed, "r3", ["app@v2", "kubelet@v2", "conf@f7"])).toBe(true);
    expect(stops(failed, "r5", ["conf@f1", "app@v2"])).toBe(true);
    // Nothing suspect: the change is gone from the revision, or the node runs it already.
    expect(stops(failed, "r6", ["app@v2", "kubelet@v3", "conf@f7"])).toBe(false);
    expect(stops({ ...failed, changes: [[]] }, "r2", ["app@v1"])).toBe(false);
    // The node that failed is not stopped by its own failure (it ran all of it): a fix proves itself there.
    expect(stopsRequest(failed, { node: "a", request: { revision: "r3", reason: "osc", since: "t", changes: ["app@v2", "kubelet@v2"] } })).toBe(false);
    expect(stopsRequest(failed, { node: "b", request: { revision: "r3", reason: "osc", since: "t", changes: ["app@v2", "kubelet@v2"] } })).toBe(true);
    // Once the fix passed there, what it runs is proven: kubelet v2 and the conf no longer stop anything.
    const proven = provenFailure(failed, ["app@v2", "kubelet@v2", "conf@f1"]);
    expect(proven?.changes).toEqual([["app@v1"]]);
    expect(stops(proven, "r3", ["app@v2", "kubelet@v2", "conf@f7"])).toBe(false);
    const carrying: Ticket = { node: "b", request: { revision: "r2", reason: "osc", since: "t", changes: ["app@v1", "conf@f7"] } };
    const fix: Ticket = { node: "c", request: { revision: "r3", reason: "osc", since: "t", changes: ["app@v2"] } };
    expect(decide(rec, tickets(carrying, fix), 2).admit).toEqual([fix]);
    expect(stopsOwed(rec, tickets(carrying, fix))).toEqual([carrying]);
    // A holder lost in its gate stops what it held its slot for (its entry's pieces), else what its ticket last asked.
    const asked = (): Ticket => ({ node: "d", request: { revision: "r4", reason: "osc", since: "t", changes: ["kubelet@v9"] }, grant: { revision: "r4", at: "t" } });
    expect(withLostHolders({ holders: [{ node: "d", revision: "r4", since: "t" }] }, tickets(), "now", asked).failed?.changes).toEqual([["kubelet@v9"]]);
    expect(withLostHolders({ holders: [{ node: "d", revision: "r4", since: "t", changes: [["app@v1"], ["kubelet@v9"]] }] }, tickets(), "now", asked).failed?.changes).toEqual([["app@v1"], ["kubelet@v9"]]);
    // A holder whose ticket went before it showed the grant of its admission never heard of it (the leader
    // admitted it on a watch behind the deletion): dropped, not lost (model holder-death seed 6307).
    const untold = (): Ticket => ({ node: "d", request: { revision: "r4", reason: "osc", since: "t0" } });
    const admittedLate: PoolRecord = { holders: [{ node: "d", revision: "r4", since: "t" }] };
    expect(withLostHolders(admittedLate, tickets(), "now", untold)).toBe(admittedLate);
    expect(decide(admittedLate, tickets(), 1).drop).toEqual(["d"]);
    // A move under the slot adds its piece.
    const moved = movesOwed({ holders: [{ node: "e", revision: "r1", since: "t", changes: [["app@v1"]] }] }, tickets({ node: "e", request: { revision: "r5", reason: "osc", since: "t", changes: ["kubelet@v2"] } }));
    expect(moved[0]?.changes).toEqual([["app@v1"], ["kubelet@v2"]]);
  });

  test("the record's shards: each has its fixed share of k (the first 32 in shard 0, …), and any smaller k fills a prefix of a larger k's shares", () => {
    for (const k of [1, 31, 32, 33, 64, 500, 5000]) {
      const shares = Array.from({ length: shardsFor(k) + 2 }, (_, i) => shardSlots(i, k));
      expect(shares.reduce((a, b) => a + b, 0)).toBe(k);
      expect(shares.every((n) => n <= shardCapacity)).toBe(true);
      for (const smaller of [1, Math.floor(k / 2), k - 1]) shares.forEach((n, i) => expect(shardSlots(i, smaller)).toBeLessThanOrEqual(n));
    }
    expect(shardsFor(500)).toBe(16);
    expect([shardOf("p", "p-slots"), shardOf("p", "p-slots-3"), shardOf("p", "p-slots-03"), shardOf("p", "p-slots-x"), shardOf("p", "q-slots-1")]).toEqual([0, 3, undefined, undefined, undefined]);
    expect(shardLeaseName("p", 0)).toBe("p-slots");
    expect(shardLeaseName("p", 2)).toBe("p-slots-2");
  });

  test("item 5: holders beyond k (k lowered, pool shrunk) admit nobody", () => {
    const rec: PoolRecord = { holders: ["a", "b", "c"].map((node) => ({ node, revision: "r1", since: "t" })) };
    expect(decide(rec, tickets(t("a", "r1"), t("b", "r1"), t("c", "r1"), t("d", "r1")), 2).admit).toEqual([]);
  });

  test("item 1: a holder is dropped only when its ticket is gone (Node deleted) or asks for nothing, never for looking dead", () => {
    const rec: PoolRecord = { holders: [{ node: "a", revision: "r1", since: "t" }, { node: "b", revision: "r1", since: "t" }] };
    expect(decide(rec, tickets(t("a", "r1"), t("b")), 1).drop).toEqual(["b"]);
    expect(decide(rec, tickets(t("a", "r1"), t("c", "r1")), 2)).toEqual({ admit: [t("c", "r1")], drop: ["b"] });
  });

  test("item 4: a revision that failed is admitted nowhere, whatever a node's overlays; others are told", () => {
    const rec: PoolRecord = { holders: [{ node: "a", revision: "r1", since: "t" }], failed: { revision: "r1", node: "a", failure: "x", at: "t" } };
    const ts = tickets(t("a", "r1"), t("b", "r1"), t("c", "r2"));
    expect(decide(rec, ts, 3).admit.map((x) => x.node)).toEqual(["c"]);
    expect(stopsOwed(rec, ts).map((x) => x.node)).toEqual(["b"]);
  });

  test("the node that failed is admitted although its failure stops the revision for every other node (a retry, or a fix that carries suspect changes)", () => {
    // r2 carries the change that failed (with r1) on a.
    const failedPieces: PoolRecord = { holders: [], failed: { revision: "r1", node: "a", failure: "x", at: "t", changes: [["k@1"]] } };
    const asks = (node: string): Ticket => ({ node, request: { revision: "r2", reason: "osc", since: "t", changes: ["k@1"] } });
    const ts = tickets(asks("a"), asks("b"), t("c", "r1"));
    expect(decide(failedPieces, ts, 3).admit.map((x) => x.node)).toEqual(["a"]);
    expect(stopsOwed(failedPieces, ts).map((x) => x.node)).toEqual(["b", "c"]);
  });

  test("work that passed on the node that failed proves what of the failure it runs now: those changes leave the record, one newer work replaced stays (model crash-partition seed 5063)", () => {
    const failed = { revision: "r1", node: "a", failure: "x", at: "t", changes: [["kubelet@v1"], ["containerd@v2", "app@v1"]] };
    expect(provenFailure(failed, ["kubelet@v1", "containerd@v4", "app@v1"])).toEqual({ ...failed, changes: [["containerd@v2"]] });
    expect(provenFailure(failed, ["kubelet@v1", "containerd@v2", "app@v1"])).toBeUndefined();
    expect(provenFailure(failed)).toBeUndefined();
  });

  test("a holder whose ticket asks for another revision (admitted on a request it had replaced) moves on to it and is granted it; never on to a failed one", () => {
    const record: PoolRecord = { holders: [{ node: "a", revision: "r1", since: "t0" }], failed: { revision: "r3", node: "c", failure: "x", at: "t1" } };
    expect(movesOwed(record, tickets(t("a", "r2")))).toEqual([{ node: "a", revision: "r2", since: "t0" }]);
    expect(grantsOwed(withHolder(record, "a", "r2", "t2"), tickets(t("a", "r2")))).toEqual([{ node: "a", revision: "r2", since: "t0" }]);
    expect(movesOwed(record, tickets(t("a", "r1")))).toEqual([]);
    expect(movesOwed(record, tickets(t("a", "r3")))).toEqual([]);
  });

  test("a grant lost between the record and the ticket is owed again; so is one of an earlier admission (its time is the holder's since)", () => {
    const rec = withHolder({ holders: [] }, "a", "r1", "2026-01-01T00:00:00Z");
    expect(grantsOwed(rec, tickets(t("a", "r1")))).toEqual([{ node: "a", revision: "r1", since: "2026-01-01T00:00:00Z" }]);
    expect(grantsOwed(rec, tickets(t("a", "r1", undefined, "r1")))).toEqual([]);
    // A grant the node could not confirm (another leader's, whose admission the record lost): the new one differs.
    expect(grantsOwed(rec, tickets(t("a", "r1", "2025-12-31T00:00:00Z", "r1")))).toHaveLength(1);
    expect(admitted(t("a", "r1", undefined, "r1"))).toBe(true);
    expect(admitted({ ...t("a", "r1"), grant: { revision: "r1", at: "t", stopped: "failed elsewhere" } })).toBe(false);
  });

  test("item 8: a count budget above the pool's size is the pool's size, not a refusal; a percentage is rounded down, at least 1", () => {
    expect(budgetSlots({ text: "5", count: 5 }, 3)).toBe(3);
    expect(budgetSlots({ text: "5", count: 5 }, 0)).toBe(1);
    expect(budgetSlots({ text: "10%", percent: 10 }, 29)).toBe(2);
    expect(budgetSlots({ text: "10%", percent: 10 }, 5)).toBe(1);
  });

  test("the record round-trips through its annotations; an unreadable one is an error, never an empty pool", () => {
    const rec: PoolRecord = { holders: [{ node: "a", revision: "r1", since: "t" }], failed: { revision: "r0", node: "b", failure: "x", at: "t" }, poolSize: 7 };
    const annotations = Object.fromEntries(Object.entries(encodePool(rec)).filter((e): e is [string, string] => e[1] !== null));
    expect(decodePool(annotations, "Lease x")).toEqual({ ok: true, value: rec });
    const bad = decodePool({ "rollout.trellis.dev/holders": "[{" }, "Lease x");
    expect(bad.ok).toBe(false);
    if (!bad.ok) expect(bad.errors[0]).toContain("Lease x: annotation rollout.trellis.dev/holders: not JSON");
  });
});
