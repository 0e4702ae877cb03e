// In-place node updates on the node, coordinated with machine-controller-manager as gardener-node-agent
// does: MCM drains the node and sets the Node condition InPlaceUpdate with reason ReadyForUpdate; the
// agent then updates the node, deletes the Pods the drain left on it (src/kube/pods.ts) and labels it
// update-result=successful (or failed, with the reason in an annotation, the Pods left alone), which MCM
// turns into the Machine's phase. Until then the OSC is not reported as applied. As gardener-node-agent,
// every reconcile that applies a new OSC of an in-place pool ends so, whether or not that OSC asks for
// in-place work: an OSC that reverts a failed update's version, say, tells MCM the node is fine again.
import type { V1Node } from "@kubernetes/client-node";
import { parseOscBytes } from "../api/desired.ts";
import { type InPlaceChanges, inPlaceStatePath, InPlaceStateSchema } from "../api/in-place-state.ts";
import type { OperatingSystemConfig } from "../api/osc.ts";
import { kubelet, paths } from "../api/paths.ts";
import type { Result } from "../api/result.ts";
import { jsonStore } from "../host/json-store.ts";
import { machineBoot } from "../host/boot-clock.ts";
import type { Files } from "../host/files.ts";
import type { Systemd } from "../host/systemd.ts";
import { type CaRef, renderKubeconfig } from "../kube/csr-kubeconfig.ts";
import { carryOver, hasInPlaceChanges, inPlaceChanges, noInPlaceChanges, partsOf } from "../plan/in-place.ts";
import { abortableSleep } from "../time.ts";
import { describeError } from "../log.ts";
import { defaultKubeletHealthz, kubeletHealthz } from "./health.ts";
import type { CertificateController } from "./certificate.ts";
import { createOsUpdater, nodeOsVersion, type OsUpdate, type OsUpdateOutcome, osUpdateRetry, updateFailedReason, updatingOsVersion } from "./os-update.ts";
import type { TokenController } from "./token.ts";
import type { NodeSource } from "./types.ts";
import type { Kube } from "../kube/client.ts";
import { patchNodeMetadata, readNode } from "../kube/node.ts";
import { deletePodsOnNode } from "../kube/pods.ts";
import type { Logger } from "../log.ts";

export type { OsUpdate } from "./os-update.ts";

/** machine-controller-manager's Node condition, reason, label and annotation (pkg/apis/machine/v1alpha1). */
const machineUpdate = {
  condition: "InPlaceUpdate",
  readyForUpdate: "ReadyForUpdate",
  resultLabel: "node.machine.sapcloud.io/update-result",
  successful: "successful",
  failed: "failed",
  failedReason: updateFailedReason,
  /** gardener-node-agent's own mark of an OS update it started; cleared with the result. */
  updatingOsVersion,
} as const;

/** The in-place work `osc` asks of this node: against the last applied OSC and the node's OS version. */
async function inPlaceChangesOnNode(files: Files, osc: OperatingSystemConfig, source: string): Promise<Result<InPlaceChanges>> {
  if (!osc.spec.inPlaceUpdates) return { ok: true, value: noInPlaceChanges };
  const lastBytes = await files.read(paths.lastAppliedOsc);
  if (!lastBytes) return { ok: true, value: noInPlaceChanges };
  const last = parseOscBytes(lastBytes, paths.lastAppliedOsc);
  if (!last.ok) return last;
  return inPlaceChanges(last.value, osc, await nodeOsVersion(files), source);
}

/** Whether machine-controller-manager has drained the node for its in-place update. */
export const readyForUpdate = (node: V1Node | undefined): boolean =>
  node?.status?.conditions?.some((c) => c.type === machineUpdate.condition && c.reason === machineUpdate.readyForUpdate) ?? false;

/** The Node metadata that tells machine-controller-manager the in-place update failed, and why. */
const updateFailed = (reason: string) => ({ labels: { [machineUpdate.resultLabel]: machineUpdate.failed }, annotations: { [machineUpdate.failedReason]: reason } });

