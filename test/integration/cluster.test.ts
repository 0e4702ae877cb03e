// The real control plane the other e2e tests rely on: version, client-certificate authentication,
// RBAC, CSR signing by kube-controller-manager, owner-reference garbage collection, apiserver restart.
import { afterAll, beforeAll, expect, test } from "bun:test";
import { readFileSync } from "node:fs";
import {
  ApiException,
  AuthenticationV1Api,
  CertificatesV1Api,
  CoreV1Api,
  KubeConfig,
  VersionApi,
  type V1CertificateSigningRequest,
} from "@kubernetes/client-node";
import { type Cluster, startCluster } from "../harness/cluster.ts";
import { runDir, runOk, waitFor } from "../harness/exec.ts";

let cluster: Cluster;
let core: CoreV1Api;

beforeAll(async () => {
  cluster = await startCluster();
  core = cluster.admin().makeApiClient(CoreV1Api);
}, 120_000);

afterAll(() => cluster?.stop(), 30_000);

test("the apiserver reports the pinned Kubernetes version", async () => {
  const info = await cluster.admin().makeApiClient(VersionApi).getCode();
  expect(info.gitVersion).toBe(pinnedKubeVersion());
});

test("admin creates a namespace, and the audit log records it", async () => {
  const ns = await core.createNamespace({ body: { metadata: { name: "e2e-admin" } } });
  expect(ns.metadata?.uid).toBeString();
  // The apiserver writes the ResponseComplete event after the response has gone out.
  const creates = () =>
    readFileSync(cluster.auditLog, "utf8")
      .split("\n")
      .filter((line) => line.includes('"verb":"create"') && line.includes('"name":"e2e-admin"'));
  await waitFor("the audit event", () => creates().length > 0, 5_000);
  expect(creates().length).toBe(1);
});

test("a client-certificate user without RBAC is denied secrets but authenticated as itself", async () => {
  const { kubeconfig } = await cluster.clientCertUser("e2e-nobody", ["e2e-group"]);
  const kc = new KubeConfig();
  kc.loadFromFile(kubeconfig);
  expect(await statusOf(kc.makeApiClient(CoreV1Api).listNamespacedSecret({ namespace: "default" }))).toBe(403);
  expect(await whoAmI(kc)).toEqual({ username: "e2e-nobody", groups: ["e2e-group", "system:authenticated"] });
});

test("kube-controller-manager signs an approved kube-apiserver-client CSR with the client CA", async () => {
  const certs = cluster.admin().makeApiClient(CertificatesV1Api);
  const { csrPem, keyPem } = await newCsr("e2e-csr-user", "e2e-csr-group");
  const name = "e2e-client";
  const csr = await certs.createCertificateSigningRequest({
    body: {
      metadata: { name },
      spec: {
        request: Buffer.from(csrPem).toString("base64"),
        signerName: "kubernetes.io/kube-apiserver-client",
        usages: ["client auth", "digital signature"],
        expirationSeconds: 3600,
      },
    },
  });
  await certs.replaceCertificateSigningRequestApproval({ name, body: approved(csr) });
  const issued = await waitFor(
    "the CSR's certificate",
    async () => (await certs.readCertificateSigningRequest({ name })).status?.certificate,
    30_000,
    250,
  );
  const certPem = Buffer.from(issued, "base64").toString();
  await runOk(["openssl", "verify", "-CAfile", cluster.clientCaFile], { input: certPem });
  // The signed certificate is only useful if the apiserver accepts it.
  expect(await whoAmI(certUser(certPem, keyPem))).toEqual({ username: "e2e-csr-user", groups: ["e2e-csr-group", "system:authenticated"] });
}, 40_000);

test("the garbage collector deletes an object whose owner was deleted", async () => {
  const namespace = "default";
  const owner = await core.createNamespacedConfigMap({ namespace, body: { metadata: { name: "e2e-owner" } } });
  const ownerRef = { apiVersion: "v1", kind: "ConfigMap", name: "e2e-owner", uid: owner.metadata?.uid ?? "" };
  await core.createNamespacedConfigMap({ namespace, body: { metadata: { name: "e2e-dependent", ownerReferences: [ownerRef] } } });
  const dependent = () => statusOf(core.readNamespacedConfigMap({ namespace, name: "e2e-dependent" }));
  expect(await dependent()).toBe(200);
  await core.deleteNamespacedConfigMap({ namespace, name: "e2e-owner", propagationPolicy: "Background" });
  await waitFor(
    "the dependent to be garbage collected",
    async () => (await dependent()) === 404,
    30_000,
    250,
  );
}, 40_000);

test("the apiserver restarts on the same port and keeps its data", async () => {
  await cluster.restartApiServer();
  const ns = await core.readNamespace({ name: "e2e-admin" });
  expect(ns.metadata?.name).toBe("e2e-admin");
}, 90_000);

/** The version test/cluster/build.sh builds: test/cluster/k8s/go.mod is the one place it is written. */
function pinnedKubeVersion(): string {
  const goMod = readFileSync(new URL("../cluster/k8s/go.mod", import.meta.url), "utf8");
  const version = /^require k8s\.io\/kubernetes (v\S+)$/m.exec(goMod)?.[1];
  if (!version) throw new Error("test/cluster/k8s/go.mod pins no k8s.io/kubernetes version");
  return version;
}

/** 200 if the call succeeds, else the HTTP status of the ApiException it fails with. */
async function statusOf(call: Promise<unknown>): Promise<number> {
  try {
    await call;
    return 200;
  } catch (err) {
    if (err instanceof ApiException) return err.code;
    throw err;
  }
}

async function whoAmI(kc: KubeConfig): Promise<{ username?: string; groups?: string[] }> {
  const review = await kc.makeApiClient(AuthenticationV1Api).createSelfSubjectReview({ body: {} });
  return { username: review.status?.userInfo?.username, groups: review.status?.userInfo?.groups };
}

async function newCsr(cn: string, org: string): Promise<{ csrPem: string; keyPem: string }> {
  const dir = runDir("csr");
  await runOk([
    "openssl", "req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-noenc",
    "-subj", `/CN=${cn}/O=${org}`, "-keyout", `${dir}/key.pem`, "-out", `${dir}/csr.pem`,
  ]);
  return { csrPem: readFileSync(`${dir}/csr.pem`, "utf8"), keyPem: readFileSync(`${dir}/key.pem`, "utf8") };
}

function approved(csr: V1CertificateSigningRequest): V1CertificateSigningRequest {
  const condition = { type: "Approved", status: "True", reason: "E2ETest", message: "approved by test/integration/cluster.test.ts" };
  return { ...csr, status: { ...csr.status, conditions: [...(csr.status?.conditions ?? []), condition] } };
}

function certUser(certPem: string, keyPem: string): KubeConfig {
  const b64 = (s: string) => Buffer.from(s).toString("base64");
  const kc = new KubeConfig();
  kc.loadFromOptions({
    clusters: [{ name: "e2e", server: cluster.server, caData: b64(cluster.caPem) }],
    users: [{ name: "csr-user", certData: b64(certPem), keyData: b64(keyPem) }],
    contexts: [{ name: "e2e", cluster: "e2e", user: "csr-user" }],
    currentContext: "e2e",
  });
  return kc;
}
