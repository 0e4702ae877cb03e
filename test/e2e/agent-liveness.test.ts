// The whole agent's liveness surface, as an operator sees it from the cluster and on the node.
import { afterAll, beforeAll, expect, test } from "bun:test";
import { readFileSync } from "node:fs";
import { CoordinationV1Api } from "@kubernetes/client-node";
import { parse, stringify } from "yaml";
import { type AgentNode, mainPid, putOscSecret, readNode, startAgentNode, waitApplied } from "../harness/agent.ts";
import { forbiddenRequests, installAdmissionPolicy } from "../harness/admission-policy.ts";
import { type Cluster, startCluster } from "../harness/cluster.ts";
import { waitFor } from "../harness/exec.ts";

const secretName = "gardener-node-agent-liveness";
const osc = stringify(parse(readFileSync(new URL("../fixtures/web-osc.yaml", import.meta.url), "utf8"), { version: "1.1" }));

let cluster: Cluster;
let agent: AgentNode;
let checksum: string;

beforeAll(async () => {
  cluster = await startCluster({ controllerManager: false });
  await installAdmissionPolicy(cluster); // docs/admission-policy.yaml: the agent works within it
  agent = await startAgentNode(cluster, { prefix: "live", secretName });
  checksum = await putOscSecret(cluster, secretName, osc);
  await waitApplied(agent, checksum);
}, 120_000);
afterAll(async () => {
  await agent?.node.stop();
  await cluster?.stop();
});

const curl = (port: number, path: string) => agent.node.exec(["curl", "-s", "-w", "\n%{http_code}", `http://127.0.0.1:${port}${path}`]);

test("the agent's Lease names its Node as owner and is renewed", async () => {
  const leases = cluster.admin().makeApiClient(CoordinationV1Api);
  const name = `gardener-node-agent-${agent.name}`;
  const first = await waitFor("the agent's Lease", () => leases.readNamespacedLease({ name, namespace: "kube-system" }).catch(() => undefined));
  const node = await readNode(agent);
  expect(first.metadata?.ownerReferences?.[0]).toMatchObject({ kind: "Node", name: agent.name, uid: node.metadata?.uid });
  expect(first.spec).toMatchObject({ holderIdentity: name, leaseDurationSeconds: 40 });
  const renewed = await waitFor(
    "a renewal",
    async () => {
      const l = await leases.readNamespacedLease({ name, namespace: "kube-system" });
      return String(l.spec?.renewTime) !== String(first.spec?.renewTime) ? l : undefined;
    },
    15_000,
    250,
  );
  expect(new Date(String(renewed.spec?.renewTime)).getTime()).toBeGreaterThan(new Date(String(first.spec?.renewTime)).getTime());
}, 30_000);

test("/healthz, /readyz and /metrics answer on localhost", async () => {
  expect((await curl(agent.healthPort, "/healthz")).stdout.split("\n").at(-1)).toBe("200");
  const ready = await waitFor("/readyz 200", async () => ((await curl(agent.healthPort, "/readyz")).stdout.endsWith("\n200") ? true : undefined), 15_000);
  expect(ready).toBe(true);
  const metrics = (await curl(agent.metricsPort, "/metrics")).stdout;
  expect(metrics).toContain(`trellis_applied_osc_info{checksum="${checksum}"} 1`);
  expect(metrics).toMatch(/^trellis_reconcile_total\{result="applied"\} \d+$/m);
  expect(metrics).toMatch(/^trellis_unit_restarts_total\{unit="web.service"\} \d+$/m);
  expect(metrics).toMatch(/^process_resident_memory_bytes \d+$/m);
  expect(metrics).toMatch(/^trellis_lease_last_renew_timestamp_seconds [\d.e+]+$/m);
});

test("SystemdUnitsReady reports the applied units healthy", async () => {
  const condition = await waitFor(
    "SystemdUnitsReady",
    async () => (await readNode(agent)).status?.conditions?.find((c) => c.type === "SystemdUnitsReady"),
    90_000,
    500,
  );
  expect(condition).toMatchObject({ status: "True", reason: "AllUnitsHealthy" });
}, 100_000);

test("`trellis status` on the node shows the applied OSC and healthy components", async () => {
  const r = await waitFor("trellis status exit 0", async () => {
    const s = await agent.node.exec(["/opt/bin/gardener-node-agent", "status"]);
    return s.code === 0 ? s : undefined;
  });
  expect(r.stdout).toContain(checksum.slice(0, 12));
});

test("the restart annotation restarts the listed units and is removed", async () => {
  const [web, ticker] = [await mainPid(agent, "web.service"), await mainPid(agent, "ticker.service")];
  await agent.core.patchNode({
    name: agent.name,
    body: [{ op: "add", path: "/metadata/annotations/worker.gardener.cloud~1restart-systemd-services", value: "web,ticker.service" }],
  });
  await waitFor("the annotation to be removed", async () =>
    (await readNode(agent)).metadata?.annotations?.["worker.gardener.cloud/restart-systemd-services"] === undefined ? true : undefined,
  );
  expect(await mainPid(agent, "web.service")).not.toBe(web);
  expect(await mainPid(agent, "ticker.service")).not.toBe(ticker);
});

test("the admission policy (and RBAC) refused none of the agent's requests", () => {
  expect(forbiddenRequests(cluster, agent.user)).toEqual([]);
});

test("the agent itself never restarted or crashed through all of this", async () => {
  expect((await agent.node.execOk(["systemctl", "show", "-P", "NRestarts", "gardener-node-agent.service"])).trim()).toBe("0");
  expect((await agent.node.execOk(["systemctl", "is-active", "gardener-node-agent.service"])).trim()).toBe("active");
});
