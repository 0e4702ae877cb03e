// src/kube/serial-gate.ts against a real kube-apiserver, as node users holding only the lease rules of
// docs/rbac.md: the Lease it creates (owner, holder, duration, MicroTime fields on the wire), waiting
// for an active holder, release and hand-over, take-over of an expired lease, three nodes contending
// (never two holders, checked both from the nodes' own records and from every version of the Lease),
// and the garbage collector deleting the Lease with its Secret.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { CoordinationV1Api, CoreV1Api, type V1Lease, type V1ObjectMeta } from "@kubernetes/client-node";
import { type Kube, kubeFromConnection } from "../../src/kube/client.ts";
import { KubeError } from "../../src/kube/errors.ts";
import { kubeGet } from "../../src/kube/http.ts";
import { createSerialGate, isSerialRollout, type SerialGate, serialAnnotation } from "../../src/kube/serial-gate.ts";
import { watchObjects } from "../../src/kube/watch.ts";
import { createLogger, type Logger } from "../../src/log.ts";
import { type Cluster, startCluster } from "../harness/cluster.ts";
import { rejection, waitFor } from "../harness/exec.ts";
import { auditOf, userWithRules } from "../harness/rbac.ts";

const namespace = "kube-system";
const nodes = ["node-a", "node-b", "node-c"] as const;
type NodeName = (typeof nodes)[number];

let cluster: Cluster;
let core: CoreV1Api;
let leases: CoordinationV1Api;
let admin: Kube;
/** One client per node, each a user holding exactly docs/rbac.md's lease rule. */
const kubes = {} as Record<NodeName, Kube>;

beforeAll(async () => {
  // The controller manager is for the garbage collector (last test).
  cluster = await startCluster();
  core = cluster.admin().makeApiClient(CoreV1Api);
  leases = cluster.admin().makeApiClient(CoordinationV1Api);
  admin = kubeFromConnection({ kind: "kubeconfig", path: cluster.adminKubeconfig });
  for (const node of nodes) {
    ({ kube: kubes[node] } = await userWithRules(cluster, node, [
      { namespace, rules: [{ apiGroups: ["coordination.k8s.io"], resources: ["leases"], verbs: ["get", "create", "update"] }] },
    ]));
  }
}, 180_000);
afterAll(() => cluster?.stop(), 30_000);

async function oscSecret(name: string): Promise<{ name: string; namespace: string; uid: string }> {
  const s = await core.createNamespacedSecret({
    namespace,
    body: { metadata: { name, annotations: { [serialAnnotation]: "true" } }, data: { "osc.yaml": "" } },
  });
  expect(isSerialRollout(s)).toBe(true);
  return { name, namespace, uid: s.metadata?.uid as string };
}

type Logs = { log: Logger; lines: Record<string, unknown>[] };
function logs(): Logs {
  const lines: Record<string, unknown>[] = [];
  return { log: createLogger({ level: "debug", write: (l) => lines.push(JSON.parse(l)) }), lines };
}

/** The Lease as kube-apiserver sends it, parsed from the raw JSON (client-node would decode the times). */
async function rawLease(name: string): Promise<{ text: string; lease: { metadata?: V1ObjectMeta; spec?: Record<string, unknown> } }> {
  const res = await kubeGet(admin, `/apis/coordination.k8s.io/v1/namespaces/${namespace}/leases/${name}`, {}, AbortSignal.timeout(10_000));
  const text = await res.text();
  expect(res.status).toBe(200);
  return { text, lease: JSON.parse(text) };
}

const failure = (p: Promise<unknown>) => rejection(p, KubeError);

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

