// Client-certificate users holding exactly the RBAC rules a test grants them, and the audit log's
// record of what they asked the API server.
import { readFileSync } from "node:fs";
import { AuthorizationV1Api, RbacAuthorizationV1Api, type V1PolicyRule } from "@kubernetes/client-node";
import { kubeFromConnection, type Kube } from "../../src/kube/client.ts";
import type { Cluster } from "./cluster.ts";
import { waitFor } from "./exec.ts";

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
  await grantsInEffect(cluster, user, grants);
  const { kubeconfig } = await cluster.clientCertUser(user);
  return { kube: kubeFromConnection({ kind: "kubeconfig", path: kubeconfig }), kubeconfig };
}

/**
 * Waits until the API server's authorizer allows `user` each grant's first verb: RBAC reads the new
 * bindings from its informers a moment after they were created, and an agent started within that moment
 * is refused its first requests (gardener-node-agent then starts without its Node and restarts itself
 * at its first OSC: a difference of the harness's, not of the agents').
 */
async function grantsInEffect(cluster: Cluster, user: string, grants: { namespace?: string; rules: V1PolicyRule[] }[]): Promise<void> {
  const authz = cluster.admin().makeApiClient(AuthorizationV1Api);
  for (const g of grants) {
    const rule = g.rules[0];
    const [verb, resource, group] = [rule?.verbs[0], rule?.resources?.[0], rule?.apiGroups?.[0]];
    if (!verb || !resource) continue;
    const resourceAttributes = { verb, resource: resource.split("/")[0], subresource: resource.split("/")[1], group: group ?? "", namespace: g.namespace, name: rule?.resourceNames?.[0] };
    await waitFor(`RBAC to allow ${user} to ${verb} ${resource}`, async () => {
      const review = await authz.createSubjectAccessReview({ body: { spec: { user, groups: ["system:authenticated"], resourceAttributes } } });
      return review.status?.allowed || undefined;
    }, 10_000, 50);
  }
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
