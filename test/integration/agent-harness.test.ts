// The agent harness itself under a real control plane (kube-controller-manager running, as in every
// e2e test): registering Nodes while controllers write to them, and a failed start stopping its node.
import { afterAll, beforeAll, expect, test } from "bun:test";
import { existsSync, readdirSync } from "node:fs";
import { CoreV1Api, PatchStrategy, setHeaderOptions } from "@kubernetes/client-node";
import { registerNode, startAgentNode } from "../harness/agent.ts";
import { type Cluster, startCluster } from "../harness/cluster.ts";

let cluster: Cluster;

beforeAll(async () => {
  cluster = await startCluster();
}, 120_000);

afterAll(() => cluster?.stop(), 60_000);

test("registerNode sets the InternalIP while another writer updates the same Nodes, as kube-controller-manager does (no 409 Conflict)", async () => {
  const core = cluster.admin().makeApiClient(CoreV1Api);
  const names = Array.from({ length: 10 }, (_, i) => `harness-reg-${i}`);
  // The other writer: bumps each Node's resourceVersion as fast as the API server answers.
  let writing = true;
  const writer = (async () => {
    for (let n = 0; writing; n++) {
      await Promise.allSettled(
        names.map((name) => core.patchNode({ name, body: { metadata: { labels: { "test/bump": String(n) } } } }, setHeaderOptions("Content-Type", PatchStrategy.MergePatch))),
      ); // a Node not created yet answers 404: nothing to bump
    }
  })();
  const results = await Promise.allSettled(names.map((name) => registerNode(core, name)));
  writing = false;
  await writer;
  expect(results.filter((r) => r.status === "rejected").map((r) => String((r as PromiseRejectedResult).reason))).toEqual([]);
  for (const name of names) expect((await core.readNode({ name })).status?.addresses).toEqual([{ type: "InternalIP", address: "127.0.0.1" }]);
}, 120_000);

test("a start that fails after the node booted stops that node", async () => {
  const nodes = "/tmp/trellis-test/nodes";
  const mine = () => (existsSync(nodes) ? readdirSync(nodes).filter((n) => n.startsWith("harness-fail-")) : []);
  expect(mine()).toEqual([]);
  const failed = await startAgentNode(cluster, { prefix: "harness-fail", secretName: "osc-x", binary: "/nonexistent/trellis", start: false }).then(
    () => undefined,
    (err: unknown) => err,
  );
  expect(String(failed)).toContain("/nonexistent/trellis");
  expect(mine()).toEqual([]);
}, 120_000);
