// The agent that admits its pool's waiting nodes: elected with the Lease `<secret>-leader` among the agents
// that wait for a slot, it watches the pool's tickets and the record's shards and admits the next waiting
// nodes, oldest request first, with one compare-and-swap per shard that changes and one write to each
// ticket. Only the leader reads the whole pool (one list when it starts leading, then a watch); it resigns
// when nobody waits, so a pool without a rollout costs nothing.
//
// Expiry is judged on this agent's own monotonic clock: the leader's Lease counts as expired only after
// this agent has seen it unchanged for a whole lease duration, never by comparing renewTime (another
// node's wall clock) with its own. Two leaders at once (a partition healing) cannot admit more than k: every
// admission is a compare-and-swap on a shard, within the shard's share of k (src/rollout/pool.ts).
import type { V1Lease } from "@kubernetes/client-node";
import type { Budget } from "../api/rollout.ts";
import { describeError, type Logger } from "../log.ts";
import { every, type Loop, singleFlight } from "../loops.ts";
import { budgetSlots, decide, dropCandidates, grantAnnotation, grantsOwed, holderView, leaderLeaseName, movesOwed, poolLeaseLabel, type PoolRecord, shardCapacity, shardLeaseName, shardOf, shardsFor, shardSlots, slotsLabel, slotsLeaseName, staleGrants, stopsOwed, stopsRequest, type Ticket, ticketLabel, withFresh, withHolder, withLostHolders, withoutHolders } from "../rollout/pool.ts";
import { KubeError } from "./errors.ts";
import type { LeaseApi, LeaseWatch } from "./lease-api.ts";
import type { WatchEvent } from "./watch.ts";
import { microTime } from "./micro-time.ts";
import { compareAndSwap, nodeTicketName, patchAnnotations, type PoolRef, readPool, readTicket, secretOwner, slotsLeaseBody } from "./pool-leases.ts";

export type LeaderDeps = {
  api: LeaseApi;
  ref: PoolRef;
  log: Logger;
  /** The pool's budget as the Secret says now (undefined: no budget, nothing to admit). */
  budget: () => Budget | undefined;
  /** Monotonic ms. */
  clock: () => number;
  /** Wall clock, for timestamps people read. */
  wallNow: () => Date;
  leaseDurationMs?: number;
  renewEveryMs?: number;
  /** Holders per record shard (src/rollout/pool.ts shardCapacity). */
  shardCapacity?: number;
};

export type PoolLeader = {
  /** Whether this agent wants the pool to have a leader (it waits for a slot): it stands when there is none. */
  campaign(want: boolean): void;
  leading(): boolean;
  /** Runs an admission pass now (the budget changed). */
  poke(): void;
  stop(): Promise<void>;
};

type Leading = {
  renewedAt: number;
  /** The pool's tickets by node, and each node's ticket Lease name. */
  tickets: Map<string, Ticket>;
  leaseOf: Map<string, string>;
  /** The last state of each ticket that went while this agent led. */
  departed: Map<string, Ticket>;
  /**
   * The record's shards by index, as the watches delivered them: an admission's write starts from the Lease,
   * without a read. A shard whose record is undefined cannot be read: nobody is admitted until it is fixed.
   */
  shards: Map<number, { record?: PoolRecord; lease?: V1Lease }>;
  watches: LeaseWatch[];
  synced: Promise<void>;
};

/** How long a stopping leader tries to hand its Lease back. */
const resignTimeoutMs = 2_000;
/** Ticket writes a leader has in flight at once. */
const tellsAtOnce = 16;

/** Runs `f` over `items`, at most `tellsAtOnce` at a time; the first error is thrown once all ended. */
async function inParallel<T>(items: readonly T[], f: (item: T) => Promise<void>): Promise<void> {
  const results: PromiseSettledResult<void>[] = [];
  for (let i = 0; i < items.length; i += tellsAtOnce) results.push(...(await Promise.allSettled(items.slice(i, i + tellsAtOnce).map(f))));
  const failed = results.find((r): r is PromiseRejectedResult => r.status === "rejected");
  if (failed) throw failed.reason;
}

