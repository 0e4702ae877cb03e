// src/kube/watch.ts against a real kube-apiserver: only the named object is asked for and delivered,
// a resourceNames-restricted Role suffices, an apiserver restart and a compacted (410) resourceVersion
// lose and repeat nothing, an unreachable server is retried with backoff, and stop() is prompt.
import { afterAll, beforeAll, expect, test } from "bun:test";
import { writeFileSync } from "node:fs";
import { ApiException, CoreV1Api, type V1Secret } from "@kubernetes/client-node";
import type { Kube } from "../../src/kube/client.ts";
import { kubeFromConnection } from "../../src/kube/client.ts";
import { type WatchEvent, type WatchOptions, watchObjects } from "../../src/kube/watch.ts";
import { createLogger } from "../../src/log.ts";
import { type Cluster, startCluster } from "../harness/cluster.ts";
import { freePort, waitFor } from "../harness/exec.ts";
import { auditOf, userWithRules } from "../harness/rbac.ts";
import { clientNodeApi } from "../harness/client-node.ts";

const namespace = "kube-system";
const path = `/api/v1/namespaces/${namespace}/secrets`;

let cluster: Cluster;
let core: CoreV1Api;
/** A user allowed get/list/watch on every secret in kube-system, so that only the watcher limits what it reads. */
let reader: Kube;

beforeAll(async () => {
  cluster = await startCluster({ controllerManager: false });
  core = cluster.admin().makeApiClient(CoreV1Api);
  ({ kube: reader } = await userWithRules(cluster, "watcher-a", [
    { namespace, rules: [{ apiGroups: [""], resources: ["secrets"], verbs: ["get", "list", "watch"] }] },
  ]));
}, 180_000);
afterAll(() => cluster?.stop(), 30_000);

type Seen = { type: WatchEvent<V1Secret>["type"]; name: string; v: string | undefined };

function watchSecret(kube: Kube, name: string, extra: Partial<WatchOptions<V1Secret>> = {}) {
  const seen: Seen[] = [];
  const logs: Record<string, unknown>[] = [];
  const log = createLogger({ level: "debug", write: (line) => logs.push(JSON.parse(line)) });
  const watcher = watchObjects<V1Secret>({
    kube,
    path,
    fieldSelector: `metadata.name=${name}`,
    log,
    onEvent: (e) => {
      seen.push({ type: e.type, name: e.object.metadata?.name ?? "", v: valueOf(e.object) });
    },
    ...extra,
  });
  return { watcher, seen, logs };
}

const valueOf = (s: V1Secret) => (s.data?.v === undefined ? undefined : Buffer.from(s.data.v, "base64").toString());
const secret = (name: string, v: string): V1Secret => ({ metadata: { name }, stringData: { v } });
const put = (name: string, v: string) => core.replaceNamespacedSecret({ name, namespace, body: secret(name, v) });
const create = (name: string, v: string) => core.createNamespacedSecret({ namespace, body: secret(name, v) });
const summary = (seen: Seen[]) => seen.map((s) => `${s.type} ${s.name}=${s.v}`);

async function statusOf(p: Promise<unknown>): Promise<number> {
  try {
    await p;
    return 200;
  } catch (err) {
    if (err instanceof ApiException) return err.code;
    throw err;
  }
}

test("delivers create, update, delete and re-create of the named secret and nothing about others; every request names it", async () => {
  await create("other-1", "x");
  const { watcher, seen } = watchSecret(reader, "osc-a");
  await watcher.synced;
  expect(seen).toEqual([]);

  await create("osc-a", "1");
  await create("other-2", "x");
  await waitFor("ADDED", () => seen.length === 1);
  await put("osc-a", "2");
  await put("other-1", "y");
  await core.deleteNamespacedSecret({ name: "osc-a", namespace });
  await create("osc-a", "3");
  await waitFor("four events", () => seen.length >= 4);
  await put("other-2", "y");
  await Bun.sleep(500);
  expect(summary(seen)).toEqual(["ADDED osc-a=1", "MODIFIED osc-a=2", "DELETED osc-a=2", "ADDED osc-a=3"]);

  const t0 = performance.now();
  await watcher.stop();
  expect(performance.now() - t0).toBeLessThan(500);
  await put("osc-a", "4");
  await Bun.sleep(300);
  expect(seen).toHaveLength(4);
  expect(watcher.stats()).toMatchObject({ lists: 1, watches: 1, gone: 0, errors: 0, events: 4, handlerErrors: 0 });

  const requests = auditOf(cluster, "watcher-a").filter((e) => e.objectRef?.resource === "secrets");
  expect(new Set(requests.map((e) => e.verb))).toEqual(new Set(["list", "watch"]));
  for (const r of requests) expect(r.requestURI).toContain("fieldSelector=metadata.name%3Dosc-a");
  const watch = new URL(requests.find((e) => e.verb === "watch")?.requestURI ?? "", "https://x").searchParams;
  expect(watch.get("allowWatchBookmarks")).toBe("true");
  expect(Number(watch.get("timeoutSeconds"))).toBeWithin(240, 361);
}, 30_000);

