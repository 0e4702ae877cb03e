// The agent's own Node: finding it, and the only writes the agent makes to it — labels and
// annotations (checksum, Kubernetes version, role, zone), status conditions of its own (SystemdUnitsReady …)
// and a lost InternalIP restored, without disturbing what kubelet and others keep on the same object.
import type { V1Node } from "@kubernetes/client-node";
import { coreV1 } from "./api.ts";
import type { Kube } from "./client.ts";
import { explainKubeError, KubeError, rethrow } from "./errors.ts";

const hostnameLabel = "kubernetes.io/hostname";

/**
 * The Node carrying kubelet's hostname label, which must match exactly one Node (for a Node whose name
 * is not the host's). No match is reason "not-found": kubelet may not have registered the node yet.
 */
export async function findNode(kube: Kube, by: { hostname: string }): Promise<V1Node> {
  const core = coreV1(kube);
  // kubelet derives the label the same way (nodeutil.GetHostname): trimmed and lower-cased.
  const hostname = by.hostname.trim().toLowerCase();
  const selector = `${hostnameLabel}=${hostname}`;
  const what = `finding the Node of host ${hostname}`;
  const list = await core.listNode({ labelSelector: selector }).catch(rethrow(kube, what));
  const names = list.items.map((n) => n.metadata?.name ?? "?");
  const [node] = list.items;
  if (!node) throw new KubeError(`${what}: no Node has the label ${selector} (has kubelet registered it yet?)`, "not-found");
  if (list.items.length > 1) throw new KubeError(`${what}: ${names.length} Nodes have the label ${selector} (${names.join(", ")}); expected exactly one`, "other");
  return node;
}

/** The Node as the API server has it now (the watch's copy may not have this agent's last write yet). */
export function readNode(kube: Kube, nodeName: string): Promise<V1Node> {
  return coreV1(kube).readNode({ name: nodeName }).catch(rethrow(kube, `reading Node ${nodeName}`));
}

/** A JSON merge patch of metadata: a value sets the key, null removes it, a key not given is left alone. */
export function patchNodeMetadata(
  kube: Kube,
  nodeName: string,
  meta: { labels?: Record<string, string | null>; annotations?: Record<string, string | null> },
): Promise<V1Node> {
  const body = { metadata: { ...(meta.labels && { labels: meta.labels }), ...(meta.annotations && { annotations: meta.annotations }) } };
  return coreV1(kube)
    .patchNode({ name: nodeName, body }, "merge")
    .catch(rethrow(kube, `patching labels/annotations of Node ${nodeName}`));
}

export type NodeCondition = { type: string; status: "True" | "False" | "Unknown"; reason: string; message: string };

/**
 * Sets one status condition, leaving the others alone: a strategic merge patch of the status
 * subresource (conditions merge by type), with lastHeartbeatTime now and lastTransitionTime kept while
 * the status stays the same. The patch carries the resourceVersion the decision was made on, so a
 * concurrent change to the condition is a 409, answered by reading again.
 */
export async function patchNodeCondition(
  kube: Kube,
  nodeName: string,
  condition: NodeCondition,
  opts: { now?: () => Date; attempts?: number; fresh?: V1Node } = {},
): Promise<V1Node> {
  const core = coreV1(kube);
  const now = opts.now ?? (() => new Date());
  const attempts = opts.attempts ?? 5;
  const what = `setting condition ${condition.type} of Node ${nodeName}`;
  for (let attempt = 1; ; attempt++) {
    // `fresh`, the Node as the server just answered a write with, spares the first read: at 50 nodes
    // reacting at once on 2 cores that read is one request in five of a rollout. Stale after all, it
    // costs a 409 and the read.
    const node = attempt === 1 && opts.fresh ? opts.fresh : await core.readNode({ name: nodeName }).catch(rethrow(kube, what));
    const existing = node.status?.conditions?.find((c) => c.type === condition.type);
    const at = metaTime(now());
    const since = existing?.status === condition.status && existing.lastTransitionTime ? String(existing.lastTransitionTime) : at;
    const body = {
      metadata: { resourceVersion: node.metadata?.resourceVersion },
      status: { conditions: [{ ...condition, lastHeartbeatTime: at, lastTransitionTime: since }] },
    };
    try {
      return await core.patchNodeStatus({ name: nodeName, body }, "strategic");
    } catch (err) {
      const e = explainKubeError(err, { server: kube.server, caSource: kube.caSource, what });
      if (e.reason !== "conflict" || attempt >= attempts) throw e;
    }
  }
}

/**
 * Sets the condition on `node` (as last seen) unless it already says exactly that: a steady node costs no
 * request. `fresh`: `node` is what the server just answered a write with, current enough to patch
 * against without reading it first. Throws what patchNodeCondition throws.
 */
export async function patchNodeConditionIfChanged(kube: Kube, node: V1Node, condition: NodeCondition, opts: { fresh?: boolean } = {}): Promise<void> {
  const existing = node.status?.conditions?.find((c) => c.type === condition.type);
  if (existing?.status === condition.status && existing.reason === condition.reason && existing.message === condition.message) return;
  await patchNodeCondition(kube, node.metadata?.name as string, condition, opts.fresh ? { fresh: node } : {});
}

/**
 * Sets the Node's addresses to `ip` as its one InternalIP, as gardener-node-agent restores one kubelet lost:
 * a JSON merge patch of the status subresource (the list replaced whole) carrying the resourceVersion of
 * `node`, so that a Node changed since it was read is a 409 (reason "conflict"), not overwritten.
 */
export function restoreNodeInternalIP(kube: Kube, node: V1Node, ip: string): Promise<V1Node> {
  const name = node.metadata?.name as string;
  const body = { metadata: { resourceVersion: node.metadata?.resourceVersion }, status: { addresses: [{ type: "InternalIP", address: ip }] } };
  return coreV1(kube)
    .patchNodeStatus({ name, body }, "merge")
    .catch(rethrow(kube, `restoring the InternalIP ${ip} of Node ${name}`));
}

/** metav1.Time's wire form: RFC 3339 in whole seconds. */
export function metaTime(d: Date): string {
  return d.toISOString().replace(/\.\d+Z$/, "Z");
}