describe("one Secret, a clock under the test's control", () => {
  let secret: Awaited<ReturnType<typeof oscSecret>>;
  let clock = new Date("2026-11-21T11:05:17.123Z");
  const now = () => clock;
  const gates = {} as Record<NodeName, SerialGate>;
  const gateLogs = {} as Record<NodeName, Logs>;

  beforeAll(async () => {
    secret = await oscSecret("osc-first");
    for (const node of nodes) {
      gateLogs[node] = logs();
      // maxRetryAfterMs well above 600 s, to see the lease's own expiry in retryAfterMs.
      gates[node] = createSerialGate({ kube: kubes[node], secret, identity: node, log: gateLogs[node].log, now, maxRetryAfterMs: 3_600_000 });
    }
  });

  test("the first acquire creates the Lease: owned by the Secret, holder, 600 s, MicroTime on the wire", async () => {
    expect(await gates["node-a"].acquire()).toEqual({ held: true });
    const { text, lease } = await rawLease("osc-first");
    expect(lease.metadata?.ownerReferences).toEqual([{ apiVersion: "v1", kind: "Secret", name: "osc-first", uid: secret.uid, controller: true }]);
    expect(lease.spec).toEqual({
      holderIdentity: "node-a",
      leaseDurationSeconds: 600,
      acquireTime: "2026-11-21T11:05:17.123000Z",
      renewTime: "2026-11-21T11:05:17.123000Z",
      leaseTransitions: 0,
    });
    expect(text).toMatch(/"renewTime":"2026-11-21T11:05:17\.123000Z"/);
    expect(text).toMatch(/"acquireTime":"2026-11-21T11:05:17\.123000Z"/);
    expect(gateLogs["node-a"].lines).toContainEqual(expect.objectContaining({ level: "info", msg: "acquired the serial lease (created it)", lease: "kube-system/osc-first", identity: "node-a" }));
  });

  test("another node is told who holds it and when the lease runs out; the holder's acquire renews", async () => {
    clock = new Date("2026-11-21T11:06:17.123Z"); // 60 s later
    expect(await gates["node-b"].acquire()).toEqual({ held: false, holder: "node-a", retryAfterMs: 540_000 });
    // With the default cap, a waiting node looks again within 30 s (the holder may release early).
    const capped = createSerialGate({ kube: kubes["node-b"], secret, identity: "node-b", log: logs().log, now });
    expect(await capped.acquire()).toEqual({ held: false, holder: "node-a", retryAfterMs: 30_000 });

    clock = new Date("2026-11-21T11:15:16.623Z"); // 0.5 s before expiry
    expect(await gates["node-c"].acquire()).toEqual({ held: false, holder: "node-a", retryAfterMs: 500 });

    expect(await gates["node-a"].acquire()).toEqual({ held: true });
    await gates["node-a"].renew();
    const { lease } = await rawLease("osc-first");
    expect(lease.spec).toEqual({
      holderIdentity: "node-a",
      leaseDurationSeconds: 600,
      acquireTime: "2026-11-21T11:05:17.123000Z",
      renewTime: "2026-11-21T11:15:16.623000Z",
      leaseTransitions: 0,
    });
  });

  test("release clears only the holder; then another node acquires; a non-holder's release and renew", async () => {
    await gates["node-a"].release();
    const released = (await rawLease("osc-first")).lease;
    expect(released.spec).toEqual({
      leaseDurationSeconds: 600,
      acquireTime: "2026-11-21T11:05:17.123000Z",
      renewTime: "2026-11-21T11:15:16.623000Z",
      leaseTransitions: 0,
    });
    expect(released.metadata?.ownerReferences?.[0]?.uid).toBe(secret.uid);
    // Releasing again: nothing to do, nothing written.
    await gates["node-a"].release();
    expect((await rawLease("osc-first")).lease.metadata?.resourceVersion).toBe(released.metadata?.resourceVersion as string);

    clock = new Date("2026-11-21T11:15:20Z");
    expect(await gates["node-b"].acquire()).toEqual({ held: true });
    const taken = (await rawLease("osc-first")).lease;
    expect(taken.spec).toEqual({
      holderIdentity: "node-b",
      leaseDurationSeconds: 600,
      acquireTime: "2026-11-21T11:15:20.000000Z",
      renewTime: "2026-11-21T11:15:20.000000Z",
      leaseTransitions: 1,
    });
    expect(await gates["node-a"].acquire()).toEqual({ held: false, holder: "node-b", retryAfterMs: 600_000 });

    // node-a does not hold it: its release writes nothing, its renew is refused.
    await gates["node-a"].release();
    const err = await failure(gates["node-a"].renew());
    expect(err.reason).toBe("conflict");
    expect(err.message).toBe("renewing serial lease kube-system/osc-first for node-a: no longer held by node-a: node-b holds it now");
    expect((await rawLease("osc-first")).lease.metadata?.resourceVersion).toBe(taken.metadata?.resourceVersion as string);
    await gates["node-b"].release();
  });
});

