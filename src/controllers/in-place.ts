// In-place node updates on the node, coordinated with machine-controller-manager as gardener-node-agent
// does: MCM drains the node and sets the Node condition InPlaceUpdate with reason ReadyForUpdate; the
// agent then updates the node and labels it update-result=successful (or failed, with the reason in an
// annotation), which MCM turns into the Machine's phase. Until then the OSC is not reported as applied.
import { execFile } from "node:child_process";
import { readFile } from "node:fs/promises";
import type { V1Node } from "@kubernetes/client-node";
import { parseOscBytes } from "../api/desired.ts";
import { type InPlaceChanges, inPlaceStatePath, InPlaceStateSchema } from "../api/in-place-state.ts";
import type { OperatingSystemConfig } from "../api/osc.ts";
import { kubelet, paths } from "../api/paths.ts";
import type { Result } from "../api/result.ts";
import { jsonStore } from "../apply/state-store.ts";
import type { Files } from "../host/files.ts";
import type { Systemd } from "../host/systemd.ts";
import { renderKubeconfig } from "../kube/csr-kubeconfig.ts";
import { inPlaceChanges, noInPlaceChanges, osVersionOf, sameVersion } from "../plan/in-place.ts";
import { abortableSleep } from "../kube/watch.ts";
import { describeError } from "../log.ts";
import { kubeletHealthz } from "./health.ts";

/** machine-controller-manager's Node condition, reason, label and annotation (pkg/apis/machine/v1alpha1). */
export const machineUpdate = {
  condition: "InPlaceUpdate",
  readyForUpdate: "ReadyForUpdate",
  resultLabel: "node.machine.sapcloud.io/update-result",
  successful: "successful",
  failed: "failed",
  failedReason: "node.machine.sapcloud.io/update-failed-reason",
  /** gardener-node-agent's own mark of an OS update it started; cleared with the result. */
  updatingOsVersion: "node-agent.gardener.cloud/updating-operating-system-version",
} as const;

const osRelease = "/etc/os-release";

/** The node's OS version, as kubelet reports it (undefined: os-release names none). */
export async function nodeOsVersion(files: Files): Promise<string | undefined> {
  const release = await files.read(osRelease);
  return release && osVersionOf(new TextDecoder().decode(release));
}

/** The in-place work `osc` asks of this node: against the last applied OSC and the node's OS version. */
export async function inPlaceChangesOnNode(files: Files, osc: OperatingSystemConfig, source: string): Promise<Result<InPlaceChanges>> {
  if (!osc.spec.inPlaceUpdates) return { ok: true, value: noInPlaceChanges };
  const lastBytes = await files.read(paths.lastAppliedOsc);
  if (!lastBytes) return { ok: true, value: noInPlaceChanges };
  const last = parseOscBytes(lastBytes, paths.lastAppliedOsc);
  if (!last.ok) return last;
  return inPlaceChanges(last.value, osc, await nodeOsVersion(files), source);
}

/** Whether the node runs OS version `want`. */
export const osIsAt = async (files: Files, want: string): Promise<boolean> => {
  const now = await nodeOsVersion(files);
  return now !== undefined && sameVersion(now, want) === true;
};

/** This boot of the machine: changes only when the kernel restarts. */
export const bootId = async (): Promise<string> => (await readFile("/proc/sys/kernel/random/boot_id", "utf8")).trim();

/** How gardener-node-agent runs the OS extension's update command: again every 30 s for up to 5 min while it reports network problems. */
const osUpdateRetry = { intervalMs: 30_000, timeoutMs: 5 * 60_000, retriable: /network problems/i };
/** One run of the command may take this long (gardener-node-agent's bound for an in-place reconcile). */
const osUpdateRunMs = 10 * 60_000;

