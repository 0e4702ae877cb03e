// The pool's side of a fleet rollout, as data and pure decisions (the Lease I/O is src/kube/pool-leases.ts,
// the protocol in docs/rollout-protocol.md).
//
// Three kinds of Lease in the Secret's namespace carry it:
//   - the record: who is admitted to disrupt (the holders), and the revision that failed its health gate,
//     in shards of at most 32 holders so that a write's size does not grow with k: `<secret>-slots` (shard
//     0, also the failure and the pool's size), `<secret>-slots-1`, … Shard i has its fixed share of the k
//     slots (the first 32 in shard 0, the next 32 in shard 1, …), and every admission is a compare-and-swap
//     on its shard, so "fewer than k holders" is checked and changed atomically whatever k each writer
//     believes in: a smaller k fills a prefix of the larger's shares;
//   - one ticket per node, `<secret>-node-<node>` (owned by the Node: it goes when the Node goes): what the
//     node asks for, and the grant the leader writes back;
//   - `<secret>-leader`: the agent that grants, elected among the agents that have something to ask for.
// A waiting node reads nothing of the pool: it watches its own ticket (and the leader's Lease, to stand in
// when the leader dies), so what a rollout costs the API server per node does not grow with the pool.
import * as v from "valibot";
import type { Budget } from "../api/rollout.ts";
import type { Result } from "../api/result.ts";
import { compareText } from "../api/text-order.ts";

export const ticketPrefix = "node";
export const poolLeaseLabel = "rollout.trellis.dev/pool";
export const ticketLabel = "rollout.trellis.dev/ticket";
/** On every shard of the record (value: the Secret's name), for the leader's one watch of them. */
export const slotsLabel = "rollout.trellis.dev/slots";
export const holdersAnnotation = "rollout.trellis.dev/holders";
export const failedAnnotation = "rollout.trellis.dev/failed";
export const poolSizeAnnotation = "rollout.trellis.dev/pool-size";
export const requestAnnotation = "rollout.trellis.dev/request";
export const grantAnnotation = "rollout.trellis.dev/grant";

/**
 * `changes`: what each piece of work the holder was admitted (or moved on) for changes (their requests'), so a
 * holder lost in its gate stops what it was changing.
 */
const HolderSchema = v.object({ node: v.string(), revision: v.string(), since: v.string(), changes: v.optional(v.array(v.array(v.string()))) });
/**
 * `changes`: what each piece of work applied under the failed admission changed on the node (`changesOf`,
 * src/plan/disruption.ts), so a failure stops a later revision that still carries one of them.
 */
const FailureSchema = v.object({ revision: v.string(), node: v.string(), failure: v.string(), at: v.string(), changes: v.optional(v.array(v.array(v.string()))) });
const RequestSchema = v.object({ revision: v.string(), reason: v.string(), since: v.string(), changes: v.optional(v.array(v.string())) });
/**
 * `stopped`: not a grant but the leader's word that `revision` failed its gate elsewhere and is not admitted.
 * `shard`: the record shard that holds the node (0 when absent).
 */
const GrantSchema = v.object({ revision: v.string(), at: v.string(), stopped: v.optional(v.string()), shard: v.optional(v.pipe(v.number(), v.integer(), v.minValue(0))) });

export type Holder = v.InferOutput<typeof HolderSchema>;
export type Failure = v.InferOutput<typeof FailureSchema>;
export type Request = v.InferOutput<typeof RequestSchema>;
export type Grant = v.InferOutput<typeof GrantSchema>;

/** The `<secret>-slots` record. */
export type PoolRecord = { holders: Holder[]; failed?: Failure; poolSize?: number };
/** One node's ticket. */
export type Ticket = { node: string; request?: Request; grant?: Grant };

export const slotsLeaseName = (secret: string) => `${secret}-slots`;

