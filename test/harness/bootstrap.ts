// What a cluster needs for nodes to bootstrap the way Gardener's do: bootstrap tokens (Secrets of type
// bootstrap.kubernetes.io/token, which kube-apiserver's --enable-bootstrap-token-auth authenticates as
// system:bootstrap:<id> in group system:bootstrappers), the RBAC of docs/rbac.md for CSRs, and an
// approver's hand: nothing auto-approves kube-apiserver-client CSRs in the test cluster; once approved,
// kube-controller-manager signs them with the client CA.
import { Buffer } from "node:buffer";
import { randomBytes } from "node:crypto";
import { CertificatesV1Api, CoreV1Api, RbacAuthorizationV1Api, type V1CertificateSigningRequest } from "@kubernetes/client-node";
import type { Cluster } from "./cluster.ts";
import { signClientCsr } from "./certs.ts";
import { runDir, waitFor } from "./exec.ts";

const alphabet = "abcdefghijklmnopqrstuvwxyz0123456789";
const randomToken = (n: number) => Array.from(randomBytes(n), (b) => alphabet[b % alphabet.length]).join("");

/** Creates a bootstrap token Secret in kube-system and returns the token ("<id>.<secret>") and its user. */
export async function createBootstrapToken(cluster: Cluster): Promise<{ token: string; id: string; user: string }> {
  const id = randomToken(6);
  const secret = randomToken(16);
  await cluster.admin().makeApiClient(CoreV1Api).createNamespacedSecret({
    namespace: "kube-system",
    body: {
      metadata: { name: `bootstrap-token-${id}`, namespace: "kube-system" },
      type: "bootstrap.kubernetes.io/token",
      stringData: {
        "token-id": id,
        "token-secret": secret,
        "usage-bootstrap-authentication": "true",
        expiration: new Date(Date.now() + 3_600_000).toISOString().replace(/\.\d+Z$/, "Z"),
      },
    },
  });
  return { token: `${id}.${secret}`, id, user: `system:bootstrap:${id}` };
}

const granted = new WeakMap<Cluster, Promise<void>>();

/**
 * docs/rbac.md's CSR rules, once per cluster: system:bootstrappers get the built-in
 * system:node-bootstrapper (as Gardener binds it), gardener.cloud:node-agents `create` and `get` on
 * certificatesigningrequests (what Gardener's NodeAgentAuthorizer allows them).
 */
export function grantCsrRbac(cluster: Cluster): Promise<void> {
  const done = granted.get(cluster);
  if (done) return done;
  const grant = (async () => {
    const rbac = cluster.admin().makeApiClient(RbacAuthorizationV1Api);
    const ref = (kind: string, name: string) => ({ apiGroup: "rbac.authorization.k8s.io", kind, name });
    await rbac.createClusterRoleBinding({
      body: { metadata: { name: "system:node-bootstrapper" }, roleRef: ref("ClusterRole", "system:node-bootstrapper"), subjects: [ref("Group", "system:bootstrappers")] },
    });
    await rbac.createClusterRole({
      body: { metadata: { name: "trellis:node-agent-csr" }, rules: [{ apiGroups: ["certificates.k8s.io"], resources: ["certificatesigningrequests"], verbs: ["create", "get"] }] },
    });
    await rbac.createClusterRoleBinding({
      body: { metadata: { name: "trellis:node-agent-csr" }, roleRef: ref("ClusterRole", "trellis:node-agent-csr"), subjects: [ref("Group", "gardener.cloud:node-agents")] },
    });
  })();
  granted.set(cluster, grant);
  return grant;
}

export const csrApi = (cluster: Cluster) => cluster.admin().makeApiClient(CertificatesV1Api);

/** Waits for a CSR matching `match` (e.g. by requesting user) and returns it. */
export function waitForCsr(cluster: Cluster, what: string, match: (csr: V1CertificateSigningRequest) => boolean, timeoutMs = 60_000): Promise<V1CertificateSigningRequest> {
  return waitFor(
    what,
    async () => (await csrApi(cluster).listCertificateSigningRequest()).items.find(match),
    timeoutMs,
    100,
  );
}

/** Approves (or denies) a CSR, as `kubectl certificate approve|deny` does: a condition through the approval subresource. */
export async function decideCsr(cluster: Cluster, name: string, decision: "Approved" | "Denied", reason: string, message: string): Promise<void> {
  const api = csrApi(cluster);
  const csr = await api.readCertificateSigningRequest({ name });
  const condition = { type: decision, status: "True", reason, message, lastUpdateTime: new Date() };
  csr.status = { ...csr.status, conditions: [...(csr.status?.conditions ?? []), condition] };
  await api.replaceCertificateSigningRequestApproval({ name, body: csr });
}

/**
 * kube-controller-manager's CSR signer and an approver, played by the test for a cluster started without
 * the controller manager: every CSR whose requesting user `approve` accepts is approved and signed with
 * the cluster's client CA (valid for 30 days from an hour ago), until stop().
 */
export function startCsrSigner(cluster: Cluster, approve: (csr: V1CertificateSigningRequest) => boolean): { stop(): Promise<void> } {
  const api = csrApi(cluster);
  const dir = runDir("csr-signer");
  const done = new Set<string>();
  let stopped = false;
  const pass = async () => {
    for (const csr of (await api.listCertificateSigningRequest()).items) {
      const name = csr.metadata?.name ?? "";
      if (done.has(name) || csr.status?.certificate || !approve(csr)) continue;
      done.add(name);
      await decideCsr(cluster, name, "Approved", "ParityTest", "approved by the test's signer");
      const now = Date.now();
      const certPem = await signClientCsr({ dir, csrPem: Buffer.from(csr.spec.request, "base64").toString("utf8"), notBefore: new Date(now - 3_600_000), notAfter: new Date(now + 30 * 86_400_000), ca: { certFile: cluster.clientCaFile, keyFile: cluster.clientCaKeyFile } });
      const signed = await api.readCertificateSigningRequest({ name });
      signed.status = { ...signed.status, certificate: Buffer.from(certPem).toString("base64") };
      await api.replaceCertificateSigningRequestStatus({ name, body: signed });
    }
  };
  const loop = (async () => {
    while (!stopped) {
      await pass();
      await new Promise((r) => setTimeout(r, 200));
    }
  })();
  return {
    stop: async () => {
      stopped = true;
      await loop;
    },
  };
}
