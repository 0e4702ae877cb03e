// How the OSC controller reports: the Node's role and zone labels before an apply, its checksum annotation
// and Kubernetes version label after one, the condition OperatingSystemConfigApplied, and events — each
// problem once per OSC, a no-op re-check costing no request.
import type { V1Node } from "@kubernetes/client-node";
import type { Desired } from "../../api/desired.ts";
import { effectiveChecksumAnnotation } from "../../api/layers.ts";
import type { OperatingSystemConfig } from "../../api/osc.ts";
import { paths } from "../../api/paths.ts";
import { type ApplyOutcome, summaryOf } from "../../apply/apply.ts";
import { nodeRef } from "../../kube/events.ts";
import { patchNodeConditionIfChanged, patchNodeMetadata } from "../../kube/node.ts";
import { describeError } from "../../log.ts";
import { describeStep } from "../../plan/render.ts";
import { noted, type OscContext, periodic, result, type Wait } from "./context.ts";

export const annotations = {
  appliedChecksum: "checksum/cloud-config-data",
  reconciliationDelay: "node-agent.gardener.cloud/reconciliation-delay",
} as const;
export const labels = {
  kubernetesVersion: "worker.gardener.cloud/kubernetes-version",
  worker: "node-role.kubernetes.io/worker",
  controlPlane: "node-role.kubernetes.io/control-plane",
  zone: "topology.kubernetes.io/zone",
} as const;
/** trellis's own Node condition: whether the current OSC is applied, and if not, why. */
export const conditionType = "OperatingSystemConfigApplied";
const apiServerManifest = "/etc/kubernetes/manifests/kube-apiserver.yaml";

/** osc.yaml's checksum (Gardener's, on the Node) and that of what the node applies (overlays included). */
export type Checksums = { base: string; checksum: string };

/** The OSC is invalid: said once per problem; the node keeps its last good state. */
export async function invalid(ctx: OscContext, checksum: string, errors: string[]): Promise<Wait> {
  result(ctx, "invalid", errors.join("; "));
  // The Secret's next change wakes the controller again.
  ctx.log.error("the OSC is invalid; nothing was changed on the node", { checksum, errors });
  const current = ctx.deps.node.current();
  // Once per problem, not per checksum: the checksum is osc.yaml's, and a Secret whose overlays or
  // rollout annotations change keeps it, so a new problem there would otherwise never be reported.
  const reported = noted(ctx, checksum).reported;
  const key = `invalid/${errors.join("\n")}`;
  if (current && !reported.has(key)) {
    reported.add(key);
    await ctx.deps.events.record({ node: nodeRef(current), type: "Warning", reason: "OSCInvalid", message: errors.join("\n") });
    await setCondition(ctx, current, "False", "Invalid", `OSC ${checksum.slice(0, 12)} is invalid; the node keeps its last good state: ${errors.join("; ")}`);
  }
  return periodic(ctx);
}

export async function reportFailure(ctx: OscContext, current: V1Node | undefined, checksum: string, outcome: ApplyOutcome): Promise<void> {
  if (!current) return;
  for (const f of outcome.failures) {
    await ctx.deps.events.record({ node: nodeRef(current), type: "Warning", reason: "OSCApplyFailed", message: `${describeStep(f.step)}: ${f.error}` });
  }
  await setCondition(ctx, current, "False", "ApplyFailed", `applying OSC ${checksum.slice(0, 12)}: ${outcome.failures.map((f) => describeStep(f.step)).join("; ")}`);
}

/** Characters of a list of parts not acted on that an event or the condition carries (an event note holds 1 kB). */
const maxListed = 880;

/** `items` joined by `separator` within `max` characters: whole items (a first one too long is cut), the rest counted. */
export function listed(items: readonly string[], separator: string, max = maxListed): string {
  const all = items.join(separator);
  if (all.length <= max) return all;
  const more = (left: number) => (left === 0 ? "" : `${separator}… and ${left} more (trellis plan --osc lists them all)`);
  let text = "";
  let n = 0;
  for (const item of items) {
    const next = n === 0 ? item : `${text}${separator}${item}`;
    if (next.length + more(items.length - n - 1).length > max) break;
    text = next;
    n++;
  }
  if (n === 0) {
    text = `${(items[0] as string).slice(0, Math.max(0, max - more(items.length - 1).length - 1))}…`;
    n = 1;
  }
  return `${text}${more(items.length - n)}`;
}

