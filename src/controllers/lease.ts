// The agent's heartbeat, as gardener-node-agent keeps it (pkg/nodeagent/controller/lease): the Lease
// kube-system/gardener-node-agent-<node>, holderIdentity = its own name, renewTime moved forward every
// 10 s, so the control plane can tell a node whose agent runs from one whose agent stopped. The Node is
// its owner, so the garbage collector deletes the Lease with the Node.
//
// One request per renewal: an update carrying the resourceVersion of this controller's own last write
// (gardener-node-agent reads before every patch: two). A 409 (someone else wrote the Lease, or it exists
// already when creating) or a 404 (it was deleted) means that copy is stale: read again, write again.
// Nothing ends the loop but stop(): failures are counted, logged and reported, and the next tick retries.
import type { V1Lease, V1Node, V1OwnerReference } from "@kubernetes/client-node";
import { type CallOptions, coordinationV1 } from "../kube/api.ts";
import type { Kube } from "../kube/client.ts";
import { explainKubeError, KubeError } from "../kube/errors.ts";
import { microTime } from "../kube/micro-time.ts";
import { monotonicMs } from "../time.ts";
import { every, type Loop } from "../loops.ts";
import { describeError, type Logger } from "../log.ts";
import type { Registry } from "../metrics.ts";
import type { Controller, NodeSource, StatusBoard } from "./types.ts";

export const leaseNamespace = "kube-system";
/** gardener-node-agent's name for a node's heartbeat Lease (what Gardener's control plane looks for). */
export const leaseName = (nodeName: string) => `gardener-node-agent-${nodeName}`;

export type LeaseControllerDeps = {
  kube: Kube;
  node: NodeSource;
  log: Logger;
  metrics: Registry;
  status: StatusBoard;
  /** How often the Lease is renewed: 10 s, a quarter of the duration, as gardener-node-agent does. */
  intervalMs?: number;
  /** The Lease's leaseDurationSeconds: how long a renewal counts. */
  durationSeconds?: number;
  /** Wall clock (ms since the epoch) for renewTime, which other nodes' clocks read, and the status. */
  now?: () => number;
};

// Each 409/404 means the Lease changed under this controller; a few in a row within one tick mean
// something else keeps writing it, and the next tick tries again anyway.
const maxAttempts = 3;

