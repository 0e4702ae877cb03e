// A node's reads and writes of its pool's rollout Leases (the data and decisions: src/rollout/pool.ts).
// Every write is a compare-and-swap on the resourceVersion just read, retried on a conflict with a fresh
// read; nothing here lists the pool.
import type { V1Lease, V1OwnerReference } from "@kubernetes/client-node";
import { createHash } from "node:crypto";
import {
  decodePool,
  decodeTicket,
  encodePool,
  encodeTicket,
  type Failure,
  type Holder,
  leaderLeaseName,
  poolLeaseLabel,
  type PoolRecord,
  provenFailure,
  type Request,
  shardCapacity,
  shardLeaseName,
  slotsLabel,
  type Ticket,
  ticketLabel,
  ticketName,
  withoutHolders,
} from "../rollout/pool.ts";
import { KubeError } from "./errors.ts";
import type { LeaseApi } from "./lease-api.ts";

export type PoolRef = { secret: { name: string; uid: string }; node: { name: string; uid: string } };

/** Attempts of one compare-and-swap before it gives up (each after a conflict, with a fresh read). */
const casAttempts = 16;

/** `annotations` with `changes` applied (null removes a key). */
export function patchAnnotations(annotations: Readonly<Record<string, string>> | undefined, changes: Readonly<Record<string, string | null>>): Record<string, string> {
  const out: Record<string, string> = { ...annotations };
  for (const [k, v] of Object.entries(changes)) {
    if (v === null) delete out[k];
    else out[k] = v;
  }
  return out;
}

export const secretOwner = (secret: PoolRef["secret"]): V1OwnerReference => ({ apiVersion: "v1", kind: "Secret", name: secret.name, uid: secret.uid, controller: true });
const nodeOwner = (node: PoolRef["node"]): V1OwnerReference => ({ apiVersion: "v1", kind: "Node", name: node.name, uid: node.uid, controller: true });
const digest = (s: string) => createHash("sha256").update(s).digest("hex");
/** The name of `node`'s ticket in the pool of `secret`. */
export const nodeTicketName = (secret: string, node: string) => ticketName(secret, node, digest);

/**
 * Reads `name`, lets `change` decide the new Lease (undefined: nothing to write) and writes it with the
 * version read; on a conflict, reads again and decides again. Returns the Lease as written (or as read).
 */
export async function compareAndSwap(api: LeaseApi, name: string, change: (current: V1Lease | undefined) => V1Lease | undefined, known?: V1Lease, attempts = casAttempts): Promise<V1Lease | undefined> {
  for (let attempt = 1; ; attempt++) {
    // `known`: the Lease as a watch delivered it, tried first without a read (a conflict reads it).
    const current = attempt === 1 && known ? known : await api.get(name);
    const next = change(current);
    if (!next) return current;
    try {
      return current ? await api.replace(next) : await api.create(next);
    } catch (err) {
      const retry = err instanceof KubeError && (err.reason === "conflict" || (err.reason === "not-found" && current !== undefined));
      if (!retry || attempt >= attempts) throw err;
      // Writers that conflicted once tend to again (holders of one wave giving back together): spread them out.
      await new Promise((r) => setTimeout(r, Math.random() * 25 * attempt));
    }
  }
}

/** Shard `shard` of `secret`'s record holding `record` (`current`: as read, undefined to create it). */
export function slotsLeaseBody(secret: PoolRef["secret"], current: V1Lease | undefined, record: PoolRecord, shard = 0): V1Lease {
  return {
    apiVersion: "coordination.k8s.io/v1",
    kind: "Lease",
    metadata: {
      ...current?.metadata,
      name: shardLeaseName(secret.name, shard),
      labels: { ...current?.metadata?.labels, [poolLeaseLabel]: secret.name, [slotsLabel]: secret.name },
      annotations: patchAnnotations(current?.metadata?.annotations, encodePool(record)),
      ownerReferences: [secretOwner(secret)],
    },
    spec: { ...current?.spec },
  };
}

export function readPool(lease: V1Lease | undefined, source: string): PoolRecord {
  const r = decodePool(lease?.metadata?.annotations, source);
  // Unreadable: nobody may be admitted (an empty reading would admit k more while k are disrupted).
  if (!r.ok) throw new KubeError(r.errors.join("; "), "other");
  return r.value;
}

export function readTicket(lease: V1Lease, source: string): Ticket | undefined {
  const node = lease.spec?.holderIdentity;
  if (!node) return undefined;
  const r = decodeTicket(node, lease.metadata?.annotations, source);
  return r.ok ? r.value : undefined;
}

export type PoolMember = {
  readonly ticketName: string;
  /** Creates the node's ticket if it has none (the pool counts its nodes by their tickets). */
  ensureTicket(): Promise<void>;
  /**
   * Sets what the node asks for (undefined: nothing), keeping its grant (a stop only for the revision still
   * asked for) and the time of a request for the same revision.
   */
  request(request: Request | undefined): Promise<Ticket | undefined>;
  /** This node's entry on the record, if it holds a slot (`shard`: where its grant says it is; else its ticket is read for that). */
  holding(shard?: number): Promise<Holder | undefined>;
  /** Writes that `revision` failed its gate here; the node keeps its slot. */
  recordFailure(failure: Failure): Promise<void>;
  /**
   * Takes what the node proved of its failure of `revision` off the record: work passed its gate here after
   * the failure, and runs `proven` (`provenFailure`). No write when that proves nothing more.
   */
  clearFailure(revision: string, proven?: readonly string[]): Promise<void>;
  /**
   * Withdraws the ticket's request, then leaves the record (its shard: at most 32 holders write it, so giving
   * back costs a write whatever k is). The ticket first: once it asks for nothing the leader cannot admit the
   * node again, and an entry left behind by a stop between the two writes is dropped by the leader.
   */
  release(): Promise<void>;
  /** The failure on the record, if any (one read). */
  failure(): Promise<Failure | undefined>;
};