export function startPoolLeader(deps: LeaderDeps): PoolLeader {
  const { api, ref } = deps;
  const log = deps.log.with({ pool: ref.secret.name });
  const name = leaderLeaseName(ref.secret.name);
  const slots = slotsLeaseName(ref.secret.name);
  const durationMs = deps.leaseDurationMs ?? 30_000;
  const renewEveryMs = deps.renewEveryMs ?? durationMs / 3;
  const capacity = deps.shardCapacity ?? shardCapacity;
  let wanted = false;
  let stopped = false;
  // What this agent saw of the leader's Lease, and when (its own clock) that last changed.
  let seen: { lease: V1Lease | undefined; changedAt: number } | undefined;
  // While leading: when the last renewal succeeded, and the watches of the pool.
  let lead: Leading | undefined;
  let leaderWatch: LeaseWatch | undefined;

  const observe = (lease: V1Lease | undefined) => {
    if (seen && seen.lease?.metadata?.resourceVersion === lease?.metadata?.resourceVersion) return;
    seen = { lease, changedAt: deps.clock() };
  };
  const watchLeader = () => {
    leaderWatch ??= api.watch({ name }, (e) => observe(e.type === "DELETED" ? undefined : e.object));
  };

  const leaseBody = (current: V1Lease | undefined, holder: string | undefined): V1Lease => {
    const at = microTime(deps.wallNow());
    const taking = holder !== undefined && current?.spec?.holderIdentity !== holder;
    return {
      apiVersion: "coordination.k8s.io/v1",
      kind: "Lease",
      metadata: { ...current?.metadata, name, labels: { ...current?.metadata?.labels, [poolLeaseLabel]: ref.secret.name }, ownerReferences: [secretOwner(ref.secret)] },
      spec: {
        ...current?.spec,
        holderIdentity: holder,
        leaseDurationSeconds: Math.ceil(durationMs / 1000),
        renewTime: at,
        ...(taking ? { acquireTime: at, leaseTransitions: (current?.spec?.leaseTransitions ?? 0) + (current ? 1 : 0) } : {}),
      },
    };
  };

  const expired = () => {
    const holder = seen?.lease?.spec?.holderIdentity;
    if (!holder) return true;
    return deps.clock() - (seen?.changedAt ?? deps.clock()) >= durationMs;
  };

  async function tick(): Promise<void> {
    if (stopped) return;
    if (lead) {
      if (!wanted && !waiting(lead)) return resign();
      const renewed = await write((current) => (current?.spec?.holderIdentity === ref.node.name ? leaseBody(current, ref.node.name) : undefined), true);
      if (renewed === "written") lead.renewedAt = deps.clock();
      // Taken by another agent, or not renewed for so long that others may stand: no longer the leader.
      else if (renewed === "lost" || deps.clock() - lead.renewedAt >= durationMs - renewEveryMs) await abdicate("could not renew the leader's Lease");
      return;
    }
    if (!wanted) {
      // Nothing to wait for: the leader's Lease is not watched (a pool without a rollout costs nothing).
      const w = leaderWatch;
      leaderWatch = undefined;
      seen = undefined;
      await w?.stop();
      return;
    }
    watchLeader();
    await leaderWatch?.synced;
    if (!expired()) return;
    const taken = await write((current) => {
      const holder = current?.spec?.holderIdentity;
      // Only the version this agent judged expired (or a free one) is taken: a renewal meanwhile is a conflict.
      if (holder && current?.metadata?.resourceVersion !== seen?.lease?.metadata?.resourceVersion) return undefined;
      return leaseBody(current, ref.node.name);
    }, false);
    if (taken === "written") startLeading();
  }

  /** Writes the leader's Lease: "lost" when another agent holds it or wrote it meanwhile, "error" when the API server failed. */
  async function write(change: (current: V1Lease | undefined) => V1Lease | undefined, renewing: boolean): Promise<"written" | "lost" | "error"> {
    try {
      const current = await api.get(name);
      const next = change(current);
      if (!next) {
        observe(current);
        return "lost";
      }
      observe(current ? await api.replace(next) : await api.create(next));
      return "written";
    } catch (err) {
      if (err instanceof KubeError && (err.reason === "conflict" || err.reason === "not-found")) return "lost";
      log.warn(renewing ? "could not renew the pool's leader Lease" : "could not take the pool's leader Lease", { error: describeError(err) });
      return "error";
    }
  }

  function startLeading(): void {
    log.info("leading the pool's rollout: admitting waiting nodes", { lease: name });
    const state: Leading = { renewedAt: deps.clock(), tickets: new Map(), departed: new Map(), leaseOf: new Map(), shards: new Map(), watches: [], synced: Promise.resolve() };
    const nodeOf = new Map<string, string>();
    const ticketWatch = api.watch({ labelSelector: `${ticketLabel}=${ref.secret.name}` }, (e) => {
      const key = e.object.metadata?.name as string;
      const before = nodeOf.get(key);
      if (before !== undefined) {
        state.tickets.delete(before);
        state.leaseOf.delete(before);
        nodeOf.delete(key);
      }
      const t = e.type === "DELETED" ? undefined : readTicket(e.object, `Lease kube-system/${key}`);
      // A ticket's last state (its deletion's event carries it): what a holder lost with it was told and was
      // changing (withLostHolders).
      const last = before !== undefined && e.type === "DELETED" ? readTicket(e.object, `Lease kube-system/${key}`) : undefined;
      if (last && before !== undefined) state.departed.set(before, last);
      if (t) {
        state.tickets.set(t.node, t);
        state.leaseOf.set(t.node, key);
        nodeOf.set(key, t.node);
      }
      passes.trigger("ticket changed");
    });
    const onShard = (e: WatchEvent<V1Lease>) => {
      const key = e.object.metadata?.name ?? "";
      const shard = shardOf(ref.secret.name, key);
      if (shard === undefined) return;
      const lease = e.type === "DELETED" ? undefined : e.object;
      try {
        if (lease || shard === 0) state.shards.set(shard, { record: readPool(lease, `Lease kube-system/${key}`), ...(lease ? { lease } : {}) });
        else state.shards.delete(shard);
      } catch (err) {
        state.shards.set(shard, { lease });
        log.error("the pool's slots record cannot be read: nobody is admitted until it is fixed", { lease: key, error: describeError(err) });
      }
      passes.trigger("record changed");
    };
    // Shard 0 by its name (it is there before any shard has the label), the others by their label.
    const recordWatch = api.watch({ name: slots }, onShard);
    const shardWatch = api.watch({ labelSelector: `${slotsLabel}=${ref.secret.name}` }, (e) => (e.object.metadata?.name === slots ? undefined : onShard(e)));
    state.watches = [ticketWatch, recordWatch, shardWatch];
    state.synced = Promise.all([ticketWatch.synced, recordWatch.synced, shardWatch.synced]).then(() => undefined);
    lead = state;
    void state.synced.then(() => passes.trigger("leading"));
  }

  async function abdicate(why: string): Promise<void> {
    const was = lead;
    lead = undefined;
    if (!was) return;
    log.info("no longer leading the pool's rollout", { why });
    await Promise.all(was.watches.map((w) => w.stop()));
  }

  async function resign(): Promise<void> {
    // A last pass first: holders that gave their slot back on their ticket leave the record with it.
    const budget = deps.budget();
    if (lead && budget) await admit(lead, budget).catch((err: unknown) => log.warn("the last admission pass before resigning failed", { error: describeError(err) }));
    // Still leading until the Lease says so: else the others would wait out its duration for nothing.
    if ((await write((current) => (current?.spec?.holderIdentity === ref.node.name ? leaseBody(current, undefined) : undefined), true)) === "error") return;
    await abdicate("nobody waits");
  }

  const waiting = (l: NonNullable<typeof lead>) => [...l.tickets.values()].some((t) => t.request && t.grant?.revision !== t.request.revision);

  /** One admission pass over what the watches show. */
  const passes = singleFlight(async () => {
    const l = lead;
    const budget = deps.budget();
    if (!l || !budget || stopped) return;
    await l.synced;
    if ([...l.shards.values()].some((s) => !s.record)) return;
    try {
      await admit(l, budget);
    } catch (err) {
      log.warn("an admission pass failed; the next change or renewal tries again", { error: describeError(err) });
    }
  });

  async function admit(l: NonNullable<typeof lead>, budget: Budget): Promise<void> {
    const k = budgetSlots(budget, l.tickets.size);
    const at = deps.wallNow().toISOString();
    /** The holders of every shard as the watch shows them, but shard `except`'s. */
    const held = (except?: number) => [...l.shards].flatMap(([i, s]) => (i === except ? [] : (s.record?.holders ?? [])));
    const fresh = await readTickets(l, [...dropCandidates({ holders: held() }, l.tickets), ...staleGrants(held(), l.tickets)]);
    const tickets = withFresh(l.tickets, fresh);
    const failed = await recordLost(l, held(), fresh, at);
    /** `r` judged with the pool's failure (on shard 0, whatever shard `r` is). */
    const withFailed = (r: PoolRecord): PoolRecord => (failed ? { ...r, failed } : r);
    const admitted: Ticket[] = [];
    const holders: PoolRecord["holders"] = [];
    const top = Math.max(shardsFor(k, capacity), ...[...l.shards.keys()].map((i) => i + 1));
    for (let i = 0; i < top; i++) {
      const known = l.shards.get(i);
      const name = shardLeaseName(ref.secret.name, i);
      const share = shardSlots(i, k, capacity);
      // Its share of k, and no more than k leaves the other shards (holders admitted under a larger k stay
      // in shards whose share is smaller now): the shares alone keep writers with different k's within the
      // largest; this keeps one leader within k.
      const room = Math.min(share, k - held(i).length);
      // Nodes that hold a slot in another shard, or were admitted into one in this pass, wait for nothing here.
      const elsewhere = new Set([...held(i).map((h) => h.node), ...admitted.map((t) => t.node)]);
      const candidates = [...tickets.values()].some((t) => t.request && !elsewhere.has(t.node) && !stopsRequest(failed, t));
      // A shard is created only to admit into it.
      if (i > 0 && !known?.lease && (!candidates || share === 0)) continue;
      let view: ReadonlyMap<string, Ticket> = tickets;
      let admittedHere: Ticket[] = [];
      const written = await compareAndSwap(api, name, (current) => {
        const read = readPool(current, `Lease kube-system/${name}`);
        view = new Map([...holderView(read, tickets, fresh)].filter(([node]) => !elsewhere.has(node) || read.holders.some((h) => h.node === node)));
        const d = decide(withFailed(read), view, room);
        admittedHere = d.admit;
        // A shard over its room (k lowered: over its share, or more hold slots in all shards than k) moves and
        // grants nobody: a move or a grant lets a holder disrupt.
        const over = read.holders.length - d.drop.length > room;
        let next = d.drop.length > 0 ? withoutHolders(read, d.drop) : read;
        for (const t of d.admit) next = withHolder(next, t.node, t.request?.revision as string, at, t.request?.changes ? [t.request.changes] : undefined);
        if (!over) for (const h of movesOwed(withFailed(next), view)) next = withHolder(next, h.node, h.revision, at, h.changes);
        if (d.drop.length > 0) log.info("dropped holders whose ticket is gone or asks for nothing", { nodes: d.drop });
        const poolSize = i === 0 ? l.tickets.size : read.poolSize;
        if (next === read && read.poolSize === poolSize) return undefined;
        return slotsLeaseBody(ref.secret, current, { ...next, ...(poolSize !== undefined ? { poolSize } : {}) }, i);
      }, known?.lease);
      const record = readPool(written, `Lease kube-system/${name}`);
      if (written) l.shards.set(i, { record, lease: written });
      admitted.push(...admittedHere);
      holders.push(...record.holders);
      // The grants of a shard go out together (a wave of admissions waits for the slowest, not for their sum).
      if (record.holders.length > room) continue;
      await inParallel(grantsOwed(record, view), (h) => tell(l, h.node, { revision: h.revision, at: h.since, ...(i > 0 ? { shard: i } : {}) }));
    }
    const told = `${failed?.failure ?? ""} (on ${failed?.node ?? "?"})`;
    await inParallel(stopsOwed(withFailed({ holders }), tickets), (t) => tell(l, t.node, { revision: t.request?.revision as string, at, stopped: told }));
    if (admitted.length > 0) log.info("admitted waiting nodes", { nodes: admitted.map((t) => t.node), k, poolSize: l.tickets.size });
  }

  /**
   * Writes on shard 0, before anyone is admitted anywhere, that a holder's ticket went before its gate passed
   * (withLostHolders). Returns the pool's failure as it stands then.
   */
  async function recordLost(l: Leading, holders: PoolRecord["holders"], fresh: ReadonlyMap<string, Ticket | null>, at: string): Promise<PoolRecord["failed"]> {
    const failed = l.shards.get(0)?.record?.failed;
    const all: PoolRecord = { holders, ...(failed ? { failed } : {}) };
    const lost = withLostHolders(all, holderView(all, l.tickets, fresh), at, (node) => l.departed.get(node)).failed;
    if (!lost || lost === failed) return failed;
    const name0 = shardLeaseName(ref.secret.name, 0);
    const written = await compareAndSwap(api, name0, (current) => {
      const read = readPool(current, `Lease kube-system/${name0}`);
      return read.failed?.revision === lost.revision ? undefined : slotsLeaseBody(ref.secret, current, { ...read, failed: lost }, 0);
    }, l.shards.get(0)?.lease);
    log.warn("a holder's ticket went before its change passed its gate: the revision is stopped as failed", { node: lost.node, revision: lost.revision });
    const record = readPool(written, `Lease kube-system/${name0}`);
    if (written) l.shards.set(0, { record, lease: written });
    return record.failed;
  }

  /** The tickets of `nodes` as the API server has them now (null: gone). */
  async function readTickets(l: Leading, nodes: readonly string[]): Promise<Map<string, Ticket | null>> {
    const fresh = new Map<string, Ticket | null>();
    await inParallel(nodes, async (node) => {
      const leaseName = l.leaseOf.get(node) ?? nodeTicketName(ref.secret.name, node);
      const lease = await api.get(leaseName);
      fresh.set(node, (lease && readTicket(lease, `Lease kube-system/${leaseName}`)) ?? null);
    });
    return fresh;
  }

  /** Writes a grant (or a stop) on a node's ticket, if it still asks for that revision. */
  async function tell(l: Leading, node: string, grant: { revision: string; at: string; stopped?: string; shard?: number }): Promise<void> {
    const leaseName = l.leaseOf.get(node);
    if (!leaseName) return;
    await compareAndSwap(api, leaseName, (current) => {
      if (!current) return undefined;
      const t = readTicket(current, `Lease kube-system/${leaseName}`);
      if (t?.request?.revision !== grant.revision || (t.grant?.revision === grant.revision && t.grant.at === grant.at && t.grant.stopped === grant.stopped && t.grant.shard === grant.shard)) return undefined;
      // Only the grant changes: the request stays the node's own text (the admission policy holds the leader to that).
      return { ...current, metadata: { ...current.metadata, annotations: patchAnnotations(current.metadata?.annotations, { [grantAnnotation]: JSON.stringify(grant) }) } };
    });
  }

  const loop: Loop = every(renewEveryMs, tick);

  return {
    campaign(want) {
      if (want === wanted) return;
      wanted = want;
      if (want) loop.wake();
    },
    leading: () => lead !== undefined,
    poke: () => passes.trigger("budget changed"),
    async stop() {
      stopped = true;
      await loop.stop();
      await passes.stop();
      // A leader that stops hands its Lease back, so that the waiting agents need not wait out its duration
      // (an agent restarting itself after a change is the common case); bounded, as the API server may be away.
      if (lead) await Promise.race([resign(), new Promise<void>((done) => setTimeout(done, resignTimeoutMs).unref?.())]);
      await abdicate("the agent is stopping");
      await leaderWatch?.stop();
    },
  };
}
