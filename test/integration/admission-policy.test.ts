// Integration test (src/ in-process against a real kube-apiserver): docs/admission-policy.yaml installed
// as an operator would, and two node agents A and B, each a client-certificate user holding exactly
// docs/rbac.md's rules (agentRules). What trellis writes (src/kube/node.ts, events.ts, serial-gate.ts,
// pool-leases.ts, pool-leader.ts, and the heartbeat Lease as controllers/lease.ts writes it) passes;
// everything A could do to B's objects with that RBAC alone, or to parts of its own Node it does not own,
// is refused by the policy, naming what was refused. Reading a Secret A is not granted is refused by RBAC (reads never
// reach admission). After an in-place update A deletes the Pods bound to its Node, and only those.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { ApiException, CoordinationV1Api, CoreV1Api, EventsV1Api, PatchStrategy, setHeaderOptions, type V1Lease } from "@kubernetes/client-node";
import { type Kube, kubeFromConnection } from "../../src/kube/client.ts";
import { clientNodeApi } from "../harness/client-node.ts";
import { nodeAgentUserPrefix } from "../../src/kube/csr.ts";
import { KubeError } from "../../src/kube/errors.ts";
import { createEventRecorder } from "../../src/kube/events.ts";
import { deletePodsOnNode } from "../../src/kube/pods.ts";
import { patchNodeCondition, patchNodeMetadata, restoreNodeInternalIP } from "../../src/kube/node.ts";
import { createSerialGate } from "../../src/kube/serial-gate.ts";
import { leaseApi } from "../../src/kube/lease-api.ts";
import { microTime } from "../../src/kube/micro-time.ts";
import { startPoolLeader } from "../../src/kube/pool-leader.ts";
import { patchAnnotations, poolMember, readTicket, secretOwner } from "../../src/kube/pool-leases.ts";
import { createLogger } from "../../src/log.ts";
import { admitted, grantAnnotation, poolLeaseLabel, requestAnnotation, ticketLabel } from "../../src/rollout/pool.ts";
import { forbiddenRequests, installAdmissionPolicy } from "../harness/admission-policy.ts";
import { agentRules, registerNode } from "../harness/agent.ts";
import { type Cluster, startCluster } from "../harness/cluster.ts";
import { waitFor } from "../harness/exec.ts";
import { userWithRules } from "../harness/rbac.ts";

const namespace = "kube-system";
const log = createLogger({ level: "error" });
const pool = { a: "gardener-node-agent-pool-a", b: "gardener-node-agent-pool-b" };
type Agent = { name: string; kube: Kube; kubeconfig: string; core: CoreV1Api; leases: CoordinationV1Api; uid: string };

let cluster: Cluster;
let admin: CoreV1Api;
let a: Agent;
let b: Agent;

async function agent(name: string, secret: string): Promise<Agent> {
  await registerNode(admin, name);
  const rules = [...agentRules([secret]), { namespace: "default", rules: [{ apiGroups: ["events.k8s.io"], resources: ["events"], verbs: ["create"] }] }];
  const { kube, kubeconfig } = await userWithRules(cluster, nodeAgentUserPrefix + name, rules);
  const uid = (await admin.readNode({ name })).metadata?.uid as string;
  return { name, kube, kubeconfig, core: clientNodeApi(kubeconfig, CoreV1Api), leases: clientNodeApi(kubeconfig, CoordinationV1Api), uid };
}

beforeAll(async () => {
  cluster = await startCluster({ controllerManager: false });
  admin = cluster.admin().makeApiClient(CoreV1Api);
  await installAdmissionPolicy(cluster);
  for (const s of Object.values(pool)) await admin.createNamespacedSecret({ namespace, body: { metadata: { name: s }, stringData: { "osc.yaml": "{}" } } });
  [a, b] = [await agent("node-a", pool.a), await agent("node-b", pool.b)];
}, 120_000);

afterAll(async () => {
  await cluster?.stop();
});