/** The Node metadata that tells machine-controller-manager the in-place update succeeded. */
const updateSucceeded = {
  labels: { [machineUpdate.resultLabel]: machineUpdate.successful },
  annotations: { [machineUpdate.failedReason]: null, [machineUpdate.updatingOsVersion]: null },
};

/**
 * Whether this reconcile ends as gardener-node-agent's in-place reconcile does (performInPlaceUpdate):
 * it applies an OSC of an in-place pool (spec.inPlaceUpdates) that the Node does not carry as applied.
 */
export const endsInPlace = (osc: OperatingSystemConfig, nodeApplied: string | undefined, checksum: string): boolean =>
  Boolean(osc.spec.inPlaceUpdates) && nodeApplied !== checksum;

/** Whether machine-controller-manager waits for this node's result (gardener-node-agent's test). */
export function awaitsResult(node: V1Node | undefined): boolean {
  const result = node?.metadata?.labels?.[machineUpdate.resultLabel];
  return (readyForUpdate(node) && result !== machineUpdate.successful) || result === machineUpdate.failed;
}

/** An in-place update waits for the drain, unless its last attempt failed (then it is retried at once). */
export const mayUpdateInPlace = (node: V1Node | undefined): boolean => readyForUpdate(node) || node?.metadata?.labels?.[machineUpdate.resultLabel] === machineUpdate.failed;

const createInPlaceStore = (files: Files) => jsonStore(files, inPlaceStatePath, InPlaceStateSchema, () => ({}));

/** How long kubelet may take to answer /healthz after its in-place update, and how often it is asked (gardener-node-agent's). */
const kubeletHealthTimeoutMs = 5 * 60_000;
const kubeletHealthIntervalMs = 5_000;

/** Undefined once kubelet answers `url` healthy; else why not, when the timeout passed or `signal` aborted. */
async function waitKubeletHealthy(url: string, signal: AbortSignal, now: () => number = performance.now.bind(performance)): Promise<string | undefined> {
  const deadline = now() + kubeletHealthTimeoutMs;
  let last = "";
  while (!signal.aborted) {
    try {
      await kubeletHealthz(url, kubeletHealthIntervalMs);
      return undefined;
    } catch (err) {
      last = describeError(err);
    }
    if (now() >= deadline) return `kubelet is not healthy ${kubeletHealthTimeoutMs / 1000} s after its in-place update: ${last}`;
    await abortableSleep(kubeletHealthIntervalMs, signal);
  }
  return `stopped waiting for kubelet's health: ${String(signal.reason)}`;
}

const kubeletPki = "/var/lib/kubelet/pki";

/**
 * After a certificate authority rotation, kubelet asks for a client certificate of the new CA, as
 * gardener-node-agent makes it: its current certificate becomes its bootstrap credential (with the
 * API server's new CA bundle), its kubeconfig and certificates go, and it restarts — then it bootstraps,
 * authenticated as itself, and kube-controller-manager approves and signs (selfnodeclient).
 */
async function rebootstrapKubelet(files: Files, systemd: Pick<Systemd, "restart">, apiServer: { server: string; ca: CaRef }): Promise<void> {
  const current = await files.read(kubelet.clientCertificate);
  if (current && (await files.read(kubelet.realKubeconfig))) {
    const pem = new TextDecoder().decode(current);
    await files.writeAtomic(kubelet.bootstrapKubeconfig, renderKubeconfig({ server: apiServer.server, ca: apiServer.ca, certPem: pem, keyPem: pem }), 0o600);
  }
  if (!(await files.stat(kubelet.bootstrapKubeconfig))) throw new Error(`${kubelet.bootstrapKubeconfig} does not exist: kubelet cannot bootstrap again`);
  await files.remove(kubelet.realKubeconfig);
  for (const name of await files.list(kubeletPki)) await files.remove(`${kubeletPki}/${name}`);
  await files.removeDirIfEmpty(kubeletPki);
  await systemd.restart("kubelet.service");
}