export function poolMember(api: LeaseApi, ref: PoolRef, capacity = shardCapacity): PoolMember {
  const name = nodeTicketName(ref.secret.name, ref.node.name);
  const shardName = (shard: number) => shardLeaseName(ref.secret.name, shard);
  const source = (shard: number) => `Lease kube-system/${shardName(shard)}`;
  /** The shard the node's grant names (0 without one). */
  const myShard = async () => {
    const lease = await api.get(name);
    return (lease && readTicket(lease, `Lease kube-system/${name}`)?.grant?.shard) ?? 0;
  };
  const readShard = async (shard: number) => readPool(await api.get(shardName(shard)), source(shard));
  const ticketBody = (current: V1Lease | undefined, annotations: Record<string, string>): V1Lease => ({
    apiVersion: "coordination.k8s.io/v1",
    kind: "Lease",
    metadata: {
      ...current?.metadata,
      name,
      labels: { ...current?.metadata?.labels, [ticketLabel]: ref.secret.name },
      annotations,
      // The garbage collector deletes a ticket with its Node: a holder whose Node is gone frees its slot.
      ownerReferences: [nodeOwner(ref.node)],
    },
    spec: { ...current?.spec, holderIdentity: ref.node.name },
  });

  async function updatePool(change: (record: PoolRecord) => PoolRecord | undefined, shard = 0, attempts?: number): Promise<void> {
    await compareAndSwap(
      api,
      shardName(shard),
      (current) => {
        const next = change(readPool(current, source(shard)));
        return next ? slotsLeaseBody(ref.secret, current, next, shard) : undefined;
      },
      undefined,
      attempts,
    );
  }

  return {
    ticketName: name,
    async ensureTicket() {
      await compareAndSwap(api, name, (current) => (current ? undefined : ticketBody(undefined, {})));
    },
    async request(request) {
      const written = await compareAndSwap(api, name, (current) => {
        const t = current ? readTicket(current, `Lease kube-system/${name}`) : undefined;
        // A grant stays while the node asks for anything (new work under its slot, too) until it gives its slot
        // back: the ticket shows that the node heard of its admission, whatever it asks for since.
        const grant = request && t?.grant && (t.grant.revision === request.revision || t.grant.stopped === undefined) ? t.grant : undefined;
        // Asked again for the same revision (an agent restart): the place in the queue is kept.
        if (request && t?.request?.revision === request.revision) request = { ...request, since: t.request.since };
        const same = JSON.stringify(t?.request) === JSON.stringify(request) && JSON.stringify(t?.grant) === JSON.stringify(grant);
        return current && same ? undefined : ticketBody(current, patchAnnotations(current?.metadata?.annotations, encodeTicket({ ...(request ? { request } : {}), ...(grant ? { grant } : {}) })));
      });
      return written ? readTicket(written, `Lease kube-system/${name}`) : undefined;
    },
    async holding(shard) {
      const s = shard ?? (await myShard());
      return (await readShard(s)).holders.find((h) => h.node === ref.node.name);
    },
    async clearFailure(revision, proven) {
      await updatePool((record) => {
        if (record.failed?.revision !== revision || record.failed.node !== ref.node.name) return undefined;
        const { failed, ...rest } = record;
        const left = provenFailure(failed, proven);
        if (!left) return rest;
        return JSON.stringify(left.changes) === JSON.stringify(failed.changes) ? undefined : { ...rest, failed: left };
      });
    },
    async recordFailure(failure) {
      await updatePool((record) => (JSON.stringify(record.failed) === JSON.stringify(failure) ? undefined : { ...record, failed: failure }));
    },
    async release() {
      let shard = 0;
      await compareAndSwap(api, name, (current) => {
        if (!current) return undefined;
        const t = readTicket(current, `Lease kube-system/${name}`);
        shard = t?.grant?.shard ?? 0;
        return t?.request || t?.grant ? ticketBody(current, patchAnnotations(current.metadata?.annotations, encodeTicket({}))) : undefined;
      });
      // While a leader runs it drops the entry of a ticket that asks for nothing, in its next pass with the
      // others: one try here, and a conflict (holders of a wave giving back together) is left to it. With no
      // leader (nobody waits) the entry is removed here, so a finished rollout's record is empty.
      const leading = (await api.get(leaderLeaseName(ref.secret.name)))?.spec?.holderIdentity;
      await updatePool((record) => (record.holders.some((h) => h.node === ref.node.name) ? withoutHolders(record, [ref.node.name]) : undefined), shard, leading ? 1 : undefined).catch((err: unknown) => {
        if (!(leading && err instanceof KubeError && err.reason === "conflict")) throw err;
      });
    },
    async failure() {
      return (await readShard(0)).failed;
    },
  };
}
