// Integration test (src/ in-process against a real kube-apiserver and kube-controller-manager):
// src/kube/slots.ts and the reclaim policy of src/controllers/rollout.ts, as node users holding only
// docs/rbac.md's slot rules. The Leases it writes (label, owner, checksum, holder), waiting while all k
// are taken, giving back and taking over, never more than k holders under contention (every version of
// every slot Lease, from a watch), a dead holder's slot kept while its Node is NotReady or on another OSC
// and taken over once it is Ready with the slot's OSC or gone, a slot freed by an operator, and the
// garbage collector deleting the slots with their Secret.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { CoordinationV1Api, CoreV1Api, PatchStrategy, setHeaderOptions, type V1Lease, Watch } from "@kubernetes/client-node";
import { safeToReclaim } from "../../src/controllers/rollout.ts";
import type { Kube } from "../../src/kube/client.ts";
import { createSlots, slotChecksumAnnotation, slotPoolLabel, type Slots } from "../../src/kube/slots.ts";
import { createLogger } from "../../src/log.ts";
import { type Cluster, startCluster } from "../harness/cluster.ts";
import { waitFor } from "../harness/exec.ts";
import { userWithRules } from "../harness/rbac.ts";

const namespace = "kube-system";
const names = ["node-a", "node-b", "node-c", "node-d"] as const;
type Name = (typeof names)[number];
const log = createLogger({ level: "error" });

let cluster: Cluster;
let core: CoreV1Api;
let leases: CoordinationV1Api;
const kubes = {} as Record<Name, Kube>;

beforeAll(async () => {
  cluster = await startCluster();
  core = cluster.admin().makeApiClient(CoreV1Api);
  leases = cluster.admin().makeApiClient(CoordinationV1Api);
  for (const n of names) {
    ({ kube: kubes[n] } = await userWithRules(cluster, n, [
      { namespace, rules: [{ apiGroups: ["coordination.k8s.io"], resources: ["leases"], verbs: ["list", "get", "create", "update"] }] },
      { rules: [{ apiGroups: [""], resources: ["nodes"], verbs: ["get"] }] },
    ]));
  }
}, 180_000);

afterAll(async () => {
  await cluster?.stop();
});

let seq = 0;
async function pool() {
  const name = `pool-${++seq}`;
  const secret = await core.createNamespacedSecret({ namespace, body: { metadata: { name }, data: {} } });
  const slots = (n: Name, durationSeconds = 40) => createSlots({ kube: kubes[n], secret: { name, namespace, uid: secret.metadata?.uid as string }, identity: n, log, durationSeconds });
  return { name, uid: secret.metadata?.uid as string, slots };
}
const never = async () => false;
const holdersOf = async (name: string) =>
  (await leases.listNamespacedLease({ namespace, labelSelector: `${slotPoolLabel}=${name}` })).items.filter((l) => l.spec?.holderIdentity).map((l) => l.spec?.holderIdentity).sort();

