// The node's side of a fleet rollout: the one writer of its rollout state (src/rollout/machine.ts, kept in
// rollout.json), its ticket and slot on the pool (src/kube/pool-leases.ts), standing as the pool's leader
// while it waits (src/kube/pool-leader.ts), and the health gate's looks. The controllers that disrupt the
// node (OSC updates, requested restarts, drift repair) `offer` their work and do what the answer says; this
// controller tells them (`onChange`) when the answer may have changed: a grant, a failed gate to roll back.
//
// Every event is stepped, saved and acted on inside one serializer, so no two read-modify-writes of the
// state interleave; what the state implies on the pool (a request on the ticket, a slot given back) is
// done after it was saved, and done again after a crash, from the state.
import type { V1Lease, V1Node } from "@kubernetes/client-node";
import { lastGoodOscPath, NodeRolloutSchema, rolloutStatePath } from "../../api/rollout-state.ts";
import type { RolloutSettings } from "../../api/rollout.ts";
import { type BootClockReading, elapsedBetween, readBootClock } from "../../host/boot-clock.ts";
import { coreV1 } from "../../kube/api.ts";
import { jsonStore } from "../../host/json-store.ts";
import { paths } from "../../api/paths.ts";
import { type LeaseApi, leaseApi, type LeaseWatch } from "../../kube/lease-api.ts";
import { type PoolLeader, startPoolLeader } from "../../kube/pool-leader.ts";
import { type PoolMember, poolMember, readTicket } from "../../kube/pool-leases.ts";
import { describeError } from "../../log.ts";
import { every, later, type Loop, serializer } from "../../loops.ts";
import { holdBack } from "../../rollout/hold-back.ts";
import { type Action, type Ctx, emptyNodeRollout, type Event, type Gate, type GatePolicy, type HoldBack, type NodeRollout, type OwedFailure, step, type Work } from "../../rollout/machine.ts";
import { admitted, stopsRequest, type Ticket } from "../../rollout/pool.ts";
import { monotonicMs } from "../../time.ts";
import { checkHealth, type GateVerdict } from "../health-gate.ts";
import type { OscWorkDeps } from "../types.ts";
import { createRolloutReporter } from "./report.ts";

export { rolloutConditionType } from "./report.ts";

/** The pool's Secret as the OSC controller sees it now. */
export type PoolContext = { secretUid: string; settings: RolloutSettings };

/** What a controller does about its work now. */
export type Decision =
  | { do: "apply"; target: "work" | "last-good" }
  | { do: "hold"; reason: string; message: string; retryAfterMs: number }
  /** Nothing to apply: the work is admitted and applied, and its gate runs here (or it is done). */
  | { do: "wait" };

export type Rollout = {
  observe(pool: PoolContext): void;
  current(): PoolContext | undefined;
  /** Whether `work` may be applied now (and what to apply: a rollback may come first). */
  offer(work: Work): Promise<Decision>;
  /** An apply done on `offer`'s word ended. */
  applied(outcome: { complete: boolean; error?: string; checksum: string }): Promise<Decision>;
  /** An OSC applied outside any admission: the rollback target while the node has none. */
  baseline(applied: { checksum: string; base: string }): Promise<void>;
  /** The node's rollout state as saved. */
  state(): Promise<NodeRollout>;
  /** Whether the pool's leader said `revision` failed its gate elsewhere while this node waited for it (it waits in vain). */
  stopped(revision: string): boolean;
  /**
   * What the rollout asks of the OSC controller by itself, whatever the Secret says: a rollback to apply
   * (a gate that failed after an agent restart, before the Secret could be read again). Else "wait".
   */
  pending(): Promise<Decision>;
  /** The last good OSC's bytes, for a rollback. */
  lastGood(): Promise<{ checksum: string; base: string; osc: Uint8Array } | undefined>;
  /** Called when a decision may have changed (a grant arrived, a gate failed and the node rolls back). */
  onChange(listener: () => void): () => void;
  stop(): Promise<void>;
};

/** The gate the Secret's rollout settings ask for. */
function policyOf(settings: RolloutSettings): GatePolicy {
  const { settleMs, healthTimeoutMs, rollback, probe, probeTimeoutMs } = settings;
  return { pooled: settings.budget !== undefined, settleMs, healthTimeoutMs, rollback, probeTimeoutMs, ...(probe ? { probe } : {}) };
}