test("a watch that goes quiet for longer than the idle timeout is abandoned and resumed, repeating nothing", async () => {
  await create("osc-i", "1");
  const { watcher, seen, logs } = watchSecret(reader, "osc-i", { idleTimeoutMs: 300, backoff: { initialMs: 10, maxMs: 20 } });
  await watcher.synced;
  await waitFor("an abandoned watch", () => watcher.stats().errors >= 2);
  await put("osc-i", "2");
  await waitFor("the change", () => seen.length >= 2);
  await Bun.sleep(700);
  await watcher.stop();
  expect(summary(seen)).toEqual(["ADDED osc-i=1", "MODIFIED osc-i=2"]);
  expect(watcher.stats()).toMatchObject({ lists: 1, gone: 0 });
  expect(String(logs.find((l) => l.level === "warn")?.err)).toContain(`no answer from ${cluster.server} for 0.3 s`);
}, 30_000);

test("a Role limited to resourceNames: [the secret] is enough to list and watch it, and nothing else", async () => {
  const { kube, kubeconfig } = await userWithRules(cluster, "watcher-b", [
    { namespace, rules: [{ apiGroups: [""], resources: ["secrets"], resourceNames: ["osc-b"], verbs: ["get", "list", "watch"] }] },
  ]);
  await create("osc-b", "1");
  const { watcher, seen } = watchSecret(kube, "osc-b");
  await watcher.synced;
  await put("osc-b", "2");
  await waitFor("MODIFIED", () => seen.length === 2);
  await watcher.stop();
  expect(summary(seen)).toEqual(["ADDED osc-b=1", "MODIFIED osc-b=2"]);
  expect(watcher.stats()).toMatchObject({ errors: 0, gone: 0 });

  const theirs = clientNodeApi(kubeconfig, CoreV1Api);
  expect(await statusOf(theirs.readNamespacedSecret({ name: "osc-b", namespace }))).toBe(200);
  expect(await statusOf(theirs.listNamespacedSecret({ namespace, fieldSelector: "metadata.name=osc-b" }))).toBe(200);
  expect(await statusOf(theirs.listNamespacedSecret({ namespace }))).toBe(403);
  expect(await statusOf(theirs.listNamespacedSecret({ namespace, fieldSelector: "metadata.name=other-1" }))).toBe(403);
  expect(await statusOf(theirs.readNamespacedSecret({ name: "other-1", namespace }))).toBe(403);
}, 30_000);

test("a kube-apiserver restart while watching: changes made after it are delivered, exactly once", async () => {
  await create("osc-r", "1");
  const { watcher, seen } = watchSecret(reader, "osc-r");
  await watcher.synced;
  await cluster.restartApiServer();
  await put("osc-r", "2");
  await waitFor("the change made right after the restart", () => seen.length >= 2, 30_000);
  await put("osc-r", "3");
  await waitFor("a later change", () => seen.length >= 3, 30_000);
  await Bun.sleep(1_000);
  await watcher.stop();
  expect(summary(seen)).toEqual(["ADDED osc-r=1", "MODIFIED osc-r=2", "MODIFIED osc-r=3"]);
  // The old stream ends and reconnecting fails until the new apiserver serves; seen so far: refused
  // connections, a 403 (RBAC not yet synced although /readyz passed), then a 410 because the new watch
  // cache starts after the watcher's resourceVersion, and a relist that repeats nothing.
  const stats = watcher.stats();
  expect(stats.errors).toBeGreaterThanOrEqual(1);
}, 60_000);

test("a resourceVersion the apiserver no longer has (etcd compacted, watch cache rebuilt) is a 410: the watcher lists again and delivers the current state once", async () => {
  await create("osc-g", "1");
  let release!: () => void;
  const gate = new Promise<void>((r) => (release = r));
  // Holding the handler on the first event keeps the watcher at the list's resourceVersion while the
  // secret changes twice, etcd is compacted past both, and the apiserver restarts. The restart is
  // needed: the watch cache keeps the history in memory and would serve the two changes despite the
  // compaction (tried: no 410 without it).
  const { watcher, seen, logs } = watchSecret(reader, "osc-g", { onEvent: async (e) => {
    seen.push({ type: e.type, name: e.object.metadata?.name ?? "", v: valueOf(e.object) });
    if (seen.length === 1) await gate;
  } });
  await waitFor("the first event", () => seen.length === 1);
  await put("osc-g", "2");
  const latest = await put("osc-g", "3");
  const compacted = await compactEtcd(cluster);
  expect(compacted).toBeGreaterThanOrEqual(Number(latest.metadata?.resourceVersion));
  await cluster.restartApiServer();
  release();
  await watcher.synced;
  await waitFor("the current state", () => seen.length >= 2, 30_000);
  await put("osc-g", "4");
  await waitFor("the next change", () => seen.length >= 3, 30_000);
  await watcher.stop();
  expect(summary(seen)).toEqual(["ADDED osc-g=1", "MODIFIED osc-g=3", "MODIFIED osc-g=4"]);
  expect(watcher.stats()).toMatchObject({ lists: 2, gone: 1 });
  const gone = logs.find((l) => l.msg === "watch resourceVersion gone; listing again");
  expect(String(gone?.err)).toContain("gone (410)");
}, 60_000);