/** Runs the OS update command; undefined once it succeeded, else why it failed (with its output). */
export async function runOsUpdate(command: string, args: string[], signal: AbortSignal, now: () => number = performance.now.bind(performance)): Promise<string | undefined> {
  const deadline = now() + osUpdateRetry.timeoutMs;
  for (;;) {
    const outcome = await new Promise<{ error?: string; output: string }>((resolve) => {
      execFile(command, args, { timeout: osUpdateRunMs, killSignal: "SIGKILL", maxBuffer: 1 << 20, signal }, (err, stdout, stderr) => {
        const output = `${stdout}${stderr}`.trim().replace(/\s*\n\s*/g, " ").slice(-2000);
        resolve(err ? { error: describeError(err), output } : { output });
      });
    });
    if (outcome.error === undefined) return undefined;
    const failure = `the OS update command ${[command, ...args].join(" ")} failed: ${outcome.error}${outcome.output ? `; output: ${outcome.output}` : ""}`;
    if (!osUpdateRetry.retriable.test(outcome.output) || now() + osUpdateRetry.intervalMs > deadline || signal.aborted) return failure;
    await abortableSleep(osUpdateRetry.intervalMs, signal);
  }
}

/** Whether machine-controller-manager has drained the node for its in-place update. */
export const readyForUpdate = (node: V1Node | undefined): boolean =>
  node?.status?.conditions?.some((c) => c.type === machineUpdate.condition && c.reason === machineUpdate.readyForUpdate) ?? false;

/** The Node metadata that tells machine-controller-manager the in-place update failed, and why. */
export const updateFailed = (reason: string) => ({ labels: { [machineUpdate.resultLabel]: machineUpdate.failed }, annotations: { [machineUpdate.failedReason]: reason } });

/** The Node metadata that tells machine-controller-manager the in-place update succeeded. */
export const updateSucceeded = {
  labels: { [machineUpdate.resultLabel]: machineUpdate.successful },
  annotations: { [machineUpdate.failedReason]: null, [machineUpdate.updatingOsVersion]: null },
};

/** Whether machine-controller-manager waits for this node's result (gardener-node-agent's test). */
export function awaitsResult(node: V1Node | undefined): boolean {
  const result = node?.metadata?.labels?.[machineUpdate.resultLabel];
  return (readyForUpdate(node) && result !== machineUpdate.successful) || result === machineUpdate.failed;
}

/** An in-place update waits for the drain, unless its last attempt failed (then it is retried at once). */
export const mayUpdateInPlace = (node: V1Node | undefined): boolean => readyForUpdate(node) || node?.metadata?.labels?.[machineUpdate.resultLabel] === machineUpdate.failed;

export const createInPlaceStore = (files: Files) => jsonStore(files, inPlaceStatePath, InPlaceStateSchema, () => ({}));

/** kubelet's CPU manager state: stale once cpuManagerPolicy changed, and kubelet refuses to start with it. */
export const cpuManagerState = "/var/lib/kubelet/cpu_manager_state";

/** How long kubelet may take to answer /healthz after its in-place update, and how often it is asked (gardener-node-agent's). */
export const kubeletHealthTimeoutMs = 5 * 60_000;
const kubeletHealthIntervalMs = 5_000;

/** Undefined once kubelet answers `url` healthy; else why not, when the timeout passed or `signal` aborted. */
export async function waitKubeletHealthy(url: string, signal: AbortSignal, now: () => number = performance.now.bind(performance)): Promise<string | undefined> {
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
export async function rebootstrapKubelet(files: Files, systemd: Pick<Systemd, "restart">, apiServer: { server: string; caFile: string }): Promise<void> {
  const current = await files.read(kubelet.clientCertificate);
  if (current && (await files.read(kubelet.realKubeconfig))) {
    const pem = new TextDecoder().decode(current);
    await files.writeAtomic(kubelet.bootstrapKubeconfig, renderKubeconfig({ server: apiServer.server, ca: { file: apiServer.caFile }, certPem: pem, keyPem: pem }), 0o600);
  }
  if (!(await files.stat(kubelet.bootstrapKubeconfig))) throw new Error(`${kubelet.bootstrapKubeconfig} does not exist: kubelet cannot bootstrap again`);
  await files.remove(kubelet.realKubeconfig);
  for (const name of await files.list(kubeletPki)) await files.remove(`${kubeletPki}/${name}`);
  await files.removeDirIfEmpty(kubeletPki);
  await systemd.restart("kubelet.service");
}
