// What the report of an applied OSC waits for, as gardener-node-agent has its checksum wait (v1.150.0
// operatingsystemconfig/reconciler.go, Reconcile): the registries whose readinessProbe has not answered yet
// (their hosts.toml waits too; everything else is applied), and the static pods the OSC brings (gardenadm's
// control-plane pools, src/plan/static-pods.ts) rolled out by kubelet and Ready. Until then the OSC is not
// reported as applied — no checksum/cloud-config-data, no OSCApplied event, no "applied" to a fleet rollout —
// the condition OperatingSystemConfigApplied says what it waits for, and a serial rollout's lease stays with
// this node. Each look is bounded (a probe's timeout, one list); the next is a reconcile of its own, so a
// changed Secret is never held up behind a wait (gardener-node-agent blocks its one worker on the probes).
import type { V1Pod } from "@kubernetes/client-node";
import type { Desired } from "../../api/desired.ts";
import type { RegistryWait } from "../../apply/desired-for-node.ts";
import { labelledPodsOnNode } from "../../kube/pods.ts";
import { desiredStaticPods, type MirrorPod, staticPodHashAnnotation, staticPodLabel, staticPodsWaiting } from "../../plan/static-pods.ts";
import { noted, type OscContext, result, retryWait, type Wait } from "./context.ts";
import { setCondition } from "./report.ts";

/** gardener-node-agent probes a registry every 2 s until it answers (containerd.go, retry.Until). */
const registryRetryMs = 2_000;
/** gardener-node-agent looks at the static pods again after 5 s (RequeueAfterWaitForStaticPods). */
const staticPodsRetryMs = 5_000;

/** Undefined: every registry with a readiness probe answered; else the wait. */
export async function awaitRegistries(ctx: OscContext, checksum: string, waitingFor: readonly RegistryWait[]): Promise<Wait | undefined> {
  if (waitingFor.length === 0) return undefined;
  const which = waitingFor.map((w) => `${w.registry} (${w.why})`).join("; ");
  const waitsFor = `the readiness probe of registries whose hosts.toml is not written yet: ${which}`;
  return holdReport(ctx, checksum, { reason: "WaitingForRegistries", waitsFor, wait: { atMs: ctx.now() + registryRetryMs, why: "registry readiness probe" } });
}

/** Undefined: the OSC has no static pods, or they are rolled out and Ready (or the Node is not there to look); else the wait. */
export async function awaitStaticPods(ctx: OscContext, checksum: string, desired: Desired): Promise<Wait | undefined> {
  const wanted = desiredStaticPods(desired.files);
  if (!wanted.ok) {
    // As gardener-node-agent: an error, retried with backoff (a secretRef's Secret may change); the OSC's next change may fix it.
    const waitsFor = `static pod manifests that can be read as Pods: ${wanted.errors.join("; ")}`;
    return holdReport(ctx, checksum, { reason: "WaitingForStaticPods", waitsFor, wait: retryWait(ctx, "an unreadable static pod manifest"), failed: true });
  }
  // Without the Node nothing is reported yet: the Node's arrival wakes the controller, and that reconcile looks.
  const node = ctx.deps.node.current()?.metadata?.name;
  if (wanted.value.size === 0 || !node) return undefined;
  const pods = await labelledPodsOnNode(ctx.deps.kube, node, `${staticPodLabel.key}=${staticPodLabel.value}`);
  const waiting = staticPodsWaiting(wanted.value, pods.map(mirrorPod));
  if (waiting.length === 0) return undefined;
  const waitsFor = `its static pods rolled out and Ready: ${waiting.join("; ")}`;
  return holdReport(ctx, checksum, { reason: "WaitingForStaticPods", waitsFor, wait: { atMs: ctx.now() + staticPodsRetryMs, why: "static pods rolled out and Ready" } });
}

const mirrorPod = (p: V1Pod): MirrorPod => ({
  namespace: p.metadata?.namespace ?? "",
  name: p.metadata?.name ?? "",
  nodeName: p.spec?.nodeName ?? "",
  hash: p.metadata?.annotations?.[staticPodHashAnnotation] ?? "",
  phase: p.status?.phase ?? "",
  ready: p.status?.conditions?.some((c) => c.type === "Ready" && c.status === "True") ?? false,
});

/**
 * The OSC is applied on the node, its report waits: said in the condition and the status (`failed`: on a
 * problem only a change of the OSC fixes), logged once per reason.
 */
async function holdReport(ctx: OscContext, checksum: string, w: { reason: string; waitsFor: string; wait: Wait; failed?: boolean }): Promise<Wait> {
  const message = `OSC ${checksum.slice(0, 12)} is applied on the node; checksum/cloud-config-data waits for ${w.waitsFor}`;
  result(ctx, w.failed ? "failed" : "held", message);
  const { reported } = noted(ctx, checksum);
  if (!reported.has(`wait/${message}`)) {
    reported.add(`wait/${message}`);
    ctx.log[w.failed ? "error" : "info"]("the OSC is applied; its report waits", { checksum, reason: w.reason, waitsFor: w.waitsFor });
  }
  const current = ctx.deps.node.current();
  if (current) await setCondition(ctx, current, "False", w.reason, message);
  return w.wait;
}