/** Compacts etcd's history up to its current revision (JSON gateway); returns that revision. */
async function compactEtcd(c: Cluster): Promise<number> {
  const post = async (api: string, body: unknown) => {
    const res = await fetch(`${c.etcdEndpoint}${api}`, { method: "POST", body: JSON.stringify(body) });
    if (!res.ok) throw new Error(`etcd ${api}: ${res.status} ${await res.text()}`);
    return (await res.json()) as { header?: { revision?: string } };
  };
  const revision = Number((await post("/v3/maintenance/status", {})).header?.revision);
  await post("/v3/kv/compaction", { revision, physical: true });
  return revision;
}

test("an unreachable server is retried with doubling delays capped at 4 s (it is back within seconds of coming back), and stop() ends the wait at once", async () => {
  const port = await freePort();
  const file = `${cluster.dir}/unreachable.kubeconfig`;
  const admin = cluster.admin();
  admin.clusters = admin.clusters.map((c) => ({ ...c, server: `https://127.0.0.1:${port}` }));
  writeFileSync(file, admin.exportConfig());
  const delays: number[] = [];
  const { watcher, logs } = watchSecret(kubeFromConnection({ kind: "kubeconfig", path: file }), "osc-x", {
    random: () => 1,
    sleep: (ms, signal) => {
      delays.push(ms);
      // Real waiting only from the 9th retry on, where stop() has to cut it short.
      return delays.length > 8 ? new Promise((r) => signal.addEventListener("abort", () => r())) : Promise.resolve();
    },
  });
  await waitFor("nine retries", () => delays.length >= 9);
  const t0 = performance.now();
  await watcher.stop();
  expect(performance.now() - t0).toBeLessThan(200);
  expect(delays).toEqual([500, 1000, 2000, 4000, 4000, 4000, 4000, 4000, 4000]);
  expect(watcher.stats()).toMatchObject({ lists: 9, watches: 0, errors: 9 });
  expect(String(logs.find((l) => l.level === "warn")?.err)).toContain(`cannot reach https://127.0.0.1:${port}`);
  await expect(watcher.synced).rejects.toThrow("stopped before the first list completed");
}, 30_000);

test("a handler that throws is logged and counted, and later events still arrive", async () => {
  await create("osc-h", "1");
  let calls = 0;
  const { watcher, seen, logs } = watchSecret(reader, "osc-h", {
    onEvent: (e) => {
      calls++;
      if (calls === 1) throw new Error("handler broke");
      seen.push({ type: e.type, name: e.object.metadata?.name ?? "", v: valueOf(e.object) });
    },
  });
  await watcher.synced;
  await put("osc-h", "2");
  await waitFor("the next event", () => seen.length === 1);
  await watcher.stop();
  expect(summary(seen)).toEqual(["MODIFIED osc-h=2"]);
  expect(watcher.stats()).toMatchObject({ events: 2, handlerErrors: 1 });
  expect(logs.find((l) => l.level === "error")).toMatchObject({ msg: "watch handler failed", err: "handler broke", object: "kube-system/osc-h" });
}, 30_000);

test("an event line over maxEventBytes fails the watch with an error naming the limit; it restarts with a list, which delivers the object once it is within bounds again", async () => {
  await create("osc-l", "1");
  const { watcher, seen, logs } = watchSecret(reader, "osc-l", { maxEventBytes: 64 << 10, backoff: { initialMs: 10, maxMs: 50 } });
  await watcher.synced;
  await put("osc-l", "x".repeat(100 << 10)); // about 140 KiB of JSON as base64
  await waitFor("the watch failing and the relist refusing the answer", () => watcher.stats().errors >= 2);
  const warnings = logs.filter((l) => l.level === "warn").map((l) => String(l.err));
  expect(warnings[0]).toContain(`watching ${path}?fieldSelector=metadata.name=osc-l from resourceVersion`);
  expect(warnings[0]).toContain("an event line is longer than 65536 bytes");
  expect(warnings[1]).toContain(`listing ${path}?fieldSelector=metadata.name=osc-l: the answer is longer than 65536 bytes`);
  await put("osc-l", "3");
  await waitFor("the object, small again", () => seen.length >= 2);
  await watcher.stop();
  expect(summary(seen)).toEqual(["ADDED osc-l=1", "MODIFIED osc-l=3"]); // the oversized version never reached the handler
  expect(watcher.stats().lists).toBeGreaterThanOrEqual(2);
}, 30_000);

test("a watch without a field or label selector is refused before any request", () => {
  expect(() => watchObjects({ kube: reader, path, fieldSelector: "", log: createLogger(), onEvent: () => {} })).toThrow("a field or label selector is required");
});
