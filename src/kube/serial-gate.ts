// Serial OSC rollout, as gardener-node-agent does it (pkg/nodeagent/controller/operatingsystemconfig/
// serial.go): when the OSC Secret carries the serial annotation, a node applies a new OSC only while it
// holds a Lease named after the Secret, in the Secret's namespace, so nodes of a pool apply one at a time.
// The Lease's controller ownerReference is the Secret, so the garbage collector deletes the two together.
//
// Every write carries the resourceVersion it was decided on; a 409 means another node wrote first, and
// the answer is to read again and decide again. Expiry is judged from the holder's renewTime on this
// node's clock, as gardener-node-agent does: clocks skewed by more than the lease duration would break
// the exclusion, which NTP-synchronised nodes and a 600 s lease make a non-issue.
import type { V1Lease, V1OwnerReference } from "@kubernetes/client-node";
import type { Logger } from "../log.ts";
import { coordinationV1 } from "./api.ts";
import type { Kube } from "./client.ts";
import { explainKubeError, KubeError } from "./errors.ts";
import { keepMicroTime, microTime, timeOf } from "./micro-time.ts";
import { serializer } from "../loops.ts";

export const serialAnnotation = "reconciliation.osc.node-agent.gardener.cloud/serial";

/** Whether the OSC Secret asks for a serial rollout (the annotation's value is exactly "true", as in gardener-node-agent). */
export function isSerialRollout(secret: { metadata?: { annotations?: Record<string, string> } }): boolean {
  return secret.metadata?.annotations?.[serialAnnotation] === "true";
}

export type GateDecision = { held: true } | { held: false; holder: string; retryAfterMs: number };

export type SerialGate = {
  /** Takes the lease if free, expired or already ours (renewing it); else reports the active holder and when it expires (retryAfterMs, capped so a released lease is noticed soon). */
  acquire(): Promise<GateDecision>;
  /** Renews while held; throws KubeError("conflict") if the lease was taken over, released or deleted meanwhile. */
  renew(): Promise<void>;
  /** Clears holderIdentity if we hold it (the Lease itself stays); no-op otherwise. */
  release(): Promise<void>;
};

const defaultDurationSeconds = 600;
const defaultMaxRetryAfterMs = 30_000;
// Each 409 means another writer made progress; a handful in a row means something is wrong.
const maxAttempts = 5;

