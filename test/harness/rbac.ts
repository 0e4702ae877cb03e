// Client-certificate users holding exactly the RBAC rules a test grants them, and the audit log's
// record of what they asked the API server.
import { readFileSync } from "node:fs";
import { RbacAuthorizationV1Api, type V1PolicyRule } from "@kubernetes/client-node";
import { kubeFromConnection, type Kube } from "../../src/kube/client.ts";
import type { Cluster } from "./cluster.ts";

/** A new user with `rules` in `namespace` (a Role) or cluster-wide (a ClusterRole when namespace is undefined). */
export async function userWithRules(
  cluster: Cluster,
  user: string,
  grants: { namespace?: string; rules: V1PolicyRule[] }[],
): Promise<{ kube: Kube; kubeconfig: string }> {
  const rbac = cluster.admin().makeApiClient(RbacAuthorizationV1Api);
  for (const [i, g] of grants.entries()) {
    const name = `${user}-${i}`;
    const subjects = [{ kind: "User", apiGroup: "rbac.authorization.k8s.io", name: user }];
    if (g.namespace) {
      await rbac.createNamespacedRole({ namespace: g.namespace, body: { metadata: { name }, rules: g.rules } });
      await rbac.createNamespacedRoleBinding({
        namespace: g.namespace,
        body: { metadata: { name }, roleRef: { apiGroup: "rbac.authorization.k8s.io", kind: "Role", name }, subjects },
      });
    } else {
      await rbac.createClusterRole({ body: { metadata: { name }, rules: g.rules } });
      await rbac.createClusterRoleBinding({
        body: { metadata: { name }, roleRef: { apiGroup: "rbac.authorization.k8s.io", kind: "ClusterRole", name }, subjects },
      });
    }
  }
  const { kubeconfig } = await cluster.clientCertUser(user);
  return { kube: kubeFromConnection({ kind: "kubeconfig", path: kubeconfig }), kubeconfig };
}

export type AuditEvent = {
  stage: string;
  verb: string;
  requestURI: string;
  user: { username: string };
  objectRef?: { resource?: string; subresource?: string; namespace?: string; name?: string };
  responseStatus?: { code?: number };
  requestReceivedTimestamp: string;
  stageTimestamp: string;
};

/** The audit events of requests made by `username`. */
export function auditOf(cluster: Cluster, username: string): AuditEvent[] {
  return readFileSync(cluster.auditLog, "utf8")
    .split("\n")
    .filter((line) => line.includes(`"username":${JSON.stringify(username)}`))
    .map((line) => JSON.parse(line) as AuditEvent)
    .filter((e) => e.user.username === username);
}
