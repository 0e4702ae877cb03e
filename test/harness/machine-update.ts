// machine-controller-manager's part of an in-place update, played by a test through the API: it drains the
// node and sets the Node condition InPlaceUpdate with reason ReadyForUpdate, reads the agent's result label,
// and clears its bookkeeping once it has recorded the result. And what the agent reports meanwhile.
import { CoreV1Api, PatchStrategy, setHeaderOptions, type V1NodeCondition } from "@kubernetes/client-node";
import { type AgentNode, readNode } from "./agent.ts";
import type { Cluster } from "./cluster.ts";
import { waitFor } from "./exec.ts";

export const updateResultLabel = "node.machine.sapcloud.io/update-result";
export const updateFailedReasonAnnotation = "node.machine.sapcloud.io/update-failed-reason";

/** What machine-controller-manager does once it drained the node for its in-place update. */
export async function markReadyForUpdate(cluster: Cluster, nodeName: string): Promise<void> {
  const condition = { type: "InPlaceUpdate", status: "True", reason: "ReadyForUpdate", message: "Node drain successful. Node is ready for update", lastTransitionTime: new Date() };
  await cluster.admin().makeApiClient(CoreV1Api).patchNodeStatus({ name: nodeName, body: { status: { conditions: [condition] } } }, setHeaderOptions("Content-Type", PatchStrategy.StrategicMergePatch));
}

/** machine-controller-manager's bookkeeping removed, as after an update it has recorded. */
export async function clearUpdateMarks(cluster: Cluster, nodeName: string): Promise<void> {
  const core = cluster.admin().makeApiClient(CoreV1Api);
  const node = await core.readNode({ name: nodeName });
  const conditions = (node.status?.conditions ?? []).filter((c) => c.type !== "InPlaceUpdate");
  await core.patchNodeStatus({ name: nodeName, body: [{ op: "replace", path: "/status/conditions", value: conditions }] }, setHeaderOptions("Content-Type", PatchStrategy.JsonPatch));
  await core.patchNode(
    { name: nodeName, body: { metadata: { labels: { [updateResultLabel]: null }, annotations: { [updateFailedReasonAnnotation]: null } } } },
    setHeaderOptions("Content-Type", PatchStrategy.MergePatch),
  );
}

/** The agent's condition OperatingSystemConfigApplied on its Node. */
export async function oscCondition(bare: AgentNode): Promise<V1NodeCondition | undefined> {
  return (await readNode(bare)).status?.conditions?.find((c) => c.type === "OperatingSystemConfigApplied");
}

/** Waits until the agent holds an in-place update for the drain, its condition naming `containing`. */
export function waitInPlacePending(bare: AgentNode, containing: string, timeoutMs = 60_000): Promise<V1NodeCondition> {
  return waitFor(`the condition InPlaceUpdatePending naming ${containing}`, async () => {
    const c = await oscCondition(bare);
    return c?.reason === "InPlaceUpdatePending" && c.message?.includes(containing) ? c : undefined;
  }, timeoutMs, 250);
}