/** How soon a change of the node's ticket whose handling failed is read and handled again. */
const ticketRetryMs = 5_000;

export type RolloutDeps = OscWorkDeps & {
  stuckThresholdMs: number;
  /** The pool's Leases (default: the API server's, in kube-system). */
  leases?: LeaseApi;
  /** The boot clock every gate is timed by (default: /proc). */
  bootClock?: () => BootClockReading;
  /** Monotonic ms, for the leader's view of its Lease. */
  clock?: () => number;
  wallNow?: () => Date;
  /** How often a running gate looks at the node. */
  lookEveryMs?: number;
  /** Holders per record shard (src/rollout/pool.ts shardCapacity; the model checks the protocol with fewer). */
  shardCapacity?: number;
};

export function startRollout(deps: RolloutDeps): Rollout {
  const log = deps.log.with({ controller: "rollout" });
  const bootClock = deps.bootClock ?? readBootClock;
  const wallNow = deps.wallNow ?? (() => new Date());
  const api = deps.leases ?? leaseApi(deps.kube, "kube-system", log);
  const store = jsonStore(deps.files, rolloutStatePath, NodeRolloutSchema, emptyNodeRollout);
  const writer = serializer();
  const report = createRolloutReporter({ ...deps, log });
  const listeners = new Set<() => void>();
  let cached: NodeRollout | undefined;
  let pool: PoolContext | undefined;
  // `shown`: what the pool was last made to show of this node (undefined: not yet since the agent started).
  let membership: { member: PoolMember; leader: PoolLeader; ticket?: LeaseWatch; key: string; shown?: string } | undefined;
  let stopped = false;
  // The reporting of steps (conditions, events) and a failure's write to the pool, each off the serializer.
  let reporting: Promise<void> = Promise.resolve();
  let recording: Promise<void> | undefined;
  let proving: Promise<void> | undefined;
  // Revisions the leader said failed their gate elsewhere while this node waited for them (until one is granted).
  const stoppedOnPool = new Set<string>();

  const changed = () => {
    for (const l of listeners) l();
  };

  async function load(): Promise<NodeRollout> {
    cached ??= await store.read();
    return cached;
  }

  /**
   * The gate the node judges itself by: the Secret's settings as last read, or — after an agent restart that
   * could not read the Secret yet — those its current work was admitted under (undefined: neither).
   */
  const gateFor = (settings: RolloutSettings | undefined, s: NodeRollout): GatePolicy | undefined => {
    if (settings) return policyOf(settings);
    const gate = s.current?.gate;
    return gate && { ...gate, pooled: true };
  };

  const ctx = (policy: Ctx["policy"]): Ctx => {
    const now = bootClock();
    return { now, wallIso: new Date(now.wallMs).toISOString(), policy };
  };

  /** Steps `e`, saves the state, makes the pool match it and carries out what needs no other controller. */
  async function drive(e: Event, settings: RolloutSettings | undefined): Promise<Action> {
    let event: Event | undefined = e;
    let action: Action = { do: "nothing" };
    let tell = false;
    while (event) {
      const before = await load();
      const policy = gateFor(settings, before);
      if (!policy) return action;
      const r = step(before, event, ctx(policy));
      if (r.state !== before) {
        await store.write(r.state);
        cached = r.state;
      }
      // The bytes follow the state at once: a rollback must find them whatever fails next (the pool out of reach).
      if (r.state.lastGood !== before.lastGood) await keepLastGood(r.state);
      // Reported in the reporter's own order, not awaited: a node cut off from the API server (its change broke
      // the network) would otherwise wait out a timeout per condition and event before it rolls back.
      reporting = reporting.then(() => report.transition(before, r.state, r.action)).catch((err: unknown) => log.warn("could not report the rollout's step", { error: describeError(err) }));
      // When the node starts rolling back, and when its gate is over (work held back behind it goes now).
      tell ||= (r.state.current?.phase === "rolling-back" && before.current?.phase !== "rolling-back") || r.action.do === "released";
      action = r.action;
      event = await syncPool(r.state);
    }
    // Told once on each such step: the OSC controller's offers while the node rolls back get the same answer,
    // and telling it again at each would have it offer again at once, round and round.
    if (tell) changed();
    return action;
  }

  const nodeName = () => deps.node.current()?.metadata?.name ?? "";

  /** The pool membership for the current Secret and Node (recreated when either changes). */
  function member(): typeof membership {
    const node = deps.node.current();
    const name = node?.metadata?.name;
    const uid = node?.metadata?.uid;
    if (!pool || !name || !uid || !pool.settings.budget) return undefined;
    const key = `${pool.secretUid}/${uid}`;
    if (membership?.key === key) return membership;
    void membership?.leader.stop();
    void membership?.ticket?.stop();
    const ref = { secret: { name: deps.secretName, uid: pool.secretUid }, node: { name, uid } };
    const m = poolMember(api, ref, deps.shardCapacity);
    const leader = startPoolLeader({ api, ref, log, budget: () => pool?.settings.budget, clock: deps.clock ?? monotonicMs, wallNow, ...(deps.shardCapacity ? { shardCapacity: deps.shardCapacity } : {}) });
    membership = { member: m, leader, key };
    return membership;
  }

  /**
   * Makes the pool show what the state says: the request while waiting or holding, nothing once done (the
   * slot given back). Only on a change of that, so a running gate's looks cost the API server nothing.
   */
  async function syncPool(s: NodeRollout): Promise<Event | undefined> {
    const m = member();
    if (!m) return undefined;
    const cur = s.current;
    const shown = cur ? `${cur.phase === "waiting" ? "waiting" : "holding"}/${cur.work.revision}` : "idle";
    if (m.shown !== shown) {
      const lost = await showOnPool(m, s);
      if (lost) return lost;
      m.shown = shown;
    }
    if (cur?.recordOwed) recordFailure(m.member, cur.recordOwed);
    if (s.proveOwed) proveFailure(m.member, s.proveOwed);
    return undefined;
  }

  /** The node's request (or none) on its ticket, and whether it may still hold what it remembers holding. */
  async function showOnPool(m: NonNullable<typeof membership>, s: NodeRollout): Promise<Event | undefined> {
    const cur = s.current;
    // Whether the record may still show a slot this node's state has given up, for work before what it waits for now.
    let leftover = m.shown?.startsWith("holding/") === true && cur?.phase === "waiting";
    if (m.shown === undefined) {
      await m.member.ensureTicket();
      const held = cur && (await m.member.holding());
      // A slot this node held before its agent stopped may have been freed meanwhile (an operator deleted its
      // ticket): the record decides, not what this node remembers.
      if (cur && cur.phase !== "waiting" && held === undefined) {
        log.warn("the pool's record no longer shows this node's slot: it was freed while the agent was away", { revision: cur.work.revision });
        return { type: "slot-lost" };
      }
      // The agent stopped between saving that its gate was over and giving the slot back.
      leftover = cur?.phase === "waiting" && held !== undefined && held.revision !== cur.work.revision;
    }
    // Given back before the node asks again: asking on the same ticket would look to the leader like new work
    // under the slot, which it moves the slot on to, and which for a stopped revision keeps the slot for ever.
    if (leftover) {
      log.info("gives back the slot the pool's record still shows for its last work before it asks for new work", { revision: cur?.work.revision });
      await m.member.release();
    }
    if (cur) watchTicket(m, await m.member.request({ revision: cur.work.revision, reason: cur.work.kind, since: wallNow().toISOString(), ...(cur.work.changes ? { changes: cur.work.changes } : {}) }));
    else {
      await m.member.release();
      // Nothing to wait or hold for: the ticket is not watched (a node without a rollout costs the API server nothing).
      // Not awaited: this may run inside that watch's own handler (a grant, a deleted ticket), which its stop waits for.
      void m.ticket?.stop();
      m.ticket = undefined;
    }
    m.leader.campaign(cur?.phase === "waiting");
    return undefined;
  }

  /**
   * Takes what this node proved of its failure off the pool's record, beside the serializer as a failure's
   * write is; out of reach, at a later look (the state owes it until the record has it).
   */
  function proveFailure(member: PoolMember, owed: NonNullable<NodeRollout["proveOwed"]>): void {
    if (proving) return;
    proving = member
      .clearFailure(owed.revision, owed.proven)
      .then(() => {
        log.info("work passed its gate after this node's failure: what of the failure it runs now is taken off the pool's record", { revision: owed.revision });
        return writer.run(() => drive({ type: "proven" }, pool?.settings)).then(() => undefined);
      })
      .catch((err: unknown) => log.warn("could not take what this node proved off the pool's record yet; trying again", { revision: owed.revision, error: describeError(err) }))
      .finally(() => {
        proving = undefined;
      });
  }

  /**
   * Writes the failure on the pool's record, beside the state's serializer: the node rolls back meanwhile
   * (its change may have cut it off, and a write out of reach takes a timeout), and keeps its slot until the
   * record has it. Out of reach, it is written at a later look.
   */
  function recordFailure(member: PoolMember, owed: OwedFailure): void {
    if (recording) return;
    const failure = { ...owed, node: nodeName(), at: wallNow().toISOString() };
    recording = member
      .recordFailure(failure)
      .then(() => writer.run(() => drive({ type: "failure-recorded" }, pool?.settings)).then(() => undefined))
      .catch((err: unknown) => log.warn("could not record the failed gate on the pool's record yet; the node keeps its slot until it does", { revision: failure.revision, error: describeError(err) }))
      .finally(() => {
        recording = undefined;
      });
  }

  /** While the node waits, its ticket is watched for the grant; a ticket deleted under a holder frees it. */
  function watchTicket(m: NonNullable<typeof membership>, ticket: Ticket | undefined): void {
    if (m.ticket || !ticket) return;
    m.ticket = api.watch({ name: m.member.ticketName }, (e) => onTicket(m, e.type === "DELETED" ? undefined : (e.object as V1Lease)));
  }

  // The watch hands each change of the ticket over once: a grant whose handling failed (the record out of reach
  // to check it) would be lost, and the node would wait for ever with its slot taken. Read again until handled.
  const ticketRetry = later(() => {
    const m = membership;
    if (!m?.ticket || stopped) return;
    void api.get(m.member.ticketName).then(
      (lease) => onTicket(m, lease),
      () => ticketRetry.in(ticketRetryMs),
    );
  });

  /** The node's ticket as it is now (undefined: deleted). */
  async function onTicket(m: NonNullable<typeof membership>, lease: V1Lease | undefined): Promise<void> {
    const settings = pool?.settings;
    if (!settings || stopped) return;
    const t = lease ? readTicket(lease, `Lease kube-system/${m.member.ticketName}`) : undefined;
    await writer.run(async () => {
      const cur = (await load()).current;
      if (!cur) return;
      if (cur.phase === "waiting" && admitted(t) && t?.grant?.revision === cur.work.revision) {
        // The record decides, not the ticket: any agent of the pool may write a grant, only an admission is counted.
        const holding = await m.member.holding(t?.grant?.shard ?? 0);
        if (holding?.revision !== cur.work.revision) return log.warn("a grant on the ticket that the pool's record does not show: ignored", { ticket: m.member.ticketName, revision: cur.work.revision });
        stoppedOnPool.delete(cur.work.revision);
        await drive({ type: "granted", revision: cur.work.revision }, settings);
        changed();
      } else if (cur.phase !== "waiting" && admitted(t) && t?.grant?.revision !== cur.work.revision) {
        // The leader moved this node's slot on to the newer work it asked for: offered again, it is applied.
        changed();
      } else if (cur.phase === "waiting" && t?.grant?.stopped && t.grant.revision === cur.work.revision) {
        stoppedOnPool.add(cur.work.revision);
        await report.stopped(cur.work, t.grant.stopped);
      } else if (!lease && cur.phase !== "waiting") {
        log.warn("the node's ticket was deleted while it held a slot: the slot is freed", { ticket: m.member.ticketName });
        await drive({ type: "slot-lost" }, settings);
      }
    }).catch((err: unknown) => {
      log.warn("handling the ticket's change failed; reading it again", { error: describeError(err) });
      ticketRetry.in(ticketRetryMs);
    });
  }

  async function keepLastGood(s: NodeRollout): Promise<void> {
    // The OSC that passed is the last one applied: its bytes are trellis's copy of it.
    const applied = (await deps.store.read()).lastApplied?.checksum;
    if (!s.lastGood || applied !== s.lastGood.checksum) return;
    const bytes = await deps.files.read(paths.appliedOsc);
    if (bytes) await deps.files.writeAtomic(lastGoodOscPath, bytes, 0o600);
  }

  // The gate's looks run here, whoever applied the work.
  const looks: Loop = every(deps.lookEveryMs ?? 1_000, async () => {
    if (stopped) return;
    await writer
      .run(async () => {
        const settings = pool?.settings;
        const s = await load();
        const cur = s.current;
        const gate = gateFor(settings, s);
        if (!gate) return;
        // A write to the pool that failed (the API server out of reach) is made good here, not at the node's
        // next event, which may never come: a slot given back in the state but not on the record is held for ever.
        if (!cur || cur.phase === "waiting") return void (await syncPool(s));
        // The look that would pass the gate reads the Node from the API server: a node cut off from it (the
        // change broke its network) keeps a cached Node that still says Ready, and must not pass on that.
        // So does the look that would time the gate out: whether the node could see itself decides whether
        // its failure is final or tried again after the rollback (a stale cached Node says nothing).
        const now = bootClock();
        const timingOut = cur.since !== undefined && elapsedBetween(cur.since, now) >= gate.healthTimeoutMs;
        const decisive = timingOut || (cur.healthySince !== undefined && elapsedBetween(cur.healthySince, now) >= gate.settleMs);
        const verdict = cur.phase === "applying" || cur.phase === "rolling-back" ? { healthy: true as const } : await look(cur.work.disruption.units, gate, decisive);
        await drive(verdict.healthy ? { type: "look", healthy: true } : { type: "look", healthy: false, check: verdict.check, ...(verdict.inconclusive ? { inconclusive: true } : {}) }, settings);
      })
      .catch((err: unknown) => log.warn("a look at the node's health failed", { error: describeError(err) }));
  });

  async function look(units: string[], gate: Gate, fresh: boolean): Promise<GateVerdict> {
    const check = (node: V1Node | undefined) =>
      checkHealth(
        { node: () => node, unitStatus: (u) => deps.systemd.unitStatus(u), ownedUnits: async () => (await deps.store.read()).owned.units, stuckThresholdMs: deps.stuckThresholdMs, sinceBoot: () => bootClock().uptimeMs, wallNow: () => wallNow().getTime() },
        gate,
        { units },
      );
    const cached = deps.node.current();
    const local = await check(cached);
    // A failure the node sees itself (a unit, its probe) stands; only the Node's part needs the API server.
    if (!fresh || (!local.healthy && !local.node)) return local;
    // No Node seen since the agent started (it restarted cut off from the API server): it cannot see itself.
    if (!cached?.metadata?.name) return local.healthy ? local : { ...local, inconclusive: true };
    let node: V1Node;
    try {
      node = await coreV1(deps.kube).readNode({ name: cached.metadata.name });
    } catch (err) {
      return { healthy: false, check: `the Node as the API server has it: ${describeError(err)}`, node: true, inconclusive: true };
    }
    return check(node);
  }

  /**
   * New work while the node holds its slot is applied under it only once the record moved the slot on to it.
   * The node asks for it on its ticket and the leader moves it — never to a revision that failed its gate
   * elsewhere, nor while more nodes hold slots than k allows now (k lowered, the pool shrank): only the
   * leader counts the pool as it is (model pool-size seed 6436: holders that moved themselves on by a count
   * the dead leader left behind were two with k = 1). Meanwhile the gate of what the node did runs on; if it
   * passes first, the work asks the pool as any other.
   */
  async function slotMovesOn(work: Work, what: string, settings: RolloutSettings): Promise<HoldBack | undefined> {
    const s = await load();
    const cur = s.current;
    const m = member();
    if (!m || !cur || cur.phase === "waiting") return undefined;
    const r = step(s, { type: "want", work }, ctx(policyOf(settings)));
    if (r.action.do !== "apply" || r.action.target !== "work" || r.state.current === cur) return undefined;
    const held = await m.member.holding();
    if (held?.revision === work.revision) return undefined;
    const retryAfterMs = Math.min(60_000, settings.settleMs || 60_000);
    if (!held) return { reason: "WaitingForSlot", message: `${what} waits for the gate of this node's last change: the pool's record no longer shows this node's slot`, retryAfterMs };
    const request = { revision: work.revision, reason: work.kind, since: wallNow().toISOString(), ...(work.changes ? { changes: work.changes } : {}) };
    const failed = await m.member.failure();
    if (failed && stopsRequest(failed, { node: nodeName(), request })) {
      return { reason: "RolloutStopped", message: `${what} failed its health gate on ${failed.node} (${failed.failure}): not applied under this node's slot`, retryAfterMs };
    }
    await m.member.request(request);
    // A move needs a leader: asking makes this agent stand for it (it stands down with its next step).
    m.leader.campaign(true);
    return { reason: "WaitingForSlot", message: `${what} waits for the pool to move this node's slot on to it; the gate of its last change runs meanwhile`, retryAfterMs };
  }

  function decision(a: Action, settings: RolloutSettings): Decision {
    switch (a.do) {
      case "apply":
        return { do: "apply", target: a.target };
      case "apply-free":
        return { do: "apply", target: "work" };
      case "hold":
        return { do: "hold", reason: a.reason, message: a.message, retryAfterMs: a.retryAfterMs ?? Math.min(60_000, settings.settleMs || 60_000) };
      default:
        return { do: "wait" };
    }
  }

  return {
    observe(next) {
      const budgetRemoved = pool?.settings.budget !== undefined && next.settings.budget === undefined;
      pool = next;
      membership?.leader.poke();
      if (budgetRemoved) {
        // Without a budget nothing is held for the pool any more: a slot this node kept (a failed gate) goes back.
        void writer.run(async () => {
          if ((await load()).current) await drive({ type: "slot-lost" }, next.settings);
          await membership?.member.release();
        });
      }
    },
    current: () => pool,
    offer: (work) =>
      writer.run(async () => {
        const settings = pool?.settings;
        if (!settings) throw new Error("no rollout settings yet: the OSC controller has not read the pool's Secret");
        const labels = deps.node.current()?.metadata?.labels ?? {};
        const what = work.kind === "osc" ? `OSC ${work.checksum.slice(0, 12)}` : `${work.kind} ${work.revision}`;
        // A revision the pool stopped does not take the place of a requested restart waiting for its slot (the
        // restart went past it: restart.ts); it would only wait in vain, and the restart lose its place in the queue.
        const cur = (await load()).current;
        if (cur?.phase === "waiting" && cur.work.kind === "restart" && work.kind !== "restart" && stoppedOnPool.has(work.revision)) {
          return { do: "hold", reason: "RolloutStopped", message: `${what} failed its health gate on another node: it waits while a requested restart waits for its slot`, retryAfterMs: Math.min(60_000, settings.settleMs || 60_000) };
        }
        const blocker = holdBack({ what, labels, settings, disrupts: [...work.disruption.units, ...work.disruption.paths], now: wallNow() }) ?? (await slotMovesOn(work, what, settings));
        return decision(await drive({ type: "want", work, ...(blocker ? { holdBack: blocker } : {}) }, settings), settings);
      }),
    applied: (outcome) =>
      writer.run(async () => {
        const settings = pool?.settings;
        if (!settings) return { do: "wait" };
        return decision(await drive({ type: "applied", ...outcome }, settings), settings);
      }),
    baseline: (applied) =>
      writer.run(async () => {
        const settings = pool?.settings;
        if (!settings || (await load()).lastGood) return;
        await drive({ type: "baseline", ...applied }, settings);
      }),
    state: () => writer.run(load),
    stopped: (revision) => stoppedOnPool.has(revision),
    pending: () => writer.run(async () => ((await load()).current?.phase === "rolling-back" ? { do: "apply", target: "last-good" } : { do: "wait" })),
    async lastGood() {
      const s = await writer.run(load);
      if (!s.lastGood) return undefined;
      const osc = await deps.files.read(lastGoodOscPath);
      return osc ? { checksum: s.lastGood.checksum, base: s.lastGood.base, osc } : undefined;
    },
    onChange(listener) {
      listeners.add(listener);
      return () => void listeners.delete(listener);
    },
    async stop() {
      stopped = true;
      ticketRetry.cancel();
      await looks.stop();
      await writer.idle();
      await membership?.leader.stop();
      await membership?.ticket?.stop();
    },
  };
}

