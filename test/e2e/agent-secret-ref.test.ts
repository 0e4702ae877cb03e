// A file whose content comes from another Secret (`secretRef`), with the compiled agent against a real
// kube-apiserver: the README's claim that a no-op re-check makes no API request holds for it too (counted
// in the audit log), and a change to that Secret reaches the node at once, not at the next syncPeriod.
import { afterAll, beforeAll, expect, test } from "bun:test";
import { readFileSync } from "node:fs";
import { CoreV1Api } from "@kubernetes/client-node";
import { stringify } from "yaml";
import { type AgentNode, putOscSecret, startAgentNode, waitApplied } from "../harness/agent.ts";
import { type Cluster, startCluster } from "../harness/cluster.ts";
import { waitFor } from "../harness/exec.ts";
import type { AuditEvent } from "../harness/rbac.ts";

const secretName = "gardener-node-agent-worker-secretref";
const refName = "secretref-content";
const path = "/etc/from-secret/conf";
const osc = stringify({
  apiVersion: "extensions.gardener.cloud/v1alpha1",
  kind: "OperatingSystemConfig",
  spec: { files: [{ path, permissions: 0o644, content: { secretRef: { name: refName, dataKey: "conf" } } }] },
});

let cluster: Cluster;
let agent: AgentNode;
let admin: CoreV1Api;

beforeAll(async () => {
  cluster = await startCluster({ controllerManager: false });
  admin = cluster.admin().makeApiClient(CoreV1Api);
  // syncPeriod 10m: whatever happens within the test happens because of a watch event, never the period.
  agent = await startAgentNode(cluster, { prefix: "secretref", secretName, secretRefs: [refName], syncPeriod: "10m" });
}, 120_000);
afterAll(async () => {
  await agent?.node.stop();
  await cluster?.stop();
});

const putRef = async (conf: string) => {
  const body = { metadata: { name: refName, namespace: "kube-system" }, data: { conf: Buffer.from(conf).toString("base64") } };
  await admin.replaceNamespacedSecret({ name: refName, namespace: "kube-system", body }).catch(() => admin.createNamespacedSecret({ namespace: "kube-system", body }));
};

async function reconciles(): Promise<number> {
  const text = await (await fetch(`http://127.0.0.1:${agent.metricsPort}/metrics`)).text();
  return text
    .split("\n")
    .filter((l) => l.startsWith("trellis_reconcile_total{"))
    .reduce((n, l) => n + Number(l.split(" ").at(-1)), 0);
}

/** The audit log's lines up to an admin request made now: every request before it is logged by then. */
let markers = 0;
async function auditUpToNow(): Promise<string[]> {
  const name = `audit-marker-${++markers}`;
  await admin.readNamespace({ name }).catch(() => undefined);
  return waitFor(`the audit line of ${name}`, () => {
    const lines = readFileSync(cluster.auditLog, "utf8").split("\n");
    const at = lines.findIndex((l) => l.includes(`/namespaces/${name}"`));
    return at >= 0 ? lines.slice(0, at) : undefined;
  }, 10_000);
}

test("a no-op re-check of an OSC with a secretRef file makes no API request; a change to that Secret is applied at once", async () => {
  await putRef("v1\n");
  await waitApplied(agent, await putOscSecret(cluster, secretName, osc), 60_000);
  expect(await agent.node.readFile(path)).toBe("v1\n");
  // The first apply's reporting is over before the window opens: its condition, and the unit check's,
  // whose first run comes after the agent's first reconcile.
  await waitFor("the Node conditions", async () => {
    const n = await admin.readNode({ name: agent.name });
    const has = (type: string) => n.status?.conditions?.some((c) => c.type === type && c.status === "True");
    return has("OperatingSystemConfigApplied") && has("SystemdUnitsReady") ? true : undefined;
  }, 30_000);

  // A change of the OSC Secret that leaves osc.yaml as it is: one more reconcile, with nothing to do.
  const before = await auditUpToNow();
  const count = await reconciles();
  await putOscSecret(cluster, secretName, osc, { "test/touch": "1" });
  await waitFor("the no-op re-check", async () => (await reconciles()) > count, 30_000);
  const during = (await auditUpToNow())
    .slice(before.length)
    .filter((l) => l.trim() !== "")
    .map((l) => JSON.parse(l) as AuditEvent)
    .filter((e) => e.user.username === agent.user && e.objectRef?.resource !== "leases") // the liveness lease renews on its own clock
    .map((e) => `${e.verb} ${e.requestURI}`);
  expect(during).toEqual([]);

  const changed = performance.now();
  await putRef("v2\n");
  await waitFor("the Secret's new content on the node", async () => ((await agent.node.readFile(path)) === "v2\n" ? true : undefined), 15_000);
  console.log(`secretRef change on the node after ${Math.round(performance.now() - changed)} ms`);
}, 180_000);