/** What the API server answered a refused request: status code and message (the test fails if it succeeded). */
async function refusal(p: Promise<unknown>): Promise<{ code: number | undefined; message: string }> {
  const err = await p.then(
    () => undefined,
    (e: unknown) => e,
  );
  if (err instanceof KubeError) return { code: err.status, message: err.message };
  if (err instanceof ApiException) return { code: err.code, message: statusMessage(err.body) };
  throw new Error(`expected the API server to refuse the request, got ${err === undefined ? "success" : String(err)}`);
}
/** The message of a Status body, which client-node leaves as JSON text. */
function statusMessage(body: unknown): string {
  try {
    return String((JSON.parse(String(body)) as { message?: unknown }).message);
  } catch {
    return String(body);
  }
}
/** A Pod in namespace default, bound to `nodeName` (or to none); no kubelet runs it. */
async function createPod(name: string, nodeName: string | undefined): Promise<void> {
  await admin.createNamespacedPod({ namespace: "default", body: { metadata: { name }, spec: { ...(nodeName ? { nodeName } : {}), containers: [{ name: "c", image: "example.invalid/none" }] } } });
}
const byPolicy = (policy: string) => `ValidatingAdmissionPolicy 'trellis-node-agent-${policy}'`;

/** `of` as a node of the pool of `secret` (src/kube/pool-leases.ts), writing with its own credentials. */
async function poolNode(of: Agent, secret: string) {
  const uid = (await admin.readNamespacedSecret({ name: secret, namespace })).metadata?.uid as string;
  const ref = { secret: { name: secret, uid }, node: { name: of.name, uid: of.uid } };
  const api = leaseApi(of.kube, namespace, log);
  // Shards of one holder: a second admission goes to the record's shard <secret>-slots-1.
  return { ref, api, member: poolMember(api, ref, 1) };
}

/** The heartbeat Lease as controllers/lease.ts writes it. */
function heartbeat(of: Agent, base?: V1Lease): V1Lease {
  const name = `gardener-node-agent-${of.name}`;
  return {
    metadata: { ...base?.metadata, name, namespace, ownerReferences: [{ apiVersion: "v1", kind: "Node", name: of.name, uid: of.uid, controller: true }] },
    spec: { holderIdentity: name, leaseDurationSeconds: 40, renewTime: microTime(new Date()) },
  };
}