describe("slots on real Leases", () => {
  test("one slot: taken, written as documented, waited for, given back, taken by the next", async () => {
    const p = await pool();
    const [a, b] = [p.slots("node-a"), p.slots("node-b")];
    expect(await a.acquire(1, "c1", never)).toEqual({ held: true, slot: `${p.name}-slot-0` });
    const lease = await leases.readNamespacedLease({ name: `${p.name}-slot-0`, namespace });
    expect(lease.metadata?.labels?.[slotPoolLabel]).toBe(p.name);
    expect(lease.metadata?.annotations?.[slotChecksumAnnotation]).toBe("c1");
    expect(lease.metadata?.ownerReferences).toEqual([{ apiVersion: "v1", kind: "Secret", name: p.name, uid: p.uid, controller: true }]);
    expect(lease.spec?.holderIdentity).toBe("node-a");
    const waiting = await b.acquire(1, "c1", never);
    expect(waiting.held).toBe(false);
    if (!waiting.held) expect(waiting.holders.map((h) => [h.node, h.checksum, h.expired])).toEqual([["node-a", "c1", false]]);
    // Asking again while holding renews the same slot.
    expect(await a.acquire(1, "c2", never)).toEqual({ held: true, slot: `${p.name}-slot-0` });
    await a.release(`${p.name}-slot-0`);
    expect(await holdersOf(p.name)).toEqual([]);
    expect(await b.acquire(1, "c2", never)).toEqual({ held: true, slot: `${p.name}-slot-0` });
    // Giving back a slot another node holds changes nothing.
    await a.release(`${p.name}-slot-0`);
    expect(await holdersOf(p.name)).toEqual(["node-b"]);
  });

  test("four nodes racing for two slots, 15 rounds: never more than two holders in any version of the Leases", async () => {
    const p = await pool();
    const versions: V1Lease[] = [];
    const watch = await new Watch(cluster.admin()).watch(
      `/apis/coordination.k8s.io/v1/namespaces/${namespace}/leases`,
      { labelSelector: `${slotPoolLabel}=${p.name}` },
      (_type: string, lease: V1Lease) => {
        versions.push(lease);
      },
      () => {},
    );
    const current = new Map<string, string>();
    let maxHolders = 0;
    const all = names.map((n) => ({ n, s: p.slots(n) as Slots }));
    let taken = 0;
    for (let round = 0; round < 15; round++) {
      const results = await Promise.all(all.map(async ({ n, s }) => ({ n, s, d: await s.acquire(2, `c${round}`, never) })));
      const held = results.filter((r) => r.d.held);
      expect(held.length).toBeLessThanOrEqual(2);
      taken += held.length;
      for (const r of held) if (r.d.held) await r.s.release(r.d.slot);
    }
    expect(taken).toBeGreaterThanOrEqual(15); // progress: every round somebody got a slot
    await waitFor("the watch caught up", async () => ((await holdersOf(p.name)).length === 0 && versions.length > 0 ? true : undefined), 10_000, 50);
    for (const l of versions) {
      current.set(l.metadata?.name as string, l.spec?.holderIdentity ?? "");
      maxHolders = Math.max(maxHolders, [...current.values()].filter((h) => h !== "").length);
    }
    watch.abort();
    expect(maxHolders).toBeLessThanOrEqual(2);
    expect(new Set(versions.map((l) => l.metadata?.name))).toEqual(new Set([`${p.name}-slot-0`, `${p.name}-slot-1`]));
  }, 120_000);

  test("a dead holder keeps its slot while its Node is NotReady or not on the slot's OSC; it is taken over once Ready with it, or gone", async () => {
    const p = await pool();
    await core.createNode({ body: { metadata: { name: "node-a" } } });
    const setNode = async (ready: "True" | "False", checksum: string) => {
      await core.patchNode({ name: "node-a", body: { metadata: { annotations: { "checksum/cloud-config-data": checksum } } } }, setHeaderOptions("Content-Type", PatchStrategy.MergePatch));
      await core.patchNodeStatus(
        { name: "node-a", body: { status: { conditions: [{ type: "Ready", status: ready, reason: "Test", message: "", lastHeartbeatTime: new Date(), lastTransitionTime: new Date() }] } } },
        setHeaderOptions("Content-Type", PatchStrategy.StrategicMergePatch),
      );
    };
    await setNode("True", "old");
    const a = p.slots("node-a", 1);
    const b = p.slots("node-b", 1);
    const reclaim = (h: Parameters<typeof safeToReclaim>[1]) => safeToReclaim(kubes["node-b"], h);
    expect((await a.acquire(1, "new", never)).held).toBe(true);
    await Bun.sleep(1500); // node-a stops renewing: its 1 s lease runs out
    await setNode("False", "new");
    expect(await b.acquire(1, "new", reclaim)).toMatchObject({ held: false, holders: [{ node: "node-a", expired: true, checksum: "new" }] });
    await setNode("True", "old"); // back, but not on the OSC it took the slot for
    expect((await b.acquire(1, "new", reclaim)).held).toBe(false);
    await setNode("True", "new");
    expect(await b.acquire(1, "new", reclaim)).toMatchObject({ held: true, slot: `${p.name}-slot-0`, reclaimedFrom: { node: "node-a" } });

    // Gone: node-b dies holding it (no Node of that name exists); node-c takes it over.
    await b.renew(`${p.name}-slot-0`, "newer");
    await Bun.sleep(1500);
    const c = p.slots("node-c");
    expect(await c.acquire(1, "newer", (h) => safeToReclaim(kubes["node-c"], h))).toMatchObject({ held: true, reclaimedFrom: { node: "node-b" } });
    await core.deleteNode({ name: "node-a" });
  }, 60_000);

  test("a change that failed its gate on one node is recorded on the slot: no node takes a slot for it, even once the slot is free", async () => {
    const p = await pool();
    const a = p.slots("node-a");
    const d = await a.acquire(2, "bad", never);
    if (!d.held) throw new Error("not held");
    await a.markFailed(d.slot, "bad", "node node-a: unit kubelet.service: restarting after a failure (auto-restart)");
    await a.release(d.slot); // rolled back and healthy again
    const b = await p.slots("node-b").acquire(2, "bad", never);
    expect(b).toMatchObject({ held: false, stopped: { slot: d.slot, checksum: "bad", failure: "node node-a: unit kubelet.service: restarting after a failure (auto-restart)" } });
    // A new OSC goes on, through the same slots.
    expect((await p.slots("node-b").acquire(2, "fixed", never)).held).toBe(true);
  });

  test("an operator frees a slot by deleting its Lease: the holder's next renewal says it no longer holds it", async () => {
    const p = await pool();
    const a = p.slots("node-a");
    const d = await a.acquire(1, "c", never);
    if (!d.held) throw new Error("not held");
    await leases.deleteNamespacedLease({ name: d.slot, namespace });
    expect(a.renew(d.slot, "c")).rejects.toThrow("no longer held by node-a: the Lease was deleted (freed by an operator?)");
    expect((await p.slots("node-b").acquire(1, "c", never)).held).toBe(true);
  });

  test("the garbage collector deletes the slots with their Secret", async () => {
    const p = await pool();
    expect((await p.slots("node-a").acquire(2, "c", never)).held).toBe(true);
    expect((await p.slots("node-b").acquire(2, "c", never)).held).toBe(true);
    await core.deleteNamespacedSecret({ name: p.name, namespace });
    await waitFor("the slots collected", async () => ((await leases.listNamespacedLease({ namespace, labelSelector: `${slotPoolLabel}=${p.name}` })).items.length === 0 ? true : undefined), 60_000, 200);
  }, 90_000);
});