/** Holders per record shard: a write of the record never lists more (the model checks the protocol with fewer). */
export const shardCapacity = 32;
/** The name of shard `i` of the record. */
export const shardLeaseName = (secret: string, shard: number) => (shard === 0 ? slotsLeaseName(secret) : `${slotsLeaseName(secret)}-${shard}`);
/** The shard a record Lease's name says (undefined: not one of `secret`'s). */
export function shardOf(secret: string, leaseName: string): number | undefined {
  if (leaseName === slotsLeaseName(secret)) return 0;
  const rest = leaseName.startsWith(`${slotsLeaseName(secret)}-`) ? leaseName.slice(slotsLeaseName(secret).length + 1) : "";
  return /^[1-9][0-9]{0,5}$/.test(rest) ? Number(rest) : undefined;
}
/** Shard `i`'s share of k slots: the first `capacity` are shard 0's, the next shard 1's, … */
export const shardSlots = (shard: number, k: number, capacity = shardCapacity) => Math.min(capacity, Math.max(0, k - capacity * shard));
/** How many shards k slots take. */
export const shardsFor = (k: number, capacity = shardCapacity) => Math.max(1, Math.ceil(k / capacity));
export const leaderLeaseName = (secret: string) => `${secret}-leader`;

/**
 * A ticket's name: `<secret>-node-<node>`, or with a digest of the node's name where that would be longer
 * than a Lease name may be (253); the ticket's holderIdentity names the node either way.
 */
export function ticketName(secret: string, node: string, digest: (s: string) => string): string {
  const plain = `${secret}-${ticketPrefix}-${node}`;
  return plain.length <= 253 ? plain : `${secret}-${ticketPrefix}-${digest(node).slice(0, 32)}`;
}

function parseJson<T>(text: string | undefined, schema: v.GenericSchema<unknown, T>, what: string): Result<T | undefined> {
  if (text === undefined || text === "") return { ok: true, value: undefined };
  let raw: unknown;
  try {
    raw = JSON.parse(text);
  } catch (err) {
    return { ok: false, errors: [`${what}: not JSON: ${err instanceof Error ? err.message : String(err)}`] };
  }
  const r = v.safeParse(schema, raw);
  return r.success ? { ok: true, value: r.output } : { ok: false, errors: [`${what}: ${r.issues.map((i) => i.message).join("; ")}`] };
}

/**
 * The record as its annotations carry it. A record that cannot be read is an error, never an empty pool:
 * reading it as empty would admit k more nodes while k are disrupted.
 */
export function decodePool(annotations: Readonly<Record<string, string>> | undefined, source: string): Result<PoolRecord> {
  const a = annotations ?? {};
  const holders = parseJson(a[holdersAnnotation], v.array(HolderSchema), `${source}: annotation ${holdersAnnotation}`);
  const failed = parseJson(a[failedAnnotation], FailureSchema, `${source}: annotation ${failedAnnotation}`);
  const sizeText = a[poolSizeAnnotation];
  const size = sizeText === undefined ? undefined : Number(sizeText);
  const errors = [...(holders.ok ? [] : holders.errors), ...(failed.ok ? [] : failed.errors)];
  if (size !== undefined && !(Number.isInteger(size) && size >= 0)) errors.push(`${source}: annotation ${poolSizeAnnotation}: "${sizeText}" is not a number of nodes`);
  if (!holders.ok || !failed.ok || errors.length > 0) return { ok: false, errors };
  return { ok: true, value: { holders: holders.value ?? [], ...(failed.value ? { failed: failed.value } : {}), ...(size !== undefined ? { poolSize: size } : {}) } };
}

/** The annotations that carry `record` (null: remove the key). */
export function encodePool(record: PoolRecord): Record<string, string | null> {
  return {
    [holdersAnnotation]: JSON.stringify(record.holders),
    [failedAnnotation]: record.failed ? JSON.stringify(record.failed) : null,
    [poolSizeAnnotation]: record.poolSize === undefined ? null : String(record.poolSize),
  };
}