describe("an agent writes what trellis writes to its own objects", () => {
  test("its Node's labels and annotations, the zone label once, and the restart annotation removed", async () => {
    await patchNodeMetadata(a.kube, a.name, {
      labels: { "worker.gardener.cloud/kubernetes-version": "1.35.4", "node-role.kubernetes.io/worker": "", "topology.kubernetes.io/zone": "zone-1" },
      annotations: { "checksum/cloud-config-data": "c1", "trellis.dev/effective-checksum": "c2" },
    });
    await patchNodeMetadata(a.kube, a.name, { annotations: { "trellis.dev/effective-checksum": null } });
    await admin.patchNode({ name: a.name, body: { metadata: { annotations: { "worker.gardener.cloud/restart-systemd-services": "kubelet" } } } }, setHeaderOptions("Content-Type", PatchStrategy.MergePatch));
    const node = await patchNodeMetadata(a.kube, a.name, { annotations: { "worker.gardener.cloud/restart-systemd-services": null } });
    expect(node.metadata?.labels?.["topology.kubernetes.io/zone"]).toBe("zone-1");
    expect(node.metadata?.annotations).toMatchObject({ "checksum/cloud-config-data": "c1" });
    expect(node.metadata?.annotations?.["worker.gardener.cloud/restart-systemd-services"]).toBeUndefined();
  });

  test("a label it does not own, patched to the value it already has (trellis patches node-role on a control-plane node that way)", async () => {
    await admin.patchNode({ name: a.name, body: { metadata: { labels: { "node-role.kubernetes.io/control-plane": "" } } } }, setHeaderOptions("Content-Type", PatchStrategy.MergePatch));
    await patchNodeMetadata(a.kube, a.name, { labels: { "node-role.kubernetes.io/control-plane": "", "worker.gardener.cloud/kubernetes-version": "1.35.5" } });
    await admin.patchNode({ name: a.name, body: { metadata: { labels: { "node-role.kubernetes.io/control-plane": null } } } }, setHeaderOptions("Content-Type", PatchStrategy.MergePatch));
  });

  test("its Node's lost InternalIP restored, where it has neither an InternalIP nor an ExternalIP (src/controllers/internal-ip.ts)", async () => {
    const merge = setHeaderOptions("Content-Type", PatchStrategy.MergePatch);
    const lost = await admin.patchNodeStatus({ name: a.name, body: { status: { addresses: [{ type: "Hostname", address: a.name }] } } }, merge);
    try {
      const restored = await restoreNodeInternalIP(a.kube, lost, "10.9.9.9");
      expect(restored.status?.addresses).toEqual([{ type: "InternalIP", address: "10.9.9.9" }]);
    } finally {
      await admin.patchNodeStatus({ name: a.name, body: { status: { addresses: [{ type: "InternalIP", address: "127.0.0.1" }] } } }, merge);
    }
  });

  test("its own conditions", async () => {
    for (const type of ["OperatingSystemConfigApplied", "SystemdUnitsReady", "OperatingSystemConfigRollout"]) {
      await patchNodeCondition(a.kube, a.name, { type, status: "True", reason: "Test", message: "fine" });
    }
    const node = await patchNodeCondition(a.kube, a.name, { type: "OperatingSystemConfigApplied", status: "False", reason: "Test", message: "changed" });
    expect(node.status?.conditions?.map((c) => c.type).sort()).toEqual(["OperatingSystemConfigApplied", "OperatingSystemConfigRollout", "SystemdUnitsReady"]);
  });

  test("its heartbeat Lease: created and renewed", async () => {
    const created = await a.leases.createNamespacedLease({ namespace, body: heartbeat(a) });
    await a.leases.replaceNamespacedLease({ name: created.metadata?.name as string, namespace, body: heartbeat(a, created) });
    await b.leases.createNamespacedLease({ namespace, body: heartbeat(b) });
  });

  test("the serial Lease of its pool: taken, renewed, given back", async () => {
    const uid = (await admin.readNamespacedSecret({ name: pool.a, namespace })).metadata?.uid as string;
    const gate = createSerialGate({ kube: a.kube, secret: { name: pool.a, namespace, uid }, identity: a.name, log });
    expect(await gate.acquire()).toEqual({ held: true });
    await gate.renew();
    await gate.release();
  });

  test("its pool's rollout Leases: its ticket asked and given back, the leader's Lease taken and resigned, grants on its own and B's ticket, the record and a shard of it written, moved on by the leader, failed", async () => {
    // B waits in A's pool: A, leading, writes the grant on B's ticket.
    const [pa, pb] = [await poolNode(a, pool.a), await poolNode(b, pool.a)];
    const since = new Date().toISOString();
    for (const p of [pb, pa]) {
      await p.member.ensureTicket();
      await p.member.request({ revision: "r1", reason: "osc", since });
    }
    const leader = startPoolLeader({ api: pa.api, ref: pa.ref, log, budget: () => ({ text: "2", count: 2 }), clock: () => performance.now(), wallNow: () => new Date(), renewEveryMs: 200, shardCapacity: 1 });
    try {
      leader.campaign(true);
      for (const p of [pa, pb]) {
        await waitFor(`${p.ref.node.name} granted`, async () => admitted(readTicket((await p.api.get(p.member.ticketName)) ?? {}, p.member.ticketName)), 10_000);
      }
      expect((await pa.member.holding())?.revision).toBe("r1");
      expect((await pb.member.holding())?.revision).toBe("r1");
      expect(await pa.api.get(`${pool.a}-slots-1`)).toBeDefined();
      // Newer work under their slots: each asks for it, and the leader moves them on and grants it.
      for (const p of [pa, pb]) await p.member.request({ revision: "r2", reason: "osc", since: new Date().toISOString() });
      for (const p of [pa, pb]) {
        await waitFor(`${p.ref.node.name} moved on`, async () => readTicket((await p.api.get(p.member.ticketName)) ?? {}, p.member.ticketName)?.grant?.revision === "r2", 10_000);
        expect((await p.member.holding())?.revision).toBe("r2");
      }
      await pa.member.recordFailure({ revision: "r2", node: a.name, failure: "health gate failed", at: new Date().toISOString() });
      for (const p of [pb, pa]) await p.member.release();
      leader.campaign(false);
      // Nobody waits any more: the leader lets go of its Lease.
      await waitFor("the leader resigned", async () => !leader.leading() && (await pa.api.get(`${pool.a}-leader`))?.spec?.holderIdentity === undefined, 10_000);
    } finally {
      await leader.stop();
    }
    expect(await pa.member.holding()).toBeUndefined();
    // The leader only logs a refused write and tries again: the audit log shows whether any was.
    for (const of of [a, b]) expect(forbiddenRequests(cluster, nodeAgentUserPrefix + of.name).filter((r) => r.includes("/leases"))).toEqual([]);
  }, 60_000);

  test("the in-place update's result on its Node: failed with a reason, then successful", async () => {
    await patchNodeMetadata(a.kube, a.name, {
      labels: { "node.machine.sapcloud.io/update-result": "failed" },
      annotations: { "node.machine.sapcloud.io/update-failed-reason": "kubelet is not healthy", "node-agent.gardener.cloud/updating-operating-system-version": "13" },
    });
    const node = await patchNodeMetadata(a.kube, a.name, {
      labels: { "node.machine.sapcloud.io/update-result": "successful" },
      annotations: { "node.machine.sapcloud.io/update-failed-reason": null, "node-agent.gardener.cloud/updating-operating-system-version": null },
    });
    expect(node.metadata?.labels?.["node.machine.sapcloud.io/update-result"]).toBe("successful");
  });

  test("the Pods bound to its Node: listed by spec.nodeName and deleted (src/kube/pods.ts); B's and unbound ones left", async () => {
    for (const [name, nodeName] of [["on-a", a.name], ["on-b", b.name], ["unbound", undefined]] as const) await createPod(name, nodeName);
    expect(await deletePodsOnNode(a.kube, a.name)).toEqual([{ namespace: "default", name: "on-a" }]);
    // No kubelet confirms the deletion here: the Pod stays, being deleted.
    expect((await admin.readNamespacedPod({ name: "on-a", namespace: "default" })).metadata?.deletionTimestamp).toBeDefined();
    for (const name of ["on-b", "unbound"]) expect((await admin.readNamespacedPod({ name, namespace: "default" })).metadata?.deletionTimestamp).toBeUndefined();
  });

  test("events about its Node, and repeats of them", async () => {
    const events = createEventRecorder({ kube: a.kube, log });
    const event = { node: { name: a.name, uid: a.uid }, type: "Normal" as const, reason: "OSCApplied", message: "applied" };
    expect(await events.record(event)).toBeUndefined();
    expect(await events.record(event)).toBeUndefined();
  });
});