test("an expired lease is taken over; the old holder's renew is then a conflict", async () => {
  const secret = await oscSecret("osc-expiry");
  const a = logs();
  const b = logs();
  const gateA = createSerialGate({ kube: kubes["node-a"], secret, identity: "node-a", log: a.log, durationSeconds: 2 });
  const gateB = createSerialGate({ kube: kubes["node-b"], secret, identity: "node-b", log: b.log, durationSeconds: 2 });

  expect(await gateA.acquire()).toEqual({ held: true });
  const waiting = await gateB.acquire();
  if (waiting.held) throw new Error("node-b acquired a lease node-a holds");
  expect(waiting.holder).toBe("node-a");
  expect(waiting.retryAfterMs).toBeGreaterThan(1_000);
  expect(waiting.retryAfterMs).toBeLessThanOrEqual(2_000);

  await sleep(waiting.retryAfterMs + 50); // node-a does not renew
  expect(await gateB.acquire()).toEqual({ held: true });
  expect(b.lines).toContainEqual(expect.objectContaining({ level: "warn", msg: "taking over the serial lease: its holder did not renew it in time", holder: "node-a" }));
  const { lease } = await rawLease("osc-expiry");
  expect(lease.spec).toMatchObject({ holderIdentity: "node-b", leaseDurationSeconds: 2, leaseTransitions: 1 });

  const err = await failure(gateA.renew());
  expect(err.reason).toBe("conflict");
  expect(err.message).toBe("renewing serial lease kube-system/osc-expiry for node-a: no longer held by node-a: node-b holds it now");
  // node-a's update carried the resourceVersion of its own last write: the API refused it with 409.
  const refused = auditOf(cluster, "node-a").filter((e) => e.objectRef?.name === "osc-expiry" && e.verb === "update" && e.responseStatus?.code === 409);
  expect(refused).toHaveLength(1);
  await gateA.release(); // not the holder: nothing happens
  expect((await rawLease("osc-expiry")).lease.spec?.holderIdentity).toBe("node-b");
  await gateB.renew();
  await gateB.release();
}, 20_000);