export function decodeTicket(node: string, annotations: Readonly<Record<string, string>> | undefined, source: string): Result<Ticket> {
  const a = annotations ?? {};
  const request = parseJson(a[requestAnnotation], RequestSchema, `${source}: annotation ${requestAnnotation}`);
  const grant = parseJson(a[grantAnnotation], GrantSchema, `${source}: annotation ${grantAnnotation}`);
  if (!request.ok || !grant.ok) return { ok: false, errors: [...(request.ok ? [] : request.errors), ...(grant.ok ? [] : grant.errors)] };
  return { ok: true, value: { node, ...(request.value ? { request: request.value } : {}), ...(grant.value ? { grant: grant.value } : {}) } };
}

export function encodeTicket(t: Omit<Ticket, "node">): Record<string, string | null> {
  return {
    [requestAnnotation]: t.request ? JSON.stringify(t.request) : null,
    [grantAnnotation]: t.grant ? JSON.stringify(t.grant) : null,
  };
}

/**
 * How many nodes of a pool of `poolSize` may be disrupted at once: a count as given but never more than the
 * pool (an autoscaled pool below its count must still update), a percentage rounded down; at least 1.
 */
export function budgetSlots(budget: Budget, poolSize: number): number {
  const size = Math.max(1, poolSize);
  return "count" in budget ? Math.max(1, Math.min(budget.count, size)) : Math.max(1, Math.floor((budget.percent * size) / 100));
}

/**
 * The tickets a leader decides on: its watch's view, with the tickets of holders it would drop as just read
 * (`fresh`: node → ticket, null when it is gone). A holder the view shows without a ticket or asking nothing
 * that was not read fresh stays a holder: a leader's watch can be behind another leader's admission (two lead
 * for a moment while the Lease changes hands), and dropping a holder on that would free a slot still in use
 * (and, its ticket "gone", stop its revision).
 */
export function holderView(record: PoolRecord, tickets: ReadonlyMap<string, Ticket>, fresh: ReadonlyMap<string, Ticket | null>): Map<string, Ticket> {
  const view = new Map(tickets);
  for (const h of record.holders) {
    const read = fresh.get(h.node);
    if (read === null) view.delete(h.node);
    else if (read) view.set(h.node, read);
    else if (!view.get(h.node)?.request) view.set(h.node, { node: h.node, request: { revision: h.revision, reason: "unconfirmed", since: h.since } });
  }
  return view;
}

/** Holders the view would drop (no ticket, or one that asks for nothing): their tickets are read fresh first. */
export const dropCandidates = (record: PoolRecord, tickets: ReadonlyMap<string, Ticket>): string[] => record.holders.filter((h) => !tickets.get(h.node)?.request).map((h) => h.node);

/**
 * Nodes whose ticket, as the view shows it, carries the grant of what it asks for while they hold no slot:
 * a grant stays on the ticket until the node gives its slot back, so the view is most likely behind that
 * give-back (the record's watch, a stream of its own, showed the holder leave first). Admitted on that view,
 * the node would hold a slot it never uses until the next pass drops it, and a waiting node would wait for
 * it (e2e rollout, two requested restarts: the first node held twice). Their tickets are read fresh first.
 */
export const staleGrants = (holders: readonly Holder[], tickets: ReadonlyMap<string, Ticket>): string[] => {
  const holding = new Set(holders.map((h) => h.node));
  return [...tickets.values()].filter((t) => !holding.has(t.node) && t.request && t.grant?.revision === t.request.revision && t.grant.stopped === undefined).map((t) => t.node);
};

/** `tickets` with those read fresh in place of the view's (null: gone). */
export function withFresh(tickets: ReadonlyMap<string, Ticket>, fresh: ReadonlyMap<string, Ticket | null>): Map<string, Ticket> {
  const view = new Map(tickets);
  for (const [node, t] of fresh) {
    if (t === null) view.delete(node);
    else view.set(node, t);
  }
  return view;
}

/**
 * Whether the record's failure stops work of `revision` that makes `changes`: the revision that failed, or
 * work that would bring the node any change the failed admission made and no node has proven since. Which
 * of its changes broke cannot be told apart, and Gardener renders new revisions for unrelated reasons (a
 * rotated token, another extension), or "fixes" the wrong part: each would take the bad change to k more
 * nodes (model holder-death seed 5192). A change the node runs already is no new disruption; one the node
 * that failed has run healthy since (`provenFailure`) is no longer suspect.
 */