describe("agent A cannot touch B's objects", () => {
  const merge = setHeaderOptions("Content-Type", PatchStrategy.MergePatch);

  test("B's Node: labels, annotations, conditions", async () => {
    for (const meta of [{ labels: { "worker.gardener.cloud/kubernetes-version": "1.0.0" } }, { annotations: { "checksum/cloud-config-data": "forged" } }]) {
      const r = await refusal(patchNodeMetadata(a.kube, b.name, meta));
      expect(r.code).toBe(403);
      expect(r.message).toContain(byPolicy("nodes"));
      expect(r.message).toContain(`may change only its own Node node-a, not Node node-b`);
    }
    const r = await refusal(patchNodeCondition(a.kube, b.name, { type: "OperatingSystemConfigApplied", status: "False", reason: "Forged", message: "forged" }));
    expect(r.message).toContain(`may change only its own Node node-a, not Node node-b`);
  });

  test("B's heartbeat Lease: renewed, taken, or created in its place", async () => {
    const name = `gardener-node-agent-${b.name}`;
    const lease = await a.leases.readNamespacedLease({ name, namespace });
    for (const body of [heartbeat(b, lease), { ...lease, spec: { ...lease.spec, holderIdentity: a.name } }]) {
      const r = await refusal(a.leases.replaceNamespacedLease({ name, namespace, body }));
      expect(r.code).toBe(403);
      expect(r.message).toContain(byPolicy("leases"));
      expect(r.message).toContain(`may write only its own Lease gardener-node-agent-node-a and rollout Leases`);
    }
    const r = await refusal(a.leases.createNamespacedLease({ namespace, body: { ...heartbeat(b), metadata: { ...heartbeat(b).metadata, name: "gardener-node-agent-node-gone" } } }));
    expect(r.message).toContain(`not gardener-node-agent-node-gone`);
  });

  test("B's hold on a serial or leader Lease: renewed for B, or let go", async () => {
    const uid = (await admin.readNamespacedSecret({ name: pool.b, namespace })).metadata?.uid as string;
    const secret = { name: pool.b, namespace, uid };
    expect(await createSerialGate({ kube: b.kube, secret, identity: b.name, log }).acquire()).toEqual({ held: true });
    await b.leases.createNamespacedLease({
      namespace,
      body: {
        metadata: { name: `${pool.b}-leader`, namespace, labels: { [poolLeaseLabel]: pool.b }, ownerReferences: [secretOwner(secret)] },
        spec: { holderIdentity: b.name, leaseDurationSeconds: 30, renewTime: microTime(new Date()) },
      },
    });
    for (const name of [pool.b, `${pool.b}-leader`]) {
      const held = await a.leases.readNamespacedLease({ name, namespace });
      const renewedForB = await refusal(a.leases.replaceNamespacedLease({ name, namespace, body: { ...held, spec: { ...held.spec, renewTime: microTime(new Date()) } } }));
      expect(renewedForB.message).toContain(`may hold Lease ${name} only for itself, not for node-b`);
      const released = await refusal(a.leases.replaceNamespacedLease({ name, namespace, body: { ...held, spec: { ...held.spec, holderIdentity: undefined } } }));
      expect(released.message).toContain(`may not change Lease ${name} for its holder node-b`);
    }
  });

  test("its pool's leader Lease, held for B", async () => {
    const uid = (await admin.readNamespacedSecret({ name: pool.a, namespace })).metadata?.uid as string;
    const name = `${pool.a}-leader`;
    const held = await a.leases.readNamespacedLease({ name, namespace });
    const r = await refusal(a.leases.replaceNamespacedLease({ name, namespace, body: { ...held, spec: { ...held.spec, holderIdentity: b.name } } }));
    expect(r.code).toBe(403);
    expect(r.message).toContain(byPolicy("leases"));
    expect(r.message).toContain(`may hold Lease ${name} only for itself, not for node-b`);
    const body: V1Lease = { metadata: { name: `${pool.b}-leader`, namespace, ownerReferences: [secretOwner({ name: pool.b, uid })] }, spec: { holderIdentity: b.name } };
    expect((await refusal(a.leases.createNamespacedLease({ namespace, body }))).message).toContain(`may hold Lease ${pool.b}-leader only for itself, not for node-b`);
  });

  test("B's ticket: its request, holderIdentity or labels changed (its grant may change); a ticket created for B, under B's name, or posed as by its heartbeat", async () => {
    const pb = await poolNode(b, pool.a);
    await pb.member.request({ revision: "r3", reason: "osc", since: new Date().toISOString() });
    const name = pb.member.ticketName;
    const ticket = await a.leases.readNamespacedLease({ name, namespace });
    const annotated = (changes: Record<string, string | null>): V1Lease => ({ ...ticket, metadata: { ...ticket.metadata, annotations: patchAnnotations(ticket.metadata?.annotations, changes) } });
    const forged = JSON.stringify({ revision: "r9", reason: "osc", since: new Date().toISOString() });
    for (const [what, body] of [
      [`annotation ${requestAnnotation}`, annotated({ [requestAnnotation]: forged })],
      [`annotation ${requestAnnotation}`, annotated({ [requestAnnotation]: null })],
      ["holderIdentity", { ...ticket, spec: { ...ticket.spec, holderIdentity: a.name } }],
      ["labels", { ...ticket, metadata: { ...ticket.metadata, labels: { [ticketLabel]: pool.b } } }],
    ] as const) {
      const r = await refusal(a.leases.replaceNamespacedLease({ name, namespace, body }));
      expect(r.code, what).toBe(403);
      expect(r.message, what).toContain(byPolicy("leases"));
      expect(r.message, what).toContain(`may change only annotation ${grantAnnotation} of Lease ${name} (the ticket of node-b), not its ${what}`);
    }
    // What the pool's leader writes there passes, and B clears it when it gives its turn back.
    const granted = await a.leases.replaceNamespacedLease({ name, namespace, body: annotated({ [grantAnnotation]: JSON.stringify({ revision: "r3", at: new Date().toISOString() }) }) });
    expect(admitted(readTicket(granted, name))).toBe(true);
    await pb.member.release();
    expect((await a.leases.readNamespacedLease({ name, namespace })).metadata?.annotations?.[grantAnnotation]).toBeUndefined();
    const ticketFor = (holder: Agent, owner: Agent): V1Lease => ({
      metadata: { name: `${pool.b}-node-${b.name}`, namespace, labels: { [ticketLabel]: pool.b }, ownerReferences: [{ apiVersion: "v1", kind: "Node", name: owner.name, uid: owner.uid, controller: true }] },
      spec: { holderIdentity: holder.name },
    });
    for (const [body, says] of [
      [ticketFor(b, b), "not held by node-b and controlled by Node node-b"],
      [ticketFor(a, b), "not held by node-a and controlled by Node node-b"],
      [ticketFor(a, a), `only as its own (held by node-a, controlled by Node node-a, named ${pool.b}-node-node-a)`],
    ] as const) {
      const r = await refusal(a.leases.createNamespacedLease({ namespace, body }));
      expect(r.message, says).toContain(`may write ticket Lease ${pool.b}-node-node-b only as its own`);
      expect(r.message, says).toContain(says);
    }
    // Its heartbeat Lease, which it may otherwise write as it likes, made to pass for B's ticket.
    const heartbeatName = `gardener-node-agent-${a.name}`;
    const own = await a.leases.readNamespacedLease({ name: heartbeatName, namespace });
    const posing = { ...own, metadata: { ...own.metadata, labels: { [ticketLabel]: pool.a } }, spec: { ...own.spec, holderIdentity: b.name } };
    const r = await refusal(a.leases.replaceNamespacedLease({ name: heartbeatName, namespace, body: posing }));
    expect(r.message).toContain(`may not make Lease ${heartbeatName} a ticket Lease (it is a heartbeat Lease)`);
  });

  test("a pool's record held by a node", async () => {
    const name = `${pool.a}-slots`;
    const record = await a.leases.readNamespacedLease({ name, namespace });
    const r = await refusal(a.leases.replaceNamespacedLease({ name, namespace, body: { ...record, spec: { ...record.spec, holderIdentity: a.name } } }));
    expect(r.message).toContain(`may not set holderIdentity node-a on Lease ${name} (a pool record names its holders`);
  });

  test("what the policy cannot refuse: taking over B's serial Lease while B still renews it (it cannot read the time)", async () => {
    const held = await a.leases.readNamespacedLease({ name: pool.b, namespace });
    const taken = await a.leases.replaceNamespacedLease({ name: pool.b, namespace, body: { ...held, spec: { ...held.spec, holderIdentity: a.name } } });
    expect(taken.spec?.holderIdentity).toBe(a.name);
  });

  test("Leases that are neither its heartbeat nor a rollout Lease, e.g. a leader election", async () => {
    const body: V1Lease = { metadata: { name: "kube-scheduler", namespace, ownerReferences: [{ apiVersion: "v1", kind: "Secret", name: "kube-scheduler", uid: "x", controller: true }] }, spec: { holderIdentity: a.name } };
    const r = await refusal(a.leases.createNamespacedLease({ namespace, body }));
    expect(r.message).toContain("not kube-scheduler");
  });

  test("an Event about B's Node, core/v1 and events.k8s.io/v1; and a repeat of one", async () => {
    const ke = await createEventRecorder({ kube: a.kube, log }).record({ node: { name: b.name, uid: "" }, type: "Warning", reason: "Forged", message: "forged" });
    expect(ke?.status).toBe(403);
    expect(ke?.message).toContain(`may write only Events about its own Node node-a, not about Node node-b`);
    const r = await refusal(
      clientNodeApi(a.kubeconfig, EventsV1Api).createNamespacedEvent({
        namespace: "default",
        body: { metadata: { name: "forged" }, regarding: { kind: "Node", name: b.name }, reason: "Forged", action: "Forged", eventTime: microTime(new Date()), reportingController: "x", reportingInstance: "x", type: "Normal" },
      }),
    );
    expect(r.message).toContain(`not about Node node-b`);
    const bEvents = createEventRecorder({ kube: b.kube, log });
    expect(await bEvents.record({ node: { name: b.name, uid: b.uid }, type: "Normal", reason: "OSCApplied", message: "b" })).toBeUndefined();
    const event = (await admin.listNamespacedEvent({ namespace: "default", fieldSelector: `involvedObject.name=${b.name}` })).items[0];
    const bumped = await refusal(a.core.patchNamespacedEvent({ name: event?.metadata?.name as string, namespace: "default", body: { count: 7 } }, merge));
    expect(bumped.message).toContain(`not about Node node-b`);
  });

  test("B's Pod, and a Pod bound to no Node: deleting either", async () => {
    for (const [name, boundTo] of [["on-b", "node-b"], ["unbound", "no Node"]]) {
      const r = await refusal(a.core.deleteNamespacedPod({ name: name as string, namespace: "default" }));
      expect(r.code).toBe(403);
      expect(r.message).toContain(byPolicy("pods"));
      expect(r.message).toContain(`may delete only Pods bound to its own Node node-a, not Pod default/${name} (bound to ${boundTo})`);
    }
  });

  test("what the policy cannot refuse: listing every node's Pods (a read; RBAC cannot narrow a list to a field selector)", async () => {
    const all = await a.core.listPodForAllNamespaces();
    expect(all.items.map((p) => p.metadata?.name).sort()).toEqual(["on-a", "on-b", "unbound"]);
  });

  test("a Secret it is not granted (RBAC: reads never reach admission)", async () => {
    const reads = [
      () => a.core.readNamespacedSecret({ name: pool.b, namespace }),
      () => a.core.listNamespacedSecret({ namespace }),
      () => a.core.listNamespacedSecret({ namespace, fieldSelector: `metadata.name=${pool.b}` }),
    ];
    for (const read of reads) {
      const r = await refusal(read());
      expect(r.code).toBe(403);
      expect(r.message).toContain(`User "${nodeAgentUserPrefix}node-a" cannot`);
    }
    expect((await a.core.readNamespacedSecret({ name: pool.a, namespace })).metadata?.name).toBe(pool.a);
  });
});