export function startLeaseController(deps: LeaseControllerDeps): Controller {
  const intervalMs = deps.intervalMs ?? 10_000;
  const durationSeconds = deps.durationSeconds ?? 40;
  if (!(intervalMs > 0)) throw new Error(`lease controller: intervalMs must be positive, not ${intervalMs}`);
  if (!Number.isInteger(durationSeconds) || durationSeconds < 1) throw new Error(`lease controller: durationSeconds must be a positive integer, not ${durationSeconds}`);
  const now = deps.now ?? Date.now;
  const log = deps.log.with({ controller: "lease" });
  const coordination = coordinationV1(deps.kube);
  const renewFailures = deps.metrics.counter("trellis_lease_renew_failures_total", "Renewals of the agent's Lease that failed (the next interval tries again).");
  const lastRenewed = deps.metrics.gauge("trellis_lease_last_renew_timestamp_seconds", "renewTime of the agent's Lease as last written, in seconds since the epoch.");
  // A request that hangs (a black-holed connection) must not stall the heartbeat: it is abandoned after a
  // quarter of the lease, which leaves room for more attempts before the lease runs out.
  const requestTimeoutMs = durationSeconds * 250;
  const stopper = new AbortController();

  /** The Lease as this controller last read or wrote it: the next update starts from it. */
  let known: V1Lease | undefined;
  let lastRenew: number | undefined;
  /** When the last renewal succeeded, on the monotonic clock: its age says whether the Lease is still fresh. */
  let lastRenewMono: number | undefined;
  let failures = 0; // in a row
  let nodeGone = false;

  const report = (ok: boolean, summary: string, detail: Record<string, unknown> = {}) =>
    deps.status.set("lease", { ok, summary, lastRenew: lastRenew === undefined ? null : new Date(lastRenew).toISOString(), failures, ...detail });

  /** Creates or updates the Lease; returns the renewTime written. */
  async function renew(node: V1Node): Promise<number> {
    const name = leaseName(node.metadata?.name as string);
    const what = `renewing Lease ${leaseNamespace}/${name}`;
    const timeout = AbortSignal.timeout(requestTimeoutMs);
    const options: CallOptions = { signal: AbortSignal.any([stopper.signal, timeout]) };
    for (let attempt = 1; ; attempt++) {
      try {
        if (!known) known = await read(name, options);
        const at = now();
        const body = leaseFor(node, name, known, at);
        known = known
          ? await coordination.replaceNamespacedLease({ name, namespace: leaseNamespace, body }, options)
          : await coordination.createNamespacedLease({ namespace: leaseNamespace, body }, options);
        return at;
      } catch (err) {
        if (timeout.aborted) throw new KubeError(`${what}: no answer from ${deps.kube.server} within ${requestTimeoutMs / 1000} s`, "unreachable", undefined, { cause: err });
        const e = explainKubeError(err, { server: deps.kube.server, caSource: deps.kube.caSource, what });
        if ((e.reason !== "conflict" && e.reason !== "not-found") || attempt >= maxAttempts) throw e;
        log.debug("the Lease changed under this controller; reading it again", { error: e.message });
        known = undefined;
      }
    }
  }

  async function read(name: string, options: CallOptions): Promise<V1Lease | undefined> {
    try {
      return await coordination.readNamespacedLease({ name, namespace: leaseNamespace }, options);
    } catch (err) {
      if (explainKubeError(err, { server: deps.kube.server, caSource: deps.kube.caSource, what: `reading Lease ${leaseNamespace}/${name}` }).reason === "not-found") return undefined;
      throw err;
    }
  }

  function leaseFor(node: V1Node, name: string, base: V1Lease | undefined, at: number): V1Lease {
    // controller: true without blockOwnerDeletion: the latter needs `update` on nodes/finalizers where
    // the OwnerReferencesPermissionEnforcement admission plugin runs, and only matters for a foreground
    // deletion of the Node.
    const owner: V1OwnerReference = { apiVersion: "v1", kind: "Node", name: node.metadata?.name as string, uid: node.metadata?.uid as string, controller: true };
    return {
      apiVersion: "coordination.k8s.io/v1",
      kind: "Lease",
      // base carries the resourceVersion: the update is refused (409) if the Lease changed since.
      // managedFields stay out: the API server keeps them when an update omits them, and they were
      // 40 % of every renewal's body (bun run bench:trace).
      metadata: { ...base?.metadata, managedFields: undefined, name, namespace: leaseNamespace, ownerReferences: [owner] },
      // The whole spec, as gardener-node-agent writes it.
      spec: { holderIdentity: name, leaseDurationSeconds: durationSeconds, renewTime: microTime(new Date(at)) },
    };
  }

  async function tick(): Promise<void> {
    const node = deps.node.current();
    if (!node) {
      // Renewing would create the Lease again, for the garbage collector to delete again.
      if (!nodeGone) log.warn("the Node is gone; not renewing its Lease until it is back");
      nodeGone = true;
      known = undefined;
      return report(false, "the Node is gone (deleted); not renewing its Lease");
    }
    nodeGone = false;
    try {
      const at = await renew(node);
      if (lastRenew === undefined) log.info("renewing the Lease", { lease: `${leaseNamespace}/${leaseName(node.metadata?.name as string)}`, intervalMs, durationSeconds });
      else if (failures > 0) log.info("renewed the Lease again", { failuresBefore: failures });
      lastRenew = at;
      lastRenewMono = monotonicMs();
      failures = 0;
      lastRenewed.set(at / 1000);
      report(true, `renewed at ${new Date(at).toISOString()}, every ${intervalMs / 1000} s (lease ${durationSeconds} s)`);
    } catch (err) {
      if (stopper.signal.aborted) return;
      failures++;
      renewFailures.inc();
      const error = describeError(err);
      log.warn("could not renew the Lease; trying again at the next interval", { error, failuresInARow: failures });
      const age = lastRenewMono === undefined ? undefined : (monotonicMs() - lastRenewMono) / 1000;
      const fresh = age !== undefined && age <= durationSeconds;
      report(fresh, `${age === undefined ? "never renewed" : `last renewed ${Math.round(age)} s ago`}; ${failures} failure(s) in a row: ${error}`, { error });
    }
  }

  let loop: Loop | undefined;
  async function run(): Promise<void> {
    report(false, "waiting for the Node to be registered");
    const stopped = new Promise<undefined>((resolve) => stopper.signal.addEventListener("abort", () => resolve(undefined), { once: true }));
    if (!(await Promise.race([deps.node.found, stopped]))) return;
    // A steady cadence: the time a renewal took counts towards the interval.
    loop = every(intervalMs, tick, { steady: true });
  }

  const running = run();
  return {
    async stop() {
      stopper.abort();
      await running;
      await loop?.stop();
    },
  };
}

