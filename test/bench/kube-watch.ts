// bun --preload ./build/shims/preload.ts test/bench/kube-watch.ts [updates=30] [idleSeconds=60]
// src/kube/watch.ts against a real kube-apiserver: the latency from a secret update to the handler
// call (median, min, max over `updates` updates), and the API requests an idle watcher makes in
// `idleSeconds` (from the audit log). The preload gives client-node its TLS under Bun, as in bun test.
import { CoreV1Api, type V1Secret } from "@kubernetes/client-node";
import { watchObjects } from "../../src/kube/watch.ts";
import { createLogger } from "../../src/log.ts";
import { startCluster } from "../harness/cluster.ts";
import { waitFor } from "../harness/exec.ts";
import { auditOf, userWithRules } from "../harness/rbac.ts";

const updates = Number(process.argv[2] ?? 30);
const idleSeconds = Number(process.argv[3] ?? 60);
const namespace = "kube-system";
const name = "osc-bench";

const median = (xs: number[]) => {
  const s = [...xs].sort((a, b) => a - b);
  const m = s.length >> 1;
  return s.length % 2 ? (s[m] as number) : ((s[m - 1] as number) + (s[m] as number)) / 2;
};
const ms = (x: number) => Math.round(x * 10) / 10;

const cluster = await startCluster({ controllerManager: false });
try {
  const core = cluster.admin().makeApiClient(CoreV1Api);
  const { kube } = await userWithRules(cluster, "bench-watcher", [
    { namespace, rules: [{ apiGroups: [""], resources: ["secrets"], resourceNames: [name], verbs: ["get", "list", "watch"] }] },
  ]);
  await core.createNamespacedSecret({ namespace, body: { metadata: { name }, stringData: { v: "0" } } });
  const arrivals = new Map<string, number>();
  const watcher = watchObjects<V1Secret>({
    kube,
    path: `/api/v1/namespaces/${namespace}/secrets`,
    fieldSelector: `metadata.name=${name}`,
    log: createLogger({ level: "warn" }),
    onEvent: (e) => {
      arrivals.set(Buffer.from(e.object.data?.v ?? "", "base64").toString(), performance.now());
    },
  });
  await watcher.synced;

  const sinceRequest: number[] = [];
  const sinceResponse: number[] = [];
  for (let i = 1; i <= updates; i++) {
    const v = String(i);
    const t0 = performance.now();
    await core.replaceNamespacedSecret({ name, namespace, body: { metadata: { name }, stringData: { v } } });
    const t1 = performance.now();
    const at = await waitFor(`update ${v}`, () => arrivals.get(v), 10_000, 1);
    sinceRequest.push(at - t0);
    sinceResponse.push(at - t1);
    await Bun.sleep(50);
  }

  const idleStart = new Date();
  const before = watcher.stats();
  await Bun.sleep(idleSeconds * 1000);
  const after = watcher.stats();
  const idleRequests = auditOf(cluster, "bench-watcher").filter((e) => new Date(e.stageTimestamp) >= idleStart);
  await watcher.stop();

  console.log(
    JSON.stringify(
      {
        updates,
        latencyMs: {
          fromUpdateRequest: { median: ms(median(sinceRequest)), min: ms(Math.min(...sinceRequest)), max: ms(Math.max(...sinceRequest)) },
          fromUpdateResponse: { median: ms(median(sinceResponse)), min: ms(Math.min(...sinceResponse)), max: ms(Math.max(...sinceResponse)) },
        },
        idle: {
          seconds: idleSeconds,
          apiRequests: idleRequests.length,
          requests: idleRequests.map((e) => `${e.stage} ${e.verb} ${e.requestURI}`),
          bookmarks: after.bookmarks - before.bookmarks,
          watchesOpened: after.watches - before.watches,
        },
        stats: after,
      },
      null,
      2,
    ),
  );
} finally {
  await cluster.stop();
}
