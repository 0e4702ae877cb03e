// Integration test (src/ in-process against a real kube-apiserver): trellis under Gardener's node-agent
// authorizer, as docs/gardener-landscape.md describes it. The kube-apiserver authorizes with Node, RBAC and
// then the webhook, configured as gardenlet configures a shoot's; the webhook is Gardener's own authorizer
// at the pinned release (test/peer/node-agent-authorizer). The agent is a node agent's client certificate
// (group gardener.cloud:node-agents) holding no RBAC at all, as in a shoot. What trellis does as
// gardener-node-agent — src/kube's own code — passes; another Node is refused; the Leases of trellis's fleet
// rollouts are refused until the Role the document gives is applied, and then a pool admits its node.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { mkdtempSync, readFileSync } from "node:fs";
import { CoreV1Api, PatchStrategy, RbacAuthorizationV1Api, setHeaderOptions, type V1Lease, type V1Role, type V1RoleBinding } from "@kubernetes/client-node";
import { parseAllDocuments } from "yaml";
import { coordinationV1 } from "../../src/kube/api.ts";
import { type Kube, kubeFromConnection } from "../../src/kube/client.ts";
import { CsrError, newKeyAndRequest, nodeAgentUserPrefix, requestClientCertificate } from "../../src/kube/csr.ts";
import { KubeError } from "../../src/kube/errors.ts";
import { createEventRecorder } from "../../src/kube/events.ts";
import { leaseApi } from "../../src/kube/lease-api.ts";
import { microTime } from "../../src/kube/micro-time.ts";
import { patchNodeCondition, patchNodeMetadata } from "../../src/kube/node.ts";
import { deletePodsOnNode } from "../../src/kube/pods.ts";
import { startPoolLeader } from "../../src/kube/pool-leader.ts";
import { poolMember, readTicket } from "../../src/kube/pool-leases.ts";
import { createSerialGate } from "../../src/kube/serial-gate.ts";
import { watchObjects } from "../../src/kube/watch.ts";
import { createLogger } from "../../src/log.ts";
import { admitted } from "../../src/rollout/pool.ts";
import { registerNode } from "../harness/agent.ts";
import { repoRoot } from "../harness/binary.ts";
import { atExit } from "../harness/cleanup.ts";
import { type Cluster, startCluster } from "../harness/cluster.ts";
import { freePort, runOk, waitFor } from "../harness/exec.ts";

const namespace = "kube-system";
const group = "gardener.cloud:node-agents";
const secret = "gardener-node-agent-worker-1a2b3c";
const log = createLogger({ level: "error" });
const doc = readFileSync(`${repoRoot}/docs/gardener-landscape.md`, "utf8");

let cluster: Cluster;
let admin: CoreV1Api;
let authorizer: ReturnType<typeof Bun.spawn> | undefined;
let decisions = "";
type Agent = { name: string; uid: string; kube: Kube };
let a: Agent;

async function agent(name: string): Promise<Agent> {
  await registerNode(admin, name);
  // The label gardenlet's machine template puts on the Node: the authorizer reads the node's OSC Secret from it.
  await admin.patchNode({ name, body: { metadata: { labels: { "worker.gardener.cloud/gardener-node-agent-secret-name": secret } } } }, setHeaderOptions("Content-Type", PatchStrategy.MergePatch));
  const { kubeconfig } = await cluster.clientCertUser(nodeAgentUserPrefix + name, [group]);
  return { name, uid: (await admin.readNode({ name })).metadata?.uid as string, kube: kubeFromConnection({ kind: "kubeconfig", path: kubeconfig }) };
}

