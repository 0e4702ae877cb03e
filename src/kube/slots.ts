// Disruption slots of a pool: k Leases `<secret>-slot-<i>` in the Secret's namespace, labelled with the
// pool and owned by the Secret (collected with it). A node takes one before a disruptive apply and gives
// it back once its health gate passed; its holderIdentity is the node, the annotation
// rollout.trellis.dev/checksum the OSC it took the slot for. Every write carries the resourceVersion it
// was decided on: a 409 means another node was first, and the answer is to look again.
//
// A slot whose holder stopped renewing is NOT free: it is taken over only when `reclaimable` says it is
// safe (the holder's Node is gone, or back Ready with the slot's OSC applied), so a change that kills
// nodes stops at k of them instead of walking on as each dead holder's lease runs out. A change that
// failed its health gate is recorded on its slot (rollout.trellis.dev/failed-checksum), and no node
// takes a slot for it any more, even after the failed node rolled back and gave its slot back: a bad
// change stops at the first node that shows it is bad. An operator frees a slot by deleting its Lease.
import { CoordinationV1Api, type V1Lease, type V1OwnerReference } from "@kubernetes/client-node";
import type { Logger } from "../log.ts";
import { apiClient, type Kube } from "./client.ts";
import { explainKubeError, KubeError } from "./errors.ts";
import { microTime, timeOf } from "./micro-time.ts";

export const slotPoolLabel = "rollout.trellis.dev/pool";
export const slotChecksumAnnotation = "rollout.trellis.dev/checksum";
/** A change that failed its health gate on the node that held this slot: the pool stops taking it. */
export const slotFailedChecksumAnnotation = "rollout.trellis.dev/failed-checksum";
export const slotFailureAnnotation = "rollout.trellis.dev/failure";

export type SlotFailure = { slot: string; checksum: string; failure: string };

export type SlotHolder = { slot: string; node: string; checksum: string; acquired?: string; renewed?: string; expired: boolean };

export type SlotDecision =
  | { held: true; slot: string; reclaimedFrom?: SlotHolder }
  | { held: false; holders: SlotHolder[]; stopped?: SlotFailure };

export type Slots = {
  /**
   * Takes a slot for `checksum` among the first `k` (the one this node holds already, else a free one,
   * else one whose dead holder `reclaimable` lets go); else says who holds them.
   */
  acquire(k: number, checksum: string, reclaimable: (h: SlotHolder) => Promise<boolean>): Promise<SlotDecision>;
  /** Renews the slot (and the checksum it is held for, if given); throws KubeError("conflict") if it is no longer this node's. */
  renew(slot: string, checksum?: string): Promise<void>;
  /** Gives the slot back if this node holds it. */
  release(slot: string): Promise<void>;
  /** Records on the slot that `checksum` failed its health gate here (`failure` says how): no node takes a slot for it any more. */
  markFailed(slot: string, checksum: string, failure: string): Promise<void>;
  /** Every slot Lease of the pool, held or not. */
  list(): Promise<SlotHolder[]>;
};

export const slotName = (secret: string, i: number) => `${secret}-slot-${i}`;

/** Who holds a slot Lease (node "" when free), for which OSC, and whether the holder stopped renewing it by `now` (wall clock: renewTime is another node's). */
export function slotHolder(l: V1Lease, now: Date): SlotHolder {
  const renewedMs = timeOf(l.spec?.renewTime);
  const renewed = renewedMs === undefined ? undefined : new Date(renewedMs);
  return {
    slot: l.metadata?.name as string,
    node: l.spec?.holderIdentity ?? "",
    checksum: l.metadata?.annotations?.[slotChecksumAnnotation] ?? "",
    ...(l.spec?.acquireTime ? { acquired: String(l.spec.acquireTime) } : {}),
    ...(renewed ? { renewed: renewed.toISOString() } : {}),
    expired: !renewed || renewed.getTime() + (l.spec?.leaseDurationSeconds ?? 0) * 1000 < now.getTime(),
  };
}