export function stops(failed: Failure | undefined, revision: string, changes: readonly string[] | undefined): boolean {
  if (!failed) return false;
  if (failed.revision === revision) return true;
  const suspect = new Set((failed.changes ?? []).flat());
  return changes !== undefined && changes.some((c) => suspect.has(c));
}

/**
 * Whether the failure on the record stops what `t` asks for. Not for the node that failed: it ran every
 * change of its failure already (a bad one disrupts no more machines for it), and it is where a fix that
 * carries suspect changes proves them (or a retry of an inconclusive failure settles it).
 */
export function stopsRequest(failed: Failure | undefined, t: Ticket): boolean {
  const r = t.request;
  return r !== undefined && failed?.node !== t.node && stops(failed, r.revision, r.changes);
}

/**
 * The failure once work passed its gate on the node that failed, which now runs `proven` (every file and
 * unit it left): those changes are proven good and are no longer suspect; undefined once none is left. A
 * change newer work replaced there stays suspect, and so does the failed revision while any does. Without
 * `proven`, all of it goes.
 */
export function provenFailure(failed: Failure, proven?: readonly string[]): Failure | undefined {
  if (!proven) return undefined;
  const left = (failed.changes ?? []).map((piece) => piece.filter((c) => !proven.includes(c))).filter((piece) => piece.length > 0);
  return left.length > 0 ? { ...failed, changes: left } : undefined;
}

/** A name of its own for a piece of work other than an OSC change (a requested restart): never a pool's to stop. */
export const workRevision = (kind: string, node: string, what: string) => `${kind}/${node}/${what}`;
/** Whether `revision` is an OSC change's (the Secret's revision, a digest), which a failure stops pool-wide. */
const poolRevision = (revision: string) => !revision.includes("/");

/**
 * Holders whose ticket is gone while they held their slot: the garbage collector deleted it with the Node
 * (the machine was deleted or replaced in its gate) or an operator deleted it. Their change never passed its
 * gate, and a change that kills machines looks exactly like that, so their revision is recorded as failed
 * (a failure recorded for that revision already stays, with its own reason): the pool stops there instead of
 * handing the change to the next node, one machine replacement at a time. A new revision goes on as after
 * any failure.
 */
export function withLostHolders(record: PoolRecord, tickets: ReadonlyMap<string, Ticket>, at: string, lastTicket: (node: string) => Ticket | undefined): PoolRecord {
  // A holder whose ticket went before it showed the grant of its admission never heard of it, and changed
  // nothing (the leader admitted it on a watch behind the ticket's deletion): it is dropped, not lost. The
  // last state of a ticket is known from its deletion's watch event; unknown, the holder counts as told.
  const told = (h: Holder) => {
    const last = lastTicket(h.node);
    return last === undefined || (last.grant?.at === h.since && last.grant.stopped === undefined);
  };
  const lost = record.holders.find((h) => !tickets.has(h.node) && poolRevision(h.revision) && h.revision !== record.failed?.revision && told(h));
  if (!lost) return record;
  const asked = lastTicket(lost.node)?.request;
  const changes = lost.changes ?? (asked?.revision === lost.revision && asked.changes ? [asked.changes] : undefined);
  const failure = "its ticket went while it held a slot (its Node was deleted, or an operator deleted the ticket): the change never passed its gate there";
  return { ...record, failed: { revision: lost.revision, node: lost.node, failure, at, ...(changes ? { changes } : {}) } };
}

/**
 * The leader's decision on the record as it is now: whom to admit next, and which holders to drop because
 * their ticket is gone (the garbage collector deleted it with the Node, or an operator freed the slot:
 * `withLostHolders` records that first) or asks for nothing (the node gave its slot back and stopped before
 * it said so on the record). A holder that stopped answering is never dropped otherwise: a node that died of
 * its change keeps its slot (the pool stops at k such nodes), however Ready its Node still looks and
 * whatever its Lease's clock says.
 */