test("three nodes contending: never two holders, every node gets its turns", async () => {
  const name = "osc-contention";
  const secret = await oscSecret(name);

  // Every version of the Lease, in order, from before the first write.
  type Version = { rv: number; holder: string; transitions: number; renewTime: string };
  const history: Version[] = [];
  const watcher = watchObjects<V1Lease>({
    kube: admin,
    path: `/apis/coordination.k8s.io/v1/namespaces/${namespace}/leases`,
    fieldSelector: `metadata.name=${name}`,
    log: logs().log,
    onEvent: (e) => {
      const raw = e.object as V1Lease & { spec?: { renewTime?: string } };
      history.push({
        rv: Number(raw.metadata?.resourceVersion),
        holder: raw.spec?.holderIdentity ?? "",
        transitions: raw.spec?.leaseTransitions ?? 0,
        renewTime: raw.spec?.renewTime ?? "",
      });
    },
  });
  await watcher.synced;

  type Mark = { node: NodeName; what: "enter" | "leave"; at: number };
  const records: Mark[] = [];
  const gateLogs = {} as Record<NodeName, Logs>;
  const turns = 3;

  async function node(id: NodeName): Promise<void> {
    gateLogs[id] = logs();
    // Short retries so that the nodes poll hard and race for every release.
    const gate = createSerialGate({ kube: kubes[id], secret, identity: id, log: gateLogs[id].log, maxRetryAfterMs: 15 });
    for (let held = 0; held < turns; ) {
      const d = await gate.acquire();
      if (!d.held) {
        expect(d.holder).not.toBe(id);
        expect(d.retryAfterMs).toBe(15);
        await sleep(d.retryAfterMs * Math.random());
        continue;
      }
      records.push({ node: id, what: "enter", at: performance.now() });
      await sleep(50 + Math.random() * 50);
      await gate.renew();
      await sleep(50 + Math.random() * 50);
      records.push({ node: id, what: "leave", at: performance.now() });
      await gate.release();
      held++;
    }
  }

  try {
    await Promise.all(nodes.map(node));
    // The watch has delivered the last version before the history is judged.
    const last = Number((await leases.readNamespacedLease({ name, namespace })).metadata?.resourceVersion);
    await waitFor("the watch to deliver the Lease's last version", () => history.at(-1)?.rv === last, 10_000, 20);
    expect(watcher.stats().gone).toBe(0); // no relist: the history has no gaps
  } finally {
    await watcher.stop();
  }

  // 1. The nodes' own records (one event loop: the array's order is the real order).
  let inside: NodeName | undefined;
  for (const r of records) {
    if (r.what === "enter") {
      expect({ entering: r.node, while: inside }).toEqual({ entering: r.node, while: undefined });
      inside = r.node;
    } else {
      expect(inside).toBe(r.node);
      inside = undefined;
    }
  }
  for (const id of nodes) expect(records.filter((r) => r.node === id && r.what === "enter")).toHaveLength(turns);
  for (let i = 1; i < records.length; i++) expect(records[i]?.at as number).toBeGreaterThanOrEqual(records[i - 1]?.at as number);

  // 2. The Lease's versions: each write a new version; the holder changes only from nobody to somebody
  // (an acquisition) or from somebody to nobody (that holder's release), never from one node to another.
  for (let i = 1; i < history.length; i++) expect(history[i]?.rv as number).toBeGreaterThan(history[i - 1]?.rv as number);
  const acquisitions: Version[] = [];
  let previous: Version | undefined;
  for (const v of history) {
    const before = previous?.holder ?? "";
    if (v.holder !== before) {
      if (before !== "") expect({ from: before, to: v.holder }).toEqual({ from: before, to: "" });
      if (v.holder !== "") acquisitions.push(v);
    } else if (v.holder !== "") {
      // Same holder: a renew, which moves renewTime forward.
      expect(v.renewTime > (previous?.renewTime ?? "")).toBe(true);
    }
    previous = v;
  }
  expect(acquisitions.map((v) => v.holder)).toEqual(records.filter((r) => r.what === "enter").map((r) => r.node));
  expect(acquisitions.map((v) => v.transitions)).toEqual(acquisitions.map((_, i) => i));
  // 3 turns x (acquire, renew, release) x 3 nodes: every successful write is one version.
  expect(history).toHaveLength(3 * turns * nodes.length);

  // Each acquisition a node logged is exactly one of these versions.
  const logged = nodes.flatMap((id) =>
    gateLogs[id].lines.filter((l) => String(l.msg).startsWith("acquired the serial lease")).map((l) => ({ rv: Number(l.resourceVersion), holder: id as string })),
  );
  expect(logged.sort((x, y) => x.rv - y.rv)).toEqual(acquisitions.map((v) => ({ rv: v.rv, holder: v.holder })));

  // How often a write was refused because another node had written first (usually a few per run;
  // the next test makes sure there are some).
  const conflicts = nodes.flatMap((id) => auditOf(cluster, id)).filter((e) => e.objectRef?.name === name && e.responseStatus?.code === 409);
  console.log(`contention: ${history.length} versions, ${conflicts.length} writes refused with 409`);
}, 60_000);

test("simultaneous acquires: exactly one node wins each time; the others' writes are refused (409) and they wait", async () => {
  const name = "osc-race";
  const secret = await oscSecret(name);
  const gates = nodes.map((id) => createSerialGate({ kube: kubes[id], secret, identity: id, log: logs().log }));
  const conflicts = () => nodes.flatMap((id) => auditOf(cluster, id)).filter((e) => e.objectRef?.name === name && e.responseStatus?.code === 409);
  // Three reads in flight at once usually all see the same version, and then two of the three writes
  // lose; rounds go on until that has been seen (the first round, a create by all three, nearly always).
  for (let round = 0; round < 5 || (conflicts().length === 0 && round < 100); round++) {
    const decisions = await Promise.all(gates.map((g) => g.acquire()));
    const winners = nodes.filter((_, i) => decisions[i]?.held);
    expect(winners).toHaveLength(1);
    const winner = winners[0] as NodeName;
    for (const d of decisions) if (!d.held) expect(d).toEqual({ held: false, holder: winner, retryAfterMs: 30_000 });
    await gates[nodes.indexOf(winner)]?.release();
  }
  const refused = conflicts();
  expect(refused.length).toBeGreaterThan(0);
  expect(refused.every((e) => e.verb === "create" || e.verb === "update")).toBe(true);
}, 60_000);

