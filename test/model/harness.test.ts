// The model's own machinery: the in-memory API's concurrency and watch semantics, client-node routed
// to it, and the scheduler (deterministic per seed; a simple correct agent under no faults violates
// nothing). Today's rollout code is not run here: it is loaded from git history, and it is expected to
// violate the invariants (bun test/model/run.ts --target old).
import { describe, expect, test } from "bun:test";
import type { V1Lease } from "@kubernetes/client-node";
import { coordinationV1, coreV1 } from "../../src/kube/api.ts";
import { explainKubeError, KubeError } from "../../src/kube/errors.ts";
import type { WatchEvent } from "../../src/kube/watch.ts";
import { VirtualClock } from "./clock.ts";
import { profiles } from "./faults.ts";
import { MemoryApi } from "./memory-api.ts";
import { kubeFor } from "./memory-http.ts";
import { ApiError, MemoryStore } from "./memory-store.ts";
import { mutexDriver } from "./mutex-driver.ts";
import { runSchedule } from "./scheduler.ts";

const lease = (name: string, holder = "", labels: Record<string, string> = {}): V1Lease => ({ metadata: { name, labels }, spec: { holderIdentity: holder, leaseDurationSeconds: 40 } });

function setup() {
  const clock = new VirtualClock(Date.UTC(2026, 0, 1));
  const store = new MemoryStore({ now: () => clock.wall() });
  const api = new MemoryApi(store, clock, { requestTimeoutMs: 30_000, random: () => 0.5 });
  /** Delivers whatever can be delivered, letting the code that was waiting run after each, until nothing is left. */
  const settle = async () => {
    for (let i = 0; i < 1000; i++) {
      await new Promise((r) => setImmediate(r));
      const d = api.deliveries()[0];
      const t = clock.due()[0];
      if (d) api.deliver(d);
      else if (t) clock.fire(t);
      else return;
    }
    throw new Error("did not settle");
  };
  return { clock, store, api, settle };
}

describe("memory store", () => {
  test("a write with a stale resourceVersion is a 409, a missing object a 404, a second create AlreadyExists", () => {
    const { store } = setup();
    const created = store.create("leases", "kube-system", lease("a") as never);
    const rv = created.metadata?.resourceVersion;
    store.replace("leases", "kube-system", "a", { ...created, spec: { holderIdentity: "n1" } });
    expect(() => store.replace("leases", "kube-system", "a", { ...created, metadata: { ...created.metadata, resourceVersion: rv } })).toThrow(ApiError);
    expect(() => store.replace("leases", "kube-system", "gone", lease("gone") as never)).toThrow(expect.objectContaining({ code: 404 }));
    expect(() => store.create("leases", "kube-system", lease("a") as never)).toThrow(expect.objectContaining({ code: 409, reason: "AlreadyExists" }));
  });

  test("lists by label with the list's resourceVersion; watches resume from a version or get 410", () => {
    const { store } = setup();
    store.create("leases", "kube-system", lease("a", "", { pool: "p" }) as never);
    store.create("leases", "kube-system", lease("b", "", { pool: "q" }) as never);
    const list = store.list("leases", "kube-system", "pool=p");
    expect(list.items.map((l) => l.metadata?.name)).toEqual(["a"]);
    store.create("leases", "kube-system", lease("c") as never);
    const since = store.changesSince(Number(list.resourceVersion));
    expect(since !== "gone" && since.map((c) => c.object.metadata?.name)).toEqual(["c"]);
    store.compact();
    expect(store.changesSince(Number(list.resourceVersion))).toBe("gone");
  });

  test("deleting a Node deletes the Leases it owns", () => {
    const { store } = setup();
    const node = store.create("nodes", "", { metadata: { name: "n1" } });
    store.create("leases", "kube-system", { metadata: { name: "owned", ownerReferences: [{ kind: "Node", name: "n1", uid: node.metadata?.uid as string }] } });
    store.create("leases", "kube-system", lease("other") as never);
    store.delete("nodes", "", "n1");
    expect(store.list("leases", "kube-system").items.map((l) => l.metadata?.name)).toEqual(["other"]);
  });
});