export type InPlaceUpdaterDeps = {
  kube: Kube;
  files: Files;
  systemd: Pick<Systemd, "restart">;
  node: NodeSource;
  log: Logger;
  /** The token files, brought in line after a service-account key rotation. */
  tokens: Pick<TokenController, "resync">;
  /** The agent's own certificate, renewed after a CA rotation (none: the agent has none to renew). */
  certificate: Pick<CertificateController, "renewNow"> | undefined;
  /** What kubelet's bootstrap kubeconfig names after a CA rotation. */
  apiServer: { server: string; ca: CaRef };
  /** Aborts the waits (kubelet's health, the OS update command) when the agent stops. */
  signal: AbortSignal;
  /** This boot of the machine (default: machineBoot), and the OS update command's retries: tests set them. */
  boot?: () => string;
  osUpdateRetry?: typeof osUpdateRetry;
};

/**
 * What is left of an in-place update after its apply: failed (`final`: not tried again for this OSC's
 * OS version; `told`: the Node says so already), waiting for the machine to restart, cut short because
 * the agent stops or the machine shuts down (no failure: the next start finishes it), or done (undefined).
 */
export type InPlaceOutcome = OsUpdateOutcome;

/** The node's side of in-place updates; the OSC controller reports what it says. */
export function createInPlaceUpdater(deps: InPlaceUpdaterDeps) {
  const store = createInPlaceStore(deps.files);
  const os = createOsUpdater({ ...deps, store, boot: deps.boot ?? machineBoot, ...(deps.osUpdateRetry ? { retry: deps.osUpdateRetry } : {}) });
  const failed = (why: string | undefined): InPlaceOutcome => (why === undefined ? undefined : { failed: why, final: false });

  /**
   * The in-place work `osc` (as `checksum`) asks of this node; once begun, what is left of it (each part is
   * recorded done as it is, as gardener-node-agent records it: a crash, or a failure after it, does not do
   * it again). What an unfinished update of an older OSC left undone is owed by this one (carryOver).
   */
  async function work(osc: OperatingSystemConfig, checksum: string, source: string): Promise<Result<InPlaceChanges>> {
    const pending = (await store.read()).pending;
    if (pending?.checksum === checksum) return { ok: true, value: pending.changes };
    const changes = await inPlaceChangesOnNode(deps.files, osc, source);
    return changes.ok && pending && osc.spec.inPlaceUpdates ? { ok: true, value: carryOver(pending.changes, changes.value) } : changes;
  }

  /** Why an in-place update waits before anything else (machine-controller-manager has not drained the node); undefined once drained. */
  function awaitDrain(changes: InPlaceChanges): string | undefined {
    const what = partsOf(changes).map((p) => p.what).join(", ");
    return mayUpdateInPlace(deps.node.current()) ? undefined : `${what} in place waits for machine-controller-manager to drain the node (Node condition InPlaceUpdate, reason ReadyForUpdate)`;
  }

  /** Right before an admitted in-place update is applied: it is recorded (the apply records the OSC as applied, its in-place work is not done yet). */
  async function begin(checksum: string, changes: InPlaceChanges): Promise<void> {
    const state = await store.read();
    if (state.pending?.checksum !== checksum) await store.write({ ...state, pending: { checksum, changes } });
    deps.log.info("updating the node in place", { checksum, update: partsOf(changes).map((p) => p.what).join(", ") });
  }

  /** Records parts of the update `checksum` as done. */
  async function done(checksum: string, parts: (keyof InPlaceChanges)[]): Promise<void> {
    const state = await store.read();
    if (state.pending?.checksum !== checksum) return;
    const changes = { ...state.pending.changes };
    for (const part of parts) {
      if (part === "operatingSystem" || part === "kubeletMinorVersion") delete changes[part];
      else changes[part] = false;
    }
    await store.write({ ...state, pending: { checksum, changes } });
  }

  /**
   * After the apply of a new OSC of an in-place pool (endsInPlace): the rest of its in-place work, if any, in
   * gardener-node-agent's order; then, whatever the work was, machine-controller-manager is told the result
   * if it waits for one.
   */
  async function finish(checksum: string, changes: InPlaceChanges, osUpdate: OsUpdate | null | undefined): Promise<InPlaceOutcome> {
    const outcome = await perform(checksum, changes, osUpdate);
    // A wait or command cut short by the agent's stop says nothing about the update: it stays pending.
    if (deps.signal.aborted) return { stopped: `the agent stopped before the update was finished (${describeError(deps.signal.reason)})` };
    const name = deps.node.current()?.metadata?.name;
    if (outcome && "failed" in outcome) {
      if (name && !outcome.told && outcome.tried !== false) await patchNodeMetadata(deps.kube, name, updateFailed(outcome.failed));
      return outcome;
    }
    if (outcome) return outcome;
    // Confirmed on the Node as it is now: the watch's copy may not show this agent's report of a moment ago
    // yet, and the Pods that report restarted would be deleted again.
    if (name && awaitsResult(deps.node.current()) && awaitsResult(await readNode(deps.kube, name))) {
      // As gardener-node-agent: what the drain left on the node goes before the node is reported updated. A
      // failure here is a reconcile error, retried (the update itself is done: no update-result=failed).
      const deleted = await deletePodsOnNode(deps.kube, name).catch((err: unknown) => {
        throw new Error(`the in-place update is done, but the Pods left on Node ${name} could not all be deleted: ${describeError(err)}`);
      });
      deps.log.info("deleted the Pods left on the node after its in-place update", { node: name, pods: deleted.map((p) => `${p.namespace}/${p.name}`) });
      await patchNodeMetadata(deps.kube, name, updateSucceeded);
    }
    // Done: nothing pending, and no OS update attempt to judge (the Node's mark of it has just gone too).
    const state = await store.read();
    if (state.pending || state.osUpdate) await store.write({});
    if (hasInPlaceChanges(changes)) deps.log.info("updated the node in place", { checksum, update: partsOf(changes).map((p) => p.what).join(", ") });
    return undefined;
  }

  async function perform(checksum: string, changes: InPlaceChanges, osUpdate: OsUpdate | null | undefined): Promise<InPlaceOutcome> {
    if (changes.kubeletMinorVersion !== undefined || changes.kubeletConfig || changes.cpuManagerPolicy) {
      const unhealthy = await waitKubeletHealthy(defaultKubeletHealthz, deps.signal);
      if (unhealthy) return failed(unhealthy);
      await done(checksum, ["kubeletMinorVersion", "kubeletConfig", "cpuManagerPolicy"]);
    }
    if (changes.operatingSystem) {
      const outcome = await os.update(changes.operatingSystem.to, osUpdate);
      if (outcome) return outcome;
      await done(checksum, ["operatingSystem"]);
    }
    if (changes.serviceAccountKey) {
      // As gardener-node-agent, which only asks its token controller to sync again: a token Secret that is
      // missing or empty does not fail the update; the token controller reports it and keeps trying.
      const stale = await deps.tokens.resync().catch((err: unknown) => [describeError(err)]);
      if (stale.length > 0) deps.log.warn("after the service-account key rotation, token files are not those of their Secrets yet; the token controller keeps at it", { problems: stale });
      await done(checksum, ["serviceAccountKey"]);
    }
    if (changes.certificateAuthorities) {
      try {
        await deps.certificate?.renewNow();
      } catch (err) {
        return failed(`certificate authority rotation: the agent's client certificate: ${describeError(err)}`);
      }
      try {
        await rebootstrapKubelet(deps.files, deps.systemd, deps.apiServer);
      } catch (err) {
        return failed(`certificate authority rotation: kubelet's bootstrap: ${describeError(err)}`);
      }
      const unhealthy = await waitKubeletHealthy(defaultKubeletHealthz, deps.signal);
      if (unhealthy) return failed(`certificate authority rotation: ${unhealthy}`);
      await done(checksum, ["certificateAuthorities"]);
    }
    return undefined;
  }

  return { work, awaitDrain, begin, finish };
}
