// A restarted agent's first reconcile, as gardener-node-agent's: when the Node already shows the Secret's
// OSC as applied and this node recorded it as applied completely, nothing in progress and no rollback
// pending, the OSC is said to be applied as soon as the Secret is read (the log line, the first reconcile
// that tells systemd the agent is ready). The check of the node against the record, which repairs what
// changed while no agent ran, is the next reconcile, at once: it hashes every file and asks systemd for
// every unit, most of a start's CPU on a slow node (issue 21: under half a core, the start took longer than
// gardener-node-agent's, whose first reconcile compares the Node's checksum alone). Nothing is reported to
// the API server here: the Node says it all already.
import type { V1Node, V1Secret } from "@kubernetes/client-node";
import { decodeBase64 } from "../../api/base64.ts";
import { oscChecksum } from "../../api/desired.ts";
import { effectiveChecksumAnnotation } from "../../api/layers.ts";
import { oscDataKey } from "../../api/paths.ts";
import type { AgentState } from "../../api/state.ts";
import { type OscContext, result, type Wait } from "./context.ts";
import { annotations, conditionType } from "./report.ts";

/** What the Node and this node's record must both say for `checksum` to be applied already. */
export function appliedAsRecorded(i: { checksum: string; secret: V1Secret; node: V1Node | undefined; state: AgentState; rollingBack: boolean }): boolean {
  const { checksum, node, state } = i;
  // Overlays make what the node applies differ from osc.yaml (their checksum is another): the full path.
  if (Object.keys(i.secret.data ?? {}).some((key) => key.startsWith("overlay"))) return false;
  if (i.rollingBack || state.progress || state.lastApplied?.checksum !== checksum) return false;
  const onNode = node?.metadata?.annotations ?? {};
  if (onNode[annotations.appliedChecksum] !== checksum || onNode[effectiveChecksumAnnotation] !== undefined) return false;
  const condition = node?.status?.conditions?.find((c) => c.type === conditionType);
  return condition?.status === "True" && condition.reason === "Applied" && (condition.message ?? "").startsWith(`OSC ${checksum.slice(0, 12)} is applied`);
}

/**
 * The first reconcile of this agent process, when its OSC is applied as recorded: the reconcile's wait
 * (the node's check, at once); undefined when the full reconcile is to run now.
 */
export async function recognizeApplied(ctx: OscContext, cpuMs: () => number): Promise<Wait | undefined> {
  const { deps, state } = ctx;
  const started = ctx.now();
  const secret = state.secret;
  const encoded = secret?.data?.[oscDataKey];
  const node = deps.node.current();
  // The Node names the only OSC that can be recognized: the Secret's bytes are decoded and hashed (which
  // the full reconcile does again when they are not that OSC) only once the Node and the record agree on it.
  const checksum = node?.metadata?.annotations?.[annotations.appliedChecksum];
  if (!secret || encoded === undefined || checksum === undefined) return undefined;
  if (!appliedAsRecorded({ checksum, secret, node, state: await deps.store.read(), rollingBack: (await deps.rollout.pending()).do === "apply" })) return undefined;
  const bytes = decodeBase64(encoded);
  if (!bytes || oscChecksum(bytes) !== checksum) return undefined;
  result(ctx, "applied");
  state.status.lastChecksum = checksum;
  state.status.nodeCheckPending = true;
  state.appliedChecksum = checksum;
  ctx.log.info("OSC applied", { checksum, steps: 0, recorded: true, durationMs: ctx.now() - started, cpuMs: cpuMs() });
  return { atMs: ctx.now(), why: "the node checked against the record after the agent's start" };
}
