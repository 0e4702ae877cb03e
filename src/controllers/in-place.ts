// In-place node updates on the node, coordinated with machine-controller-manager as gardener-node-agent
// does: MCM drains the node and sets the Node condition InPlaceUpdate with reason ReadyForUpdate; the
// agent then updates the node and labels it update-result=successful (or failed, with the reason in an
// annotation), which MCM turns into the Machine's phase. What trellis does not perform is refused: the
// OSC is not applied and not reported as applied.
import type { V1Node } from "@kubernetes/client-node";
import { parseOscBytes } from "../api/desired.ts";
import type { OperatingSystemConfig } from "../api/osc.ts";
import { paths } from "../api/paths.ts";
import type { Result } from "../api/result.ts";
import type { Files } from "../host/files.ts";
import { type InPlaceChanges, type InPlacePart, inPlaceChanges, noInPlaceChanges, osVersionOf } from "../plan/in-place.ts";

/** machine-controller-manager's Node condition, reason, label and annotation (pkg/apis/machine/v1alpha1). */
export const machineUpdate = {
  condition: "InPlaceUpdate",
  readyForUpdate: "ReadyForUpdate",
  resultLabel: "node.machine.sapcloud.io/update-result",
  successful: "successful",
  failed: "failed",
  failedReason: "node.machine.sapcloud.io/update-failed-reason",
} as const;

/** The parts of an in-place update trellis performs; an OSC asking for any other is refused. */
export const supportedInPlace: ReadonlySet<InPlacePart> = new Set<InPlacePart>([]);

const osRelease = "/etc/os-release";

/** The in-place work `osc` asks of this node: against the last applied OSC and the node's OS version. */
export async function inPlaceChangesOnNode(files: Files, osc: OperatingSystemConfig, source: string): Promise<Result<InPlaceChanges>> {
  if (!osc.spec.inPlaceUpdates) return { ok: true, value: noInPlaceChanges };
  const lastBytes = await files.read(paths.lastAppliedOsc);
  if (!lastBytes) return { ok: true, value: noInPlaceChanges };
  const last = parseOscBytes(lastBytes, paths.lastAppliedOsc);
  if (!last.ok) return last;
  const release = await files.read(osRelease);
  return inPlaceChanges(last.value, osc, release && osVersionOf(new TextDecoder().decode(release)), source);
}

/** Whether machine-controller-manager has drained the node for its in-place update. */
export const readyForUpdate = (node: V1Node | undefined): boolean =>
  node?.status?.conditions?.some((c) => c.type === machineUpdate.condition && c.reason === machineUpdate.readyForUpdate) ?? false;

/** The Node metadata that tells machine-controller-manager the in-place update failed, and why. */
export const updateFailed = (reason: string) => ({ labels: { [machineUpdate.resultLabel]: machineUpdate.failed }, annotations: { [machineUpdate.failedReason]: reason } });