export function createSerialGate(opts: {
  kube: Kube;
  secret: { name: string; namespace: string; uid: string };
  /** The Lease's holderIdentity: the host's name, as gardener-node-agent's (src/controllers/osc/serial.ts). */
  identity: string;
  log: Logger;
  durationSeconds?: number;
  /** Upper bound of a "not held" decision's retryAfterMs (30 s): a holder that releases early is noticed within it. */
  maxRetryAfterMs?: number;
  now?: () => Date;
}): SerialGate {
  const { kube, secret, identity } = opts;
  const durationSeconds = opts.durationSeconds ?? defaultDurationSeconds;
  const maxRetryAfterMs = opts.maxRetryAfterMs ?? defaultMaxRetryAfterMs;
  const now = opts.now ?? (() => new Date());
  const ref = `${secret.namespace}/${secret.name}`;
  // An empty holderIdentity is how a free lease looks.
  if (identity === "") throw new Error(`serial lease ${ref}: the identity (the host's name) must not be empty`);
  if (!Number.isInteger(durationSeconds) || durationSeconds < 1) throw new Error(`serial lease ${ref}: durationSeconds must be a positive integer, not ${durationSeconds}`);
  const log = opts.log.with({ lease: ref, identity });
  const coordination = coordinationV1(kube);
  const owner: V1OwnerReference = { apiVersion: "v1", kind: "Secret", name: secret.name, uid: secret.uid, controller: true };

  /** The Lease as last read or written by this gate: renew and release start from it. */
  let known: V1Lease | undefined;

  const explain = (err: unknown, what: string) => explainKubeError(err, { server: kube.server, caSource: kube.caSource, what });

  async function read(what: string): Promise<V1Lease | undefined> {
    try {
      return await coordination.readNamespacedLease({ name: secret.name, namespace: secret.namespace });
    } catch (err) {
      const e = explain(err, what);
      if (e.reason === "not-found") return undefined;
      throw e;
    }
  }

  /**
   * Runs `step` on the current Lease. A write refused with 409 (another writer was first) or 404 (the
   * Lease was deleted meanwhile) means the decision was made on a stale Lease: read it again, decide again.
   */
  async function decide<T>(what: string, fresh: boolean, step: (lease: V1Lease | undefined) => Promise<T>): Promise<T> {
    let lease = fresh ? await read(what) : (known ?? (await read(what)));
    for (let attempt = 1; ; attempt++) {
      try {
        return await step(lease);
      } catch (err) {
        // The step's own verdicts are final; only the API's answers are explained and maybe retried.
        if (err instanceof KubeError) throw err;
        const e = explain(err, what);
        if ((e.reason !== "conflict" && e.reason !== "not-found") || attempt >= maxAttempts) {
          known = undefined;
          throw e;
        }
        log.debug("the serial lease changed under this decision; reading it again", { err: e });
        lease = await read(what);
      }
    }
  }

  const holderOf = (lease: V1Lease | undefined) => lease?.spec?.holderIdentity ?? "";

  async function acquire(): Promise<GateDecision> {
    // Always from a fresh read: other nodes write this Lease, so what this gate last saw is likely stale.
    return decide(`acquiring serial lease ${ref} for ${identity}`, true, async (lease) => {
      const at = now();
      if (!lease) {
        known = await coordination.createNamespacedLease({ namespace: secret.namespace, body: newLease(at) });
        log.info("acquired the serial lease (created it)", { resourceVersion: known.metadata?.resourceVersion });
        return { held: true };
      }
      const holder = holderOf(lease);
      if (holder !== "" && holder !== identity) {
        const left = expiresAt(lease) - at.getTime();
        if (left > 0) {
          known = lease;
          return { held: false, holder, retryAfterMs: Math.min(maxRetryAfterMs, left) };
        }
        log.warn("taking over the serial lease: its holder did not renew it in time", { holder, renewTime: lease.spec?.renewTime ?? null });
      }
      const mine = holder === identity;
      const spec = lease.spec ?? {};
      known = await replace({
        ...lease,
        metadata: { ...lease.metadata, ownerReferences: withOwner(lease.metadata?.ownerReferences) },
        spec: {
          ...spec,
          holderIdentity: identity,
          leaseDurationSeconds: durationSeconds,
          acquireTime: mine && spec.acquireTime ? keepMicroTime(spec.acquireTime) : microTime(at),
          renewTime: microTime(at),
          leaseTransitions: (spec.leaseTransitions ?? 0) + (mine ? 0 : 1),
        },
      });
      if (!mine) log.info("acquired the serial lease", { resourceVersion: known.metadata?.resourceVersion, previousHolder: holder });
      return { held: true };
    });
  }

  function renew(): Promise<void> {
    const what = `renewing serial lease ${ref} for ${identity}`;
    return decide(what, false, async (lease) => {
      const holder = holderOf(lease);
      if (!lease || holder !== identity) {
        known = lease;
        const why = !lease ? "the Lease is gone" : holder === "" ? "it was released" : `${holder} holds it now`;
        throw new KubeError(`${what}: no longer held by ${identity}: ${why}`, "conflict");
      }
      const spec = lease.spec ?? {};
      known = await replace({ ...lease, spec: { ...spec, acquireTime: keepMicroTime(spec.acquireTime), renewTime: microTime(now()) } });
    });
  }

  function release(): Promise<void> {
    return decide(`releasing serial lease ${ref} for ${identity}`, false, async (lease) => {
      if (!lease || holderOf(lease) !== identity) {
        known = lease;
        return;
      }
      const spec = lease.spec ?? {};
      // Only the holder goes: the times stay as a record of the last turn, the Lease stays for the next.
      known = await replace({ ...lease, spec: { ...spec, holderIdentity: undefined, acquireTime: keepMicroTime(spec.acquireTime), renewTime: keepMicroTime(spec.renewTime) } });
      log.info("released the serial lease", { resourceVersion: known.metadata?.resourceVersion });
    });
  }

  function newLease(at: Date): V1Lease {
    return {
      apiVersion: "coordination.k8s.io/v1",
      kind: "Lease",
      metadata: { name: secret.name, namespace: secret.namespace, ownerReferences: [owner] },
      spec: { holderIdentity: identity, leaseDurationSeconds: durationSeconds, acquireTime: microTime(at), renewTime: microTime(at), leaseTransitions: 0 },
    };
  }

  /** An update that fails with 409 unless the Lease is still at the resourceVersion it was built from. */
  function replace(body: V1Lease): Promise<V1Lease> {
    return coordination.replaceNamespacedLease({ name: secret.name, namespace: secret.namespace, body });
  }

  /**
   * Our Secret as the controller owner. A Lease left by an earlier Secret of the same name (deleted and
   * created again before the garbage collector caught up, or deleted with orphaning) would otherwise be
   * deleted under the next holder, or never be collected.
   */
  function withOwner(refs: V1OwnerReference[] | undefined): V1OwnerReference[] {
    const kept = (refs ?? []).filter((r) => !(r.kind === "Secret" && r.name === secret.name && r.uid !== secret.uid));
    if (kept.some((r) => r.uid === secret.uid)) return kept;
    // An object has at most one controller: one that someone else set stays, and ours is a plain owner.
    return [...kept, kept.some((r) => r.controller) ? { ...owner, controller: undefined } : owner];
  }

  // One operation at a time: they share `known`, and a renew racing a release would undo it.
  const ops = serializer();
  return {
    acquire: () => ops.run(acquire),
    renew: () => ops.run(renew),
    release: () => ops.run(release),
  };
}

/**
 * When the holder's claim runs out, in ms since the epoch: renewTime + leaseDurationSeconds. A lease
 * without either (or with a time that does not parse) is treated as expired, as gardener-node-agent does.
 */
function expiresAt(lease: V1Lease): number {
  const renewed = timeOf(lease.spec?.renewTime);
  const seconds = lease.spec?.leaseDurationSeconds ?? 0;
  return renewed === undefined || seconds < 0 ? Number.NEGATIVE_INFINITY : renewed + seconds * 1000;
}