describe("LeaseApi port", () => {
  test("conflict, not-found and unreachable as KubeErrors; requests wait for the scheduler", async () => {
    const { api, settle } = setup();
    const leases = api.leaseApi("n1.i1", "kube-system");
    const created = leases.create(lease("a", "n1"));
    expect(api.deliveries()).toHaveLength(1);
    await settle();
    const a = await created;
    const reasonOf = (e: unknown) => (e instanceof KubeError ? e.reason : e);
    const first = leases.replace({ ...a, spec: { ...a.spec, holderIdentity: "n1" } });
    const second = leases.replace({ ...a, spec: { ...a.spec, holderIdentity: "n2" } }).catch(reasonOf);
    await settle();
    await first;
    expect(await second).toBe("conflict");
    const missing = leases.replace(lease("missing")).catch(reasonOf);
    const absent = leases.get("missing");
    await settle();
    expect(await missing).toBe("not-found");
    expect(await absent).toBeUndefined();
    api.partition("n1");
    const cut = leases.get("a").catch(reasonOf);
    await settle();
    expect(await cut).toBe("unreachable");
  });

  test("a watch lists, then delivers each change once its handler returned, and resumes after a break", async () => {
    const { api, store, settle, clock } = setup();
    store.create("leases", "kube-system", lease("a", "", { pool: "p" }) as never);
    const seen: string[] = [];
    let busy = false;
    const w = api.leaseApi("n1.i1", "kube-system").watch({ labelSelector: "pool=p" }, async (e: WatchEvent<V1Lease>) => {
      expect(busy).toBe(false);
      busy = true;
      await Promise.resolve();
      seen.push(`${e.type} ${e.object.metadata?.name} ${e.object.spec?.holderIdentity ?? ""}`);
      busy = false;
    });
    await settle();
    await w.synced;
    const a = store.get("leases", "kube-system", "a");
    store.replace("leases", "kube-system", "a", { ...a, spec: { holderIdentity: "n1" } });
    store.create("leases", "kube-system", lease("b", "", { pool: "p" }) as never);
    store.create("leases", "kube-system", lease("x", "", { pool: "other" }) as never);
    await settle();
    api.breakWatches("n1");
    const b = store.get("leases", "kube-system", "b");
    store.replace("leases", "kube-system", "b", { ...b, spec: { holderIdentity: "n2" } });
    clock.advanceTo(clock.mono + 5_000);
    await settle();
    expect(seen).toEqual(["ADDED a ", "MODIFIED a n1", "ADDED b ", "MODIFIED b n2"]);
    await w.stop();
  });
});

describe("the agent's requests routed to the model", () => {
  test("today's code path: Lease create/replace with 409s, Node merge and strategic merge patches", async () => {
    const { api, settle } = setup();
    const kube = kubeFor("n1.i1", api);
    const leases = coordinationV1(kube);
    const created = leases.createNamespacedLease({ namespace: "kube-system", body: lease("a", "n1") });
    await settle();
    const a = await created;
    expect(a.metadata?.resourceVersion).toBeDefined();
    const again = leases.createNamespacedLease({ namespace: "kube-system", body: lease("a", "n1") }).catch((e: unknown) => e);
    const stale = leases.replaceNamespacedLease({ name: "a", namespace: "kube-system", body: { ...a, metadata: { ...a.metadata, resourceVersion: "999" } } }).catch((e: unknown) => e);
    await settle();
    expect(explainKubeError(await again, { server: kube.server, caSource: "", what: "" }).reason).toBe("conflict");
    expect(explainKubeError(await stale, { server: kube.server, caSource: "", what: "" }).reason).toBe("conflict");

    api.store.create("nodes", "", { metadata: { name: "n1" }, status: { conditions: [{ type: "Ready", status: "True" }] } });
    const core = coreV1(kube);
    const labelled = core.patchNode({ name: "n1", body: { metadata: { annotations: { x: "1" } } } }, "merge");
    const conditioned = core.patchNodeStatus({ name: "n1", body: { status: { conditions: [{ type: "Mine", status: "True" }] } } }, "strategic");
    await settle();
    await labelled;
    await conditioned;
    const listed = core.listNode({});
    await settle();
    const [n] = (await listed).items;
    expect(n?.metadata?.annotations).toEqual({ x: "1" });
    expect(n?.status?.conditions?.map((c) => c.type)).toEqual(["Ready", "Mine"]);
  });
});

describe("scheduler", () => {
  const calm = profiles.calm as NonNullable<(typeof profiles)["calm"]>;
  test("a seed reproduces its schedule exactly", async () => {
    const run = () => runSchedule({ driver: mutexDriver(), profile: calm, seed: 7, steps: 1500, quietMs: 5 * 60_000, dump: true });
    const [a, b] = [await run(), await run()];
    expect(a.steps).toBe(b.steps);
    expect(a.trace).toEqual(b.trace as string[]);
  });

  test("a simple correct agent under no faults violates nothing, and every good change arrives", async () => {
    for (const seed of [1, 2, 3, 4, 5]) {
      const r = await runSchedule({ driver: mutexDriver(), profile: calm, seed, steps: 2000, quietMs: 10 * 60_000 });
      expect(r.violations.map((v) => `${v.invariant}: ${v.message}`)).toEqual([]);
      expect(r.revisions).toBeGreaterThan(1);
    }
  });
});