beforeAll(async () => {
  const dir = mkdtempSync("/tmp/trellis-node-agent-authorizer-");
  await runOk(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", `${dir}/tls.key`, "-out", `${dir}/tls.crt`, "-days", "1", "-subj", "/CN=node-agent-authorizer", "-addext", "subjectAltName=IP:127.0.0.1"]);
  const binary = (await runOk(["bash", `${repoRoot}/test/peer/node-agent-authorizer.sh`, "--path"], { timeoutMs: 30 * 60_000 })).trim().split("\n").at(-1) as string;
  const port = await freePort();
  cluster = await startCluster({
    controllerManager: false,
    authorizationWebhook: { name: "node-agent-authorizer", url: `https://127.0.0.1:${port}/webhooks/auth/nodeagent`, caPem: readFileSync(`${dir}/tls.crt`, "utf8"), group },
  });
  admin = cluster.admin().makeApiClient(CoreV1Api);
  const proc = Bun.spawn([binary, "--kubeconfig", cluster.adminKubeconfig, "--listen", `127.0.0.1:${port}`, "--tls-cert-file", `${dir}/tls.crt`, "--tls-private-key-file", `${dir}/tls.key`], { stdout: "pipe", stderr: "pipe" });
  authorizer = proc;
  atExit(() => proc.kill());
  void (async () => {
    for await (const chunk of proc.stderr as ReadableStream<Uint8Array>) decisions += new TextDecoder().decode(chunk);
  })();
  const first = await (proc.stdout as ReadableStream<Uint8Array>).getReader().read();
  expect(new TextDecoder().decode(first.value)).toStartWith("serving https://127.0.0.1:");
  // Gardener's OSC Secrets carry the pool label: the authorizer finds a node's Secret among them.
  await admin.createNamespacedSecret({
    namespace,
    body: { metadata: { name: secret, labels: { "worker.gardener.cloud/pool": "worker" } }, stringData: { "osc.yaml": "apiVersion: extensions.gardener.cloud/v1alpha1\nkind: OperatingSystemConfig\nspec:\n  type: debian\n" } },
  });
  a = await agent("node-a");
  await agent("node-b");
}, 30 * 60_000);

afterAll(async () => {
  authorizer?.kill();
  await cluster?.stop();
});

/** The 403 a request got, with kube-apiserver's message (which carries the authorizer's reason). */
async function refusal(p: Promise<unknown>): Promise<string> {
  const err = await p.then(
    () => undefined,
    (e: unknown) => e,
  );
  if (!(err instanceof KubeError)) throw new Error(`expected the API server to refuse the request, got ${err === undefined ? "success" : String(err)}`);
  expect(err.status).toBe(403);
  return err.message;
}

/** Node `of` as a member of its pool (src/kube/pool-leases.ts), and the pool's leader (src/kube/pool-leader.ts). */
async function poolNode(of: Agent) {
  const uid = (await admin.readNamespacedSecret({ name: secret, namespace })).metadata?.uid as string;
  const ref = { secret: { name: secret, uid }, node: { name: of.name, uid: of.uid } };
  const api = leaseApi(of.kube, namespace, log);
  return { ref, api, member: poolMember(api, ref) };
}

/** What trellis's watch of `path` by one name (src/kube/watch.ts) lists. */
async function watched(kube: Kube, path: string, name: string): Promise<string[]> {
  const names: string[] = [];
  const watch = watchObjects<{ metadata?: { name?: string } }>({ kube, path, fieldSelector: `metadata.name=${name}`, log, onEvent: (e) => void names.push(e.object.metadata?.name ?? "") });
  try {
    await watch.synced;
  } finally {
    await watch.stop();
  }
  return names;
}

describe("what trellis does as gardener-node-agent passes Gardener's node-agent authorizer, with no RBAC", () => {
  test("its OSC Secret and a token Secret, and its Node (the reconciliation delay is its annotation), each watched by name", async () => {
    await admin.createNamespacedSecret({ namespace, body: { metadata: { name: "gardener-valitail" }, stringData: { token: "t" } } });
    expect(await watched(a.kube, `/api/v1/namespaces/${namespace}/secrets`, secret)).toEqual([secret]);
    expect(await watched(a.kube, `/api/v1/namespaces/${namespace}/secrets`, "gardener-valitail")).toEqual(["gardener-valitail"]);
    expect(await watched(a.kube, "/api/v1/nodes", a.name)).toEqual([a.name]);
  });

  test("its client certificate's renewal: the CSR created and read (here nobody approves it)", async () => {
    const renewal = requestClientCertificate({ kube: a.kube, request: newKeyAndRequest(a.name), log, waitMs: 1_000, pollMs: 200 });
    expect(await renewal.then(() => undefined, (e: unknown) => (e instanceof CsrError ? e.reason : e))).toBe("timeout");
  });

  test("its Node's labels, annotations and conditions, and Events about it; another Node is refused", async () => {
    await patchNodeMetadata(a.kube, a.name, { labels: { "worker.gardener.cloud/kubernetes-version": "1.35.4" }, annotations: { "checksum/cloud-config-data": "c1" } });
    await patchNodeCondition(a.kube, a.name, { type: "OperatingSystemConfigApplied", status: "True", reason: "OSCApplied", message: "applied" });
    expect(await createEventRecorder({ kube: a.kube, log }).record({ node: { name: a.name, uid: a.uid }, type: "Normal", reason: "OSCApplied", message: "applied" })).toBeUndefined();
    expect(await refusal(patchNodeMetadata(a.kube, "node-b", { annotations: { "checksum/cloud-config-data": "forged" } }))).toMatch(/this gardener-node-agent can only access node \\?"node-a\\?"/);
  });

  test("its heartbeat Lease, created and renewed", async () => {
    const leases = coordinationV1(a.kube);
    const body: V1Lease = {
      metadata: { name: `gardener-node-agent-${a.name}`, namespace, ownerReferences: [{ apiVersion: "v1", kind: "Node", name: a.name, uid: a.uid, controller: true }] },
      spec: { holderIdentity: a.name, leaseDurationSeconds: 40, renewTime: microTime(new Date()) },
    };
    const created = await leases.createNamespacedLease({ namespace, body });
    await leases.replaceNamespacedLease({ name: body.metadata?.name as string, namespace, body: { ...created, spec: { ...created.spec, renewTime: microTime(new Date()) } } });
  });

  test("Gardener's serial rollout: the Lease named after its OSC Secret, taken, renewed, given back", async () => {
    const uid = (await admin.readNamespacedSecret({ name: secret, namespace })).metadata?.uid as string;
    const gate = createSerialGate({ kube: a.kube, secret: { name: secret, namespace, uid }, identity: a.name, log });
    expect(await gate.acquire()).toEqual({ held: true });
    await gate.renew();
    await gate.release();
  });

  test("the Pods bound to its Node, listed and deleted after an in-place update", async () => {
    // A Pod is admitted only where its namespace's default ServiceAccount exists (kube-controller-manager, not run here, makes it).
    await admin.createNamespacedServiceAccount({ namespace: "default", body: { metadata: { name: "default" } } });
    await admin.createNamespacedPod({ namespace: "default", body: { metadata: { name: "on-a" }, spec: { nodeName: a.name, containers: [{ name: "c", image: "example.invalid/none" }] } } });
    expect(await deletePodsOnNode(a.kube, a.name)).toEqual([{ namespace: "default", name: "on-a" }]);
  });
});

describe("trellis's fleet rollouts under the authorizer", () => {
  test("without more RBAC the pool's Leases are refused: the node cannot read its own ticket", async () => {
    const { member } = await poolNode(a);
    const message = await refusal(member.ensureTicket());
    expect(message).toContain(`this gardener-node-agent can only access leases [gardener-node-agent-${a.name} ${secret}]`);
    expect(decisions).toContain("Denying authorization because gardener-node-agent is not allowed to access the lease");
  });

  test("with the Role docs/gardener-landscape.md gives the group, the pool admits its node", async () => {
    const rbac = cluster.admin().makeApiClient(RbacAuthorizationV1Api);
    const manifests = doc.split("```yaml\n").slice(1).map((block) => block.slice(0, block.indexOf("```"))).find((block) => block.includes("kind: Role\n"));
    const [role, binding] = parseAllDocuments(manifests ?? "").map((d) => d.toJS()) as [V1Role, V1RoleBinding];
    expect(binding.subjects).toEqual([{ apiGroup: "rbac.authorization.k8s.io", kind: "Group", name: group }]);
    await rbac.createNamespacedRole({ namespace, body: role });
    await rbac.createNamespacedRoleBinding({ namespace, body: binding });
    const p = await poolNode(a);
    await waitFor("the ticket readable through the Role", () => p.member.ensureTicket().then(() => true, () => undefined), 10_000, 100);
    await p.member.request({ revision: "r1", reason: "osc", since: new Date().toISOString() });
    const leader = startPoolLeader({ api: p.api, ref: p.ref, log, budget: () => ({ text: "1", count: 1 }), clock: () => performance.now(), wallNow: () => new Date(), renewEveryMs: 200 });
    try {
      leader.campaign(true);
      await waitFor("the node admitted", async () => admitted(readTicket((await p.api.get(p.member.ticketName)) ?? {}, p.member.ticketName)) || undefined, 10_000);
      expect((await p.member.holding())?.revision).toBe("r1");
      await p.member.release();
      leader.campaign(false);
    } finally {
      await leader.stop();
    }
  }, 60_000);
});