export function decide(record: PoolRecord, tickets: ReadonlyMap<string, Ticket>, k: number): { admit: Ticket[]; drop: string[] } {
  const drop = dropCandidates(record, tickets);
  const holding = new Set(record.holders.map((h) => h.node));
  const free = k - (record.holders.length - drop.length);
  if (free <= 0) return { admit: [], drop };
  const waiting = [...tickets.values()]
    .filter((t) => t.request && !holding.has(t.node) && !stopsRequest(record.failed, t))
    .sort((a, b) => compareText(a.request?.since ?? "", b.request?.since ?? "") || compareText(a.node, b.node));
  return { admit: waiting.slice(0, free), drop };
}

/**
 * Holders whose ticket asks for another revision than the record holds them for, moved on to it under the
 * slot they hold: the node asks for newer work under its slot (only the leader moves a holder: it alone
 * counts the pool as it is), or the leader admitted a request the node had replaced meanwhile (its view of
 * the ticket was behind). Never on to a revision that stops for the node: that is admitted nowhere.
 */
export function movesOwed(record: PoolRecord, tickets: ReadonlyMap<string, Ticket>): Holder[] {
  return record.holders.flatMap((h) => {
    const t = tickets.get(h.node);
    const asked = t?.request;
    if (!t || asked === undefined || asked.revision === h.revision || stopsRequest(record.failed, t)) return [];
    const changes = [...(h.changes ?? []), ...(asked.changes ? [asked.changes] : [])];
    return [{ ...h, revision: asked.revision, ...(changes.length > 0 ? { changes } : {}) }];
  });
}

/**
 * Holders whose ticket does not show their grant (the leader stopped between the two writes): granted again.
 * A grant is of one admission: its `at` is the holder's `since`, so a node admitted again after a grant it
 * could not confirm (the record no longer showed it) sees its ticket change, and looks again.
 */
export function grantsOwed(record: PoolRecord, tickets: ReadonlyMap<string, Ticket>): Holder[] {
  return record.holders.filter((h) => {
    const t = tickets.get(h.node);
    return t?.request !== undefined && t.request.revision === h.revision && !showsGrant(t, h);
  });
}

/** Whether `t` shows the grant of `h`'s admission (its revision and time, not a stop). */
const showsGrant = (t: Ticket, h: Holder) => t.grant?.revision === h.revision && t.grant.at === h.since && t.grant.stopped === undefined;

/**
 * The record with `node` admitted for `revision` (or its holding moved on to `revision`). `changes`: the changes
 * of each piece of work the holder holds the slot for (a move passes the prior's with its own).
 */
export function withHolder(record: PoolRecord, node: string, revision: string, at: string, changes?: readonly (readonly string[])[]): PoolRecord {
  const others = record.holders.filter((h) => h.node !== node);
  const prior = record.holders.find((h) => h.node === node);
  return { ...record, holders: [...others, { node, revision, since: prior?.since ?? at, ...(changes ? { changes: changes.map((p) => [...p]) } : {}) }] };
}

export function withoutHolders(record: PoolRecord, nodes: readonly string[]): PoolRecord {
  return { ...record, holders: record.holders.filter((h) => !nodes.includes(h.node)) };
}

/** Waiting tickets for the revision that failed (or one that carries its changes), not yet told so. */
export function stopsOwed(record: PoolRecord, tickets: ReadonlyMap<string, Ticket>): Ticket[] {
  const failed = record.failed;
  if (!failed) return [];
  return [...tickets.values()].filter((t) => stopsRequest(failed, t) && t.grant?.revision !== t.request?.revision && !record.holders.some((h) => h.node === t.node));
}

/** Whether `ticket` may go on with what it asked for (granted, and not told that it failed elsewhere). */
export const admitted = (t: Ticket | undefined): boolean => t?.request !== undefined && t.grant?.revision === t.request.revision && t.grant.stopped === undefined;