export function createSlots(opts: {
  kube: Kube;
  secret: { name: string; namespace: string; uid: string };
  identity: string;
  log: Logger;
  durationSeconds?: number;
  now?: () => Date;
}): Slots {
  const { kube, secret, identity } = opts;
  const duration = opts.durationSeconds ?? 40;
  const now = opts.now ?? (() => new Date());
  const coordination = apiClient(kube, CoordinationV1Api);
  const log = opts.log.with({ slots: `${secret.namespace}/${secret.name}` });
  const owner: V1OwnerReference = { apiVersion: "v1", kind: "Secret", name: secret.name, uid: secret.uid, controller: true };
  const explain = (err: unknown, what: string) => explainKubeError(err, { server: kube.server, caSource: kube.caSource, what });

  const holderOf = (l: V1Lease): SlotHolder => slotHolder(l, now());

  async function leases(): Promise<V1Lease[]> {
    try {
      return (await coordination.listNamespacedLease({ namespace: secret.namespace, labelSelector: `${slotPoolLabel}=${secret.name}` })).items;
    } catch (err) {
      throw explain(err, `listing the disruption slots of ${secret.name}`);
    }
  }

  const claimed = (lease: V1Lease | undefined, name: string, checksum: string): V1Lease => {
    const at = microTime(now());
    return {
      apiVersion: "coordination.k8s.io/v1",
      kind: "Lease",
      metadata: {
        ...lease?.metadata,
        name,
        namespace: secret.namespace,
        labels: { ...lease?.metadata?.labels, [slotPoolLabel]: secret.name },
        annotations: { ...lease?.metadata?.annotations, [slotChecksumAnnotation]: checksum },
        ownerReferences: [owner],
      },
      spec: { holderIdentity: identity, leaseDurationSeconds: duration, acquireTime: at, renewTime: at, leaseTransitions: (lease?.spec?.leaseTransitions ?? 0) + (lease ? 1 : 0) },
    };
  };

  /** Writes a claim on slot `name` (creating it if `lease` is undefined); false when another node was first. */
  async function claim(lease: V1Lease | undefined, name: string, checksum: string): Promise<boolean> {
    try {
      if (lease) await coordination.replaceNamespacedLease({ name, namespace: secret.namespace, body: claimed(lease, name, checksum) });
      else await coordination.createNamespacedLease({ namespace: secret.namespace, body: claimed(undefined, name, checksum) });
      return true;
    } catch (err) {
      const e = explain(err, `taking disruption slot ${name}`);
      // 409: changed meanwhile, or created by another node (AlreadyExists); 404: deleted meanwhile.
      if (e.reason === "conflict" || e.reason === "not-found") return false;
      throw e;
    }
  }

  async function acquire(k: number, checksum: string, reclaimable: (h: SlotHolder) => Promise<boolean>): Promise<SlotDecision> {
    for (let attempt = 0; attempt < 5; attempt++) {
      const all = await leases();
      const failedHere = all.find((l) => l.metadata?.annotations?.[slotFailedChecksumAnnotation] === checksum);
      if (failedHere) {
        const stopped = { slot: failedHere.metadata?.name as string, checksum, failure: failedHere.metadata?.annotations?.[slotFailureAnnotation] ?? "" };
        return { held: false, holders: all.filter((l) => l.spec?.holderIdentity).map(holderOf), stopped };
      }
      const byName = new Map(all.map((l) => [l.metadata?.name as string, l]));
      const mine = all.find((l) => l.spec?.holderIdentity === identity);
      if (mine) {
        await renew(mine.metadata?.name as string, checksum);
        return { held: true, slot: mine.metadata?.name as string };
      }
      // Slots beyond k (k was lowered) still count while held: their holders are disrupted too.
      const busy = all.filter((l) => (l.spec?.holderIdentity ?? "") !== "").length;
      if (busy >= k && !all.some((l) => l.spec?.holderIdentity && holderOf(l).expired)) return { held: false, holders: all.filter((l) => l.spec?.holderIdentity).map(holderOf) };
      // Start at a different slot on each node, so that nodes waiting together do not all race for slot 0.
      const start = [...identity].reduce((h, c) => (h * 31 + c.charCodeAt(0)) >>> 0, 0) % k;
      let raced = false;
      for (let j = 0; j < k; j++) {
        const name = slotName(secret.name, (start + j) % k);
        const lease = byName.get(name);
        const holder = lease ? holderOf(lease) : undefined;
        if (!lease || holder?.node === "") {
          if (busy >= k) continue;
          if (await claim(lease, name, checksum)) {
            log.info("took a disruption slot", { slot: name, checksum });
            return { held: true, slot: name };
          }
          raced = true;
        } else if (holder?.expired && (await reclaimable(holder))) {
          if (await claim(lease, name, checksum)) {
            log.warn("took over a disruption slot whose holder stopped renewing it and is safe to reclaim", { slot: name, from: holder.node, heldFor: holder.checksum });
            return { held: true, slot: name, reclaimedFrom: holder };
          }
          raced = true;
        }
      }
      if (!raced) return { held: false, holders: all.filter((l) => l.spec?.holderIdentity).map(holderOf) };
    }
    return { held: false, holders: (await leases()).filter((l) => l.spec?.holderIdentity).map(holderOf) };
  }

  async function read(name: string): Promise<V1Lease | undefined> {
    try {
      return await coordination.readNamespacedLease({ name, namespace: secret.namespace });
    } catch (err) {
      const e = explain(err, `reading disruption slot ${name}`);
      if (e.reason === "not-found") return undefined;
      throw e;
    }
  }

  async function renew(name: string, checksum?: string): Promise<void> {
    const what = `renewing disruption slot ${name} for ${identity}`;
    const lease = await read(name);
    if (!lease || lease.spec?.holderIdentity !== identity) {
      throw new KubeError(`${what}: no longer held by ${identity}: ${!lease ? "the Lease was deleted (freed by an operator?)" : `${lease.spec?.holderIdentity || "nobody"} holds it now`}`, "conflict");
    }
    const body: V1Lease = {
      ...lease,
      metadata: { ...lease.metadata, annotations: { ...lease.metadata?.annotations, ...(checksum !== undefined ? { [slotChecksumAnnotation]: checksum } : {}) } },
      spec: { ...lease.spec, acquireTime: lease.spec?.acquireTime, renewTime: microTime(now()) },
    };
    try {
      await coordination.replaceNamespacedLease({ name, namespace: secret.namespace, body });
    } catch (err) {
      throw explain(err, what);
    }
  }

  async function release(name: string): Promise<void> {
    const lease = await read(name);
    if (!lease || lease.spec?.holderIdentity !== identity) return;
    try {
      await coordination.replaceNamespacedLease({ name, namespace: secret.namespace, body: { ...lease, spec: { ...lease.spec, holderIdentity: undefined } } });
      log.info("gave back the disruption slot", { slot: name });
    } catch (err) {
      const e = explain(err, `giving back disruption slot ${name}`);
      // Changed meanwhile: look again; a slot taken from this node is not this node's to give back.
      if (e.reason === "conflict") return release(name);
      throw e;
    }
  }

  async function markFailed(name: string, checksum: string, failure: string): Promise<void> {
    const lease = await read(name);
    if (!lease) return;
    const annotations = { ...lease.metadata?.annotations, [slotFailedChecksumAnnotation]: checksum, [slotFailureAnnotation]: failure.slice(0, 1024) };
    try {
      await coordination.replaceNamespacedLease({ name, namespace: secret.namespace, body: { ...lease, metadata: { ...lease.metadata, annotations } } });
    } catch (err) {
      const e = explain(err, `recording the failed change on disruption slot ${name}`);
      if (e.reason === "conflict") return markFailed(name, checksum, failure);
      throw e;
    }
  }

  return { acquire, renew, release, markFailed, list: async () => (await leases()).map(holderOf) };
}
