// The OSC Secret's name changes for a pool (gardener-node-agent's secret-name-change handling): the control
// plane labels the Node with the new name, and the agent rewrites its configuration and restarts to follow
// it. Against a real kube-apiserver, with the Node source the agent uses, as a user holding only the node
// rules of docs/rbac.md.
import { afterAll, beforeAll, expect, test } from "bun:test";
import { CoreV1Api, PatchStrategy, setHeaderOptions } from "@kubernetes/client-node";
import { mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from "node:fs";
import { parseAgentConfig } from "../../src/api/agent-config.ts";
import { poolLabel } from "../../src/api/rollout.ts";
import { startNodeSource } from "../../src/controllers/node-source.ts";
import { startSecretNameFollower } from "../../src/controllers/secret-name.ts";
import { createFiles } from "../../src/host/files.ts";
import type { Kube } from "../../src/kube/client.ts";
import { createLogger } from "../../src/log.ts";
import { type Cluster, startCluster } from "../harness/cluster.ts";
import { waitFor } from "../harness/exec.ts";
import { userWithRules } from "../harness/rbac.ts";

let cluster: Cluster;
let core: CoreV1Api;
let agent: Kube;
const dir = mkdtempSync("/tmp/trellis-secret-name-");
const configFile = `${dir}/config-v1.150.0.yaml`;
const config = `# written by Gardener
apiVersion: nodeagent.config.gardener.cloud/v1alpha1
kind: NodeAgentConfiguration
apiServer:
  server: https://api.example:443
controllers:
  operatingSystemConfig:
    kubernetesVersion: 1.35.4
    secretName: gardener-node-agent-worker-aaaa
    syncPeriod: 1m
`;

beforeAll(async () => {
  cluster = await startCluster({ controllerManager: false });
  core = cluster.admin().makeApiClient(CoreV1Api);
  ({ kube: agent } = await userWithRules(cluster, "node-agent", [{ rules: [{ apiGroups: [""], resources: ["nodes"], verbs: ["get", "list", "watch"] }] }]));
  await core.createNode({ body: { metadata: { name: "node-s", labels: { "kubernetes.io/hostname": "host-s" } } } });
}, 180_000);
afterAll(async () => {
  await cluster?.stop();
  rmSync(dir, { recursive: true, force: true });
}, 30_000);

const label = (labels: Record<string, string>) =>
  core.patchNode({ name: "node-s", body: { metadata: { labels } } }, setHeaderOptions("Content-Type", PatchStrategy.MergePatch));

test("a Node labelled with a new OSC Secret name: the configuration names it, the rest kept, and the agent restarts", async () => {
  writeFileSync(configFile, config, { mode: 0o644 });
  const log = createLogger({ level: "error" });
  const node = startNodeSource({ kube: agent, hostName: "host-s", log });
  let restarted: string | undefined;
  const follower = startSecretNameFollower({ node, files: createFiles("/"), configFile, secretName: "gardener-node-agent-worker-aaaa", log, restartSelf: (why) => (restarted = why) });
  try {
    await node.found;
    // The name the agent has already, and then another label: the agent saw both updates and did nothing.
    await label({ [poolLabel]: "gardener-node-agent-worker-aaaa" });
    await label({ unrelated: "x" });
    await waitFor("the Node source sees the second update", () => node.current()?.metadata?.labels?.unrelated === "x");
    expect(restarted).toBeUndefined();
    expect(readFileSync(configFile, "utf8")).toBe(config);

    await label({ [poolLabel]: "gardener-node-agent-worker-bbbb" });
    expect(await waitFor("the agent restarts", () => restarted)).toBe("the OSC Secret's name changed to gardener-node-agent-worker-bbbb");
    const text = readFileSync(configFile, "utf8");
    expect(text).toBe(config.replace("worker-aaaa", "worker-bbbb"));
    const parsed = parseAgentConfig(text, configFile);
    expect(parsed.ok && parsed.config.controllers.operatingSystemConfig.secretName).toBe("gardener-node-agent-worker-bbbb");
    expect(statSync(configFile).mode & 0o777).toBe(0o600);
  } finally {
    await follower.stop();
    await node.stop();
  }
}, 120_000);
