// docs/admission-policy.yaml, installed into a test cluster as an operator would apply it, and in force
// before this returns.
import { readFileSync } from "node:fs";
import { AdmissionregistrationV1Api, CoordinationV1Api, CoreV1Api, type V1ValidatingAdmissionPolicy, type V1ValidatingAdmissionPolicyBinding } from "@kubernetes/client-node";
import { parseAllDocuments } from "yaml";
import { clientNodeApi } from "./client-node.ts";
import { nodeAgentUserPrefix } from "../../src/kube/csr.ts";
import type { Cluster } from "./cluster.ts";
import { waitFor } from "./exec.ts";
import { auditOf } from "./rbac.ts";

export const admissionPolicyFile = new URL("../../docs/admission-policy.yaml", import.meta.url).pathname;

/** The policies and bindings of docs/admission-policy.yaml (YAML anchors resolved). */
export function admissionPolicyObjects(): (V1ValidatingAdmissionPolicy | V1ValidatingAdmissionPolicyBinding)[] {
  return parseAllDocuments(readFileSync(admissionPolicyFile, "utf8")).map((d) => d.toJS({ maxAliasCount: -1 }));
}

/**
 * Creates the policies and bindings, then waits until kube-apiserver enforces each of them: its policy
 * informer picks new objects up asynchronously, so until then an agent's request would pass unchecked.
 * The proof is a dry-run request per policy from a node agent's user that RBAC allows everything
 * (system:masters) and the policy must refuse.
 */
export async function installAdmissionPolicy(cluster: Cluster): Promise<void> {
  const api = cluster.admin().makeApiClient(AdmissionregistrationV1Api);
  for (const o of admissionPolicyObjects()) {
    if (o.kind === "ValidatingAdmissionPolicy") await api.createValidatingAdmissionPolicy({ body: o as V1ValidatingAdmissionPolicy });
    else await api.createValidatingAdmissionPolicyBinding({ body: o as V1ValidatingAdmissionPolicyBinding });
  }
  const { kubeconfig } = await cluster.clientCertUser(`${nodeAgentUserPrefix}policy-probe`, ["system:masters"]);
  const core = clientNodeApi(kubeconfig, CoreV1Api);
  const leases = clientNodeApi(kubeconfig, CoordinationV1Api);
  const refusedBy = (policy: string, request: () => Promise<unknown>) => async () => {
    const outcome = await request().then(
      () => "allowed",
      (err: unknown) => String((err as { body?: unknown }).body ?? err),
    );
    return outcome.includes(`ValidatingAdmissionPolicy '${policy}'`) ? true : undefined;
  };
  const dryRun = "All";
  // A Pod is admitted only where its namespace's default ServiceAccount exists (kube-controller-manager
  // creates it; a cluster without one gets it here), or the probe would be refused before the policy.
  await cluster.admin().makeApiClient(CoreV1Api).createNamespacedServiceAccount({ namespace: "default", body: { metadata: { name: "default" } } }).catch((err: { code?: number }) => {
    if (err.code !== 409) throw err;
  });
  await Promise.all([
    waitFor("the Node policy in force", refusedBy("trellis-node-agent-nodes", () => core.createNode({ body: { metadata: { name: "policy-probe" } }, dryRun })), 30_000),
    waitFor(
      "the Lease policy in force",
      refusedBy("trellis-node-agent-leases", () => leases.createNamespacedLease({ namespace: "default", body: { metadata: { name: "policy-probe" } }, dryRun })),
      30_000,
    ),
    waitFor(
      "the Event policy in force",
      refusedBy("trellis-node-agent-events", () =>
        core.createNamespacedEvent({ namespace: "default", body: { metadata: { name: "policy-probe" }, involvedObject: { kind: "Node", name: "another-node" } }, dryRun }),
      ),
      30_000,
    ),
    waitFor(
      "the Pod policy in force",
      refusedBy("trellis-node-agent-pods", () =>
        core.createNamespacedPod({ namespace: "default", body: { metadata: { name: "policy-probe" }, spec: { containers: [{ name: "probe", image: "probe" }] } }, dryRun }),
      ),
      30_000,
    ),
  ]);
}

/** The requests of `username` that kube-apiserver refused (403: RBAC or an admission policy), from the audit log. */
export function forbiddenRequests(cluster: Cluster, username: string): string[] {
  return auditOf(cluster, username)
    .filter((e) => e.responseStatus?.code === 403)
    .map((e) => `${e.verb} ${e.requestURI}`);
}