describe("agent A cannot change what it does not own on its own Node", () => {
  const merge = setHeaderOptions("Content-Type", PatchStrategy.MergePatch);
  const denied = async (what: string, p: Promise<unknown>, says: string) => {
    const r = await refusal(p);
    expect(r.code, what).toBe(403);
    expect(r.message, what).toContain(byPolicy("nodes"));
    expect(r.message, what).toContain(says);
  };

  test("labels: node-role control-plane, the zone once set, the hostname, the pause label", async () => {
    for (const [label, value] of [
      ["node-role.kubernetes.io/control-plane", ""],
      ["topology.kubernetes.io/zone", "zone-2"],
      ["topology.kubernetes.io/zone", null],
      ["kubernetes.io/hostname", "node-b"],
      ["worker.gardener.cloud/gardener-node-agent-secret-name", pool.b],
      ["rollout.trellis.dev/paused", "false"],
      ["node-restriction.kubernetes.io/trusted", "true"],
    ] as const) {
      await denied(`label ${label}`, patchNodeMetadata(a.kube, a.name, { labels: { [label]: value } }), `may not change label(s) ${label} of Node node-a`);
    }
  });

  test("annotations: the reconciliation delay, a restart request", async () => {
    for (const key of ["node-agent.gardener.cloud/reconciliation-delay", "worker.gardener.cloud/restart-systemd-services"]) {
      await denied(`annotation ${key}`, patchNodeMetadata(a.kube, a.name, { annotations: { [key]: "1m" } }), `may not change annotation(s) ${key} of Node node-a`);
    }
  });

  test("kubelet's conditions, the rest of the status, the spec, owners", async () => {
    await denied("Ready", patchNodeCondition(a.kube, a.name, { type: "Ready", status: "True", reason: "Forged", message: "forged" }), "may not change condition(s) Ready of Node node-a");
    const status = setHeaderOptions("Content-Type", PatchStrategy.StrategicMergePatch);
    await denied("addresses", a.core.patchNodeStatus({ name: a.name, body: { status: { addresses: [{ type: "InternalIP", address: "10.9.9.9" }] } } }, status), "may change only conditions in the status of Node node-a");
    // An InternalIP "restored" over an ExternalIP, or as more than the one address.
    const external = await admin.patchNodeStatus({ name: a.name, body: { status: { addresses: [{ type: "ExternalIP", address: "198.51.100.1" }] } } }, merge);
    try {
      await denied("InternalIP over an ExternalIP", restoreNodeInternalIP(a.kube, external, "10.9.9.9"), "may change only conditions in the status of Node node-a");
      const lost = await admin.patchNodeStatus({ name: a.name, body: { status: { addresses: [] } } }, merge);
      const two = [{ type: "InternalIP", address: "10.9.9.9" }, { type: "Hostname", address: "node-a" }];
      await denied("two addresses", a.core.patchNodeStatus({ name: a.name, body: { metadata: { resourceVersion: lost.metadata?.resourceVersion }, status: { addresses: two } } }, merge), "may change only conditions in the status of Node node-a");
    } finally {
      await admin.patchNodeStatus({ name: a.name, body: { status: { addresses: [{ type: "InternalIP", address: "127.0.0.1" }] } } }, merge);
    }
    await denied("unschedulable", a.core.patchNode({ name: a.name, body: { spec: { unschedulable: true } } }, merge), "may not change the spec of Node node-a");
    await denied("taints", a.core.patchNode({ name: a.name, body: { spec: { taints: [{ key: "x", effect: "NoSchedule" }] } } }, merge), "may not change the spec of Node node-a");
    await denied("finalizers", a.core.patchNode({ name: a.name, body: { metadata: { finalizers: ["example.com/keep"] } } }, merge), "may not change the owners or finalizers of Node node-a");
  });

  test("a user in group gardener.cloud:node-agents whose name names no machine changes no Node", async () => {
    const user = "not-a-machine";
    await userWithRules(cluster, user, [{ rules: [{ apiGroups: [""], resources: ["nodes"], verbs: ["patch"] }] }]);
    const { kubeconfig } = await cluster.clientCertUser(user, ["gardener.cloud:node-agents"]);
    const kube = kubeFromConnection({ kind: "kubeconfig", path: kubeconfig });
    await denied("no machine", patchNodeMetadata(kube, a.name, { annotations: { "checksum/cloud-config-data": "x" } }), `node agent ${user} names no machine`);
  });
});