export async function reportSuccess(ctx: OscContext, current: V1Node | undefined, ids: Checksums, desired: Desired, outcome: ApplyOutcome): Promise<void> {
  const { checksum } = ids;
  const { reported } = noted(ctx, checksum);
  const notActedOn = desired.unsupported;
  ctx.metrics.notActedOn.set(notActedOn.length);
  // Once per OSC, with every part in it (a newer Gardener's OSC may carry many fields this one does not know).
  if (current && notActedOn.length > 0 && !reported.has("unsupported")) {
    reported.add("unsupported");
    ctx.log.warn("the OSC is applied, but parts of it are not acted on as written", { checksum, unsupported: notActedOn });
    const message = `OSC ${checksum.slice(0, 12)} is applied, but ${notActedOn.length} part(s) of it are not acted on as written:\n${listed(notActedOn, "\n")}`;
    await ctx.deps.events.record({ node: nodeRef(current), type: "Warning", reason: "OSCUnsupported", message });
  }
  // Kubelet registers the Node only once the first OSC started it: the Node's arrival wakes this
  // controller again, and that run reports what the apply did, from the state it persisted.
  if (!current) return;
  const name = current.metadata?.name as string;
  const wanted = nodeMetadata(ctx, ids);
  const have = { ...current.metadata?.labels, ...current.metadata?.annotations };
  const firstReport = (have[effectiveChecksumAnnotation] ?? have[annotations.appliedChecksum]) !== checksum;
  // A no-op re-check costs no API request (null: a key that must be absent). The patched Node, as the
  // server answered, is what the condition below is patched against, without reading it again.
  let patched: V1Node | undefined;
  if (Object.entries({ ...wanted.labels, ...wanted.annotations }).some(([k, v]) => (have[k] ?? null) !== v)) {
    patched = await patchNodeMetadata(ctx.deps.kube, name, wanted);
  }
  const done = outcome.executed.length > 0 || outcome.resumed ? summaryOf(outcome.executed) : firstReport ? await persistedSummary(ctx, checksum) : undefined;
  if (done) {
    await ctx.deps.events.record({
      node: nodeRef(current),
      type: "Normal",
      reason: "OSCApplied",
      message: `Applied OSC ${checksum.slice(0, 12)}: ${done.steps} step(s)${done.restarted.length ? `, restarted ${done.restarted.join(", ")}` : ""}`,
    });
  }
  const applied = `OSC ${checksum.slice(0, 12)} is applied`;
  const message = notActedOn.length > 0 ? `${applied}; ${notActedOn.length} part(s) not acted on as written: ${listed(notActedOn, "; ")}` : applied;
  await setCondition(ctx, patched ?? current, "True", "Applied", message, patched !== undefined);
}

// What the apply of `checksum` did, as it was recorded (possibly by this agent before it restarted itself).
async function persistedSummary(ctx: OscContext, checksum: string): Promise<{ steps: number; restarted: string[] } | undefined> {
  const last = (await ctx.deps.store.read()).lastApplied;
  return last?.checksum === checksum && last.steps !== undefined ? { steps: last.steps, restarted: last.restarted ?? [] } : undefined;
}

// As gardener-node-agent after an apply: the checksum and the Kubernetes version. The pool's label
// (worker.gardener.cloud/gardener-node-agent-secret-name) is Gardener's: kubelet registers the Node with
// it (--node-labels of the OSC), gardenlet rewrites it when the pool's Secret is renamed, and trellis only
// reads it (secret-name.ts), as gardener-node-agent does.
function nodeMetadata(ctx: OscContext, ids: Checksums) {
  return {
    annotations: { [annotations.appliedChecksum]: ids.base, [effectiveChecksumAnnotation]: ids.checksum === ids.base ? null : ids.checksum },
    labels: { [labels.kubernetesVersion]: ctx.deps.kubernetesVersion },
  };
}

/**
 * The role and zone labels, as gardener-node-agent sets them at the start of every reconcile of an OSC it
 * could decode, before the checksum is compared and anything applied (so an OSC that fails to apply does not
 * leave a stale zone): node-role.kubernetes.io/control-plane when spec.files holds kube-apiserver's static
 * pod manifest (whichever host a file names), else node-role.kubernetes.io/worker; the other role label is
 * left as it is. topology.kubernetes.io/zone: the zone file's content, trimmed (empty too), when there is
 * one; a zone file that cannot be read fails the reconcile, and so does the patch.
 */
export async function labelRoleAndZone(ctx: OscContext, osc: OperatingSystemConfig): Promise<void> {
  const current = ctx.deps.node.current();
  if (!current) return;
  const controlPlane = (osc.spec.files ?? []).some((f) => f.path === apiServerManifest);
  const zone = await ctx.deps.files.read(paths.zone);
  const wanted: Record<string, string> = {
    [controlPlane ? labels.controlPlane : labels.worker]: "",
    ...(zone ? { [labels.zone]: new TextDecoder().decode(zone).trim() } : {}),
  };
  const have = current.metadata?.labels ?? {};
  if (Object.entries(wanted).every(([k, v]) => have[k] === v)) return;
  ctx.log.info("setting the Node's role and zone labels", { labels: wanted });
  await patchNodeMetadata(ctx.deps.kube, current.metadata?.name as string, { labels: wanted });
}

/** `fresh`: `current` is the server's answer to this agent's own write just now (see patchNodeConditionIfChanged). */
export async function setCondition(ctx: OscContext, current: V1Node, value: "True" | "False", reason: string, message: string, fresh = false): Promise<void> {
  await patchNodeConditionIfChanged(ctx.deps.kube, current, { type: conditionType, status: value, reason, message }, { fresh }).catch((err: unknown) =>
    ctx.log.warn("could not set the Node condition", { condition: conditionType, error: describeError(err) }),
  );
}

/** The status board's line for the controller. */
export function reportStatus(ctx: OscContext): void {
  const status = ctx.state.status;
  const checksum = status.lastChecksum?.slice(0, 12) ?? "none";
  const summary =
    status.lastResult === "applied"
      ? `OSC ${checksum} applied`
      : status.lastResult === "waiting"
        ? `waiting for Secret kube-system/${ctx.deps.secretName}`
        : status.lastResult === "held"
          ? `OSC ${checksum} held back: ${status.lastError ?? ""}`
          : `OSC ${checksum} ${status.lastResult ?? "not reconciled yet"}: ${status.lastError ?? ""}`;
  ctx.deps.status.set("osc", { ok: status.synced && (status.lastResult === "applied" || status.lastResult === "held"), summary, ...status });
}
