// The Pods bound to the agent's Node, deleted after an in-place update as gardener-node-agent deletes them:
// machine-controller-manager's drain leaves DaemonSet pods, pods with local storage and static pods' mirror
// pods on the node, and they would keep running with what the update replaced (a CA, a token, kubelet's
// configuration); deleted, their owners (or kubelet, for a mirror pod) create them anew on the updated node.
import type { V1Pod } from "@kubernetes/client-node";
import { coreV1 } from "./api.ts";
import type { Kube } from "./client.ts";
import { explainKubeError } from "./errors.ts";

export type PodRef = { namespace: string; name: string };

/** The Pods bound to Node `nodeName`: a list with the field selector spec.nodeName=<node>, the only one an agent may make. */
export async function podsOnNode(kube: Kube, nodeName: string): Promise<PodRef[]> {
  const what = `listing the Pods of Node ${nodeName}`;
  try {
    const list = await coreV1(kube).listPodForAllNamespaces({ fieldSelector: `spec.nodeName=${nodeName}` });
    return list.items.map((p) => ({ namespace: p.metadata?.namespace ?? "", name: p.metadata?.name ?? "" }));
  } catch (err) {
    throw explainKubeError(err, { server: kube.server, caSource: kube.caSource, what });
  }
}

/**
 * Deletes every Pod bound to Node `nodeName` (each with its own grace period, as a plain DELETE does), all at
 * once; a Pod already gone counts as deleted. Returns what was deleted; throws naming every Pod that could not be.
 */
export async function deletePodsOnNode(kube: Kube, nodeName: string): Promise<PodRef[]> {
  const pods = await podsOnNode(kube, nodeName);
  const core = coreV1(kube);
  const outcomes = await Promise.all(
    pods.map((p) =>
      core.deleteNamespacedPod({ namespace: p.namespace, name: p.name }).then(
        () => undefined,
        (err: unknown) => {
          const e = explainKubeError(err, { server: kube.server, caSource: kube.caSource, what: `deleting Pod ${p.namespace}/${p.name} of Node ${nodeName}` });
          return e.reason === "not-found" ? undefined : e.message;
        },
      ),
    ),
  );
  const failed = outcomes.filter((o): o is string => o !== undefined);
  if (failed.length > 0) throw new Error(failed.join("; "));
  return pods;
}

/**
 * The Pods bound to Node `nodeName` that carry the label `labelSelector` (the static pods' mirror pods, for the
 * OSC controller's wait before it reports an OSC with static pods: src/controllers/osc/before-report.ts).
 */
export async function labelledPodsOnNode(kube: Kube, nodeName: string, labelSelector: string): Promise<V1Pod[]> {
  const what = `listing the Pods of Node ${nodeName} labelled ${labelSelector}`;
  try {
    return (await coreV1(kube).listPodForAllNamespaces({ fieldSelector: `spec.nodeName=${nodeName}`, labelSelector })).items;
  } catch (err) {
    throw explainKubeError(err, { server: kube.server, caSource: kube.caSource, what });
  }
}