test("deleting the Secret deletes the Lease (garbage collector); an orphaned Lease is adopted by the next Secret", async () => {
  const first = await oscSecret("osc-gc");
  const gate = createSerialGate({ kube: kubes["node-a"], secret: first, identity: "node-a", log: logs().log });
  expect(await gate.acquire()).toEqual({ held: true });
  await gate.release();

  // Deleted with orphaning: the garbage collector leaves the Lease, without the owner reference.
  await core.deleteNamespacedSecret({ name: "osc-gc", namespace, propagationPolicy: "Orphan" });
  await waitFor("the Lease to lose its owner", async () => ((await rawLease("osc-gc")).lease.metadata?.ownerReferences ?? []).length === 0, 30_000);
  // The Secret goes once the garbage collector has orphaned its dependents and removed its finalizer.
  await waitFor("the Secret to be deleted", async () => (await core.listNamespacedSecret({ namespace, fieldSelector: "metadata.name=osc-gc" })).items.length === 0, 30_000);

  // The next Secret of that name: the first write to the Lease makes it the owner.
  const second = await oscSecret("osc-gc");
  const next = createSerialGate({ kube: kubes["node-b"], secret: second, identity: "node-b", log: logs().log });
  expect(await next.acquire()).toEqual({ held: true });
  expect((await rawLease("osc-gc")).lease.metadata?.ownerReferences).toEqual([{ apiVersion: "v1", kind: "Secret", name: "osc-gc", uid: second.uid, controller: true }]);

  await core.deleteNamespacedSecret({ name: "osc-gc", namespace });
  await waitFor(
    "the garbage collector to delete the Lease",
    async () => (await leases.listNamespacedLease({ namespace, fieldSelector: "metadata.name=osc-gc" })).items.length === 0,
    30_000,
  );
  const err = await failure(next.renew());
  expect(err.reason).toBe("conflict");
  expect(err.message).toBe("renewing serial lease kube-system/osc-gc for node-b: no longer held by node-b: the Lease is gone");
  await next.release(); // nothing to release
}, 60_000);

test("RBAC: get and update can be limited to the Lease's name, create cannot", async () => {
  const secret = await oscSecret("osc-rbac");
  const leaseRule = { apiGroups: ["coordination.k8s.io"], resources: ["leases"] };
  // The narrowest grant that works (docs/rbac.md): create for any name, get and update by name.
  const { kube: narrow } = await userWithRules(cluster, "narrow-node", [
    { namespace, rules: [{ ...leaseRule, verbs: ["create"] }, { ...leaseRule, verbs: ["get", "update"], resourceNames: ["osc-rbac"] }] },
  ]);
  const gate = createSerialGate({ kube: narrow, secret, identity: "node-a", log: logs().log });
  expect(await gate.acquire()).toEqual({ held: true });
  await gate.renew();
  await gate.release();
  expect(await gate.acquire()).toEqual({ held: true });
  // Another Secret's Lease: reading it is refused.
  const other = createSerialGate({ kube: narrow, secret: { ...secret, name: "osc-other" }, identity: "node-a", log: logs().log });
  const denied = await failure(other.acquire());
  expect(denied.reason).toBe("forbidden");
  expect(denied.message).toStartWith('acquiring serial lease kube-system/osc-other for node-a: forbidden (403): leases.coordination.k8s.io "osc-other" is forbidden');

  // create under resourceNames never matches: a create request names no object when it is authorized.
  const second = await oscSecret("osc-rbac-names");
  const { kube: byName } = await userWithRules(cluster, "names-only-node", [
    { namespace, rules: [{ ...leaseRule, verbs: ["get", "create", "update"], resourceNames: ["osc-rbac-names"] }] },
  ]);
  const refused = await failure(createSerialGate({ kube: byName, secret: second, identity: "node-a", log: logs().log }).acquire());
  expect(refused.reason).toBe("forbidden");
  expect(refused.message).toContain('User "names-only-node" cannot create resource "leases" in API group "coordination.k8s.io" in the namespace "kube-system"');
});
