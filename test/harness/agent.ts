// A node running the compiled agent the way a real one does: binary at /opt/bin, the systemd unit
// gardener-node-agent.service, the NodeAgentConfiguration and a client-certificate kubeconfig under
// /var/lib/gardener-node-agent, a Node object as kubelet would register it, and exactly the RBAC of
// docs/rbac.md. Shared by the agent e2e tests, the demo and the benchmarks.
import { Buffer } from "node:buffer";
import { readFileSync } from "node:fs";
import { CoreV1Api, type CoreV1Event, PatchStrategy, setHeaderOptions, type V1Node } from "@kubernetes/client-node";
import { agentUnitContent } from "../../src/api/agent-unit.ts";
import { poolLabel } from "../../src/api/rollout.ts";
import { sha256Hex } from "../../src/api/desired.ts";
import { nodeAgentUserPrefix } from "../../src/kube/csr.ts";
import { trellisBinary } from "./binary.ts";
import type { Cluster } from "./cluster.ts";
import { freePort, waitFor } from "./exec.ts";
import { bootNode, type Node } from "./node.ts";
import { userWithRules } from "./rbac.ts";

/** The unit `trellis bootstrap` writes, restarting after 1 s instead of 5 (tests restart the agent). */
export const agentUnitText = agentUnitContent({ restartSec: 1 });

/** `user`: the agent's user name at the API server (its client certificate's CN), as the audit log records it. */
export type AgentNode = { node: Node; name: string; user: string; core: CoreV1Api; healthPort: number; metricsPort: number };

/** Rules of docs/rbac.md for an agent reading `secrets` (the OSC secret and its secretRefs). */
export function agentRules(secrets: string[]) {
  return [
    { namespace: "kube-system", rules: [{ apiGroups: [""], resources: ["secrets"], resourceNames: secrets, verbs: ["get", "list", "watch"] }] },
    { namespace: "kube-system", rules: [{ apiGroups: ["coordination.k8s.io"], resources: ["leases"], verbs: ["get", "list", "watch", "create", "update"] }] },
    { namespace: "default", rules: [{ apiGroups: [""], resources: ["events"], verbs: ["create", "patch"] }] },
    {
      rules: [
        { apiGroups: [""], resources: ["nodes"], verbs: ["get", "list", "watch", "patch"] },
        { apiGroups: [""], resources: ["nodes/status"], verbs: ["patch"] },
        { apiGroups: [""], resources: ["pods"], verbs: ["list", "delete"] },
      ],
    },
  ];
}

export type AgentNodeOptions = {
  prefix: string;
  secretName: string;
  secretRefs?: string[];
  syncPeriod?: string;
  start?: boolean;
  /** The agent binary installed at /opt/bin/gardener-node-agent (default: dist/trellis). */
  binary?: string;
  /** The NodeAgentConfiguration's file name in the config dir (gardener-node-agent reads config-<version>.yaml). */
  configName?: string;
  /** The RBAC the agent's user gets (default: agentRules, docs/rbac.md). */
  rules?: Parameters<typeof userWithRules>[2];
  /** The API server URL written into the kubeconfig instead of the cluster's (e.g. a byte-counting relay). */
  server?: string;
  /** Run containerd in the node (see BootOptions). */
  containerd?: boolean;
  /** Create the Node object (default); false: the test registers it later, as kubelet would (registerNode). */
  registerNode?: boolean;
  /** The agent's unit file (default: trellis's, agentUnitText; the peer's benchmarks run gardener-node-agent under Gardener's). */
  unit?: string;
  /** More of the configuration's `controllers` section, as YAML indented by two spaces (e.g. "  drift: {mode: report}\n"). */
  controllers?: string;
  /** More top-level fields of the configuration, as YAML (e.g. "logFormat: text\n"). */
  config?: string;
  /** Environment of the agent's process, set in a drop-in of its unit (e.g. a runtime knob a benchmark compares). */
  environment?: Record<string, string>;
};

export async function startAgentNode(cluster: Cluster, opts: AgentNodeOptions): Promise<AgentNode> {
  const node = await bootNode(opts.prefix, { net: "host", containerd: opts.containerd ?? false });
  try {
    return await setUpAgent(cluster, node, opts);
  } catch (err) {
    // The caller never gets a handle to stop this node: a failed start stops it here.
    await node.stop().catch((stopErr: unknown) => {
      throw new AggregateError([err, stopErr], `starting the agent on node ${node.name} failed, and stopping the node failed too`);
    });
    throw err;
  }
}

async function setUpAgent(cluster: Cluster, node: Node, opts: AgentNodeOptions): Promise<AgentNode> {
  const core = cluster.admin().makeApiClient(CoreV1Api);
  if (opts.registerNode !== false) await registerNode(core, node.name, opts.secretName);
  const user = nodeAgentUserPrefix + node.name;
  const { kubeconfig } = await userWithRules(cluster, user, opts.rules ?? agentRules([opts.secretName, ...(opts.secretRefs ?? [])]));
  const kubeconfigText = readFileSync(kubeconfig, "utf8");
  await node.writeFile("/var/lib/gardener-node-agent/credentials/kubeconfig", opts.server ? kubeconfigText.replace(cluster.server, opts.server) : kubeconfigText, 0o600);
  await node.writeFile("/var/lib/gardener-node-agent/machine-name", `${node.name}\n`, 0o644);
  // The test nodes share the host's network: each agent gets ports of its own.
  const [healthPort, metricsPort] = [await freePort(), await freePort()];
  await node.writeFile(
    `/var/lib/gardener-node-agent/${opts.configName ?? "config.yaml"}`,
    `apiVersion: nodeagent.config.gardener.cloud/v1alpha1
kind: NodeAgentConfiguration
server:
  healthProbes: {port: ${healthPort}}
  metrics: {port: ${metricsPort}}
${opts.config ?? ""}controllers:
  operatingSystemConfig:
    secretName: ${opts.secretName}
    kubernetesVersion: 1.35.4
    syncPeriod: ${opts.syncPeriod ?? "10m"}
${opts.controllers ?? ""}`,
    0o600,
  );
  await node.install(opts.binary ?? (await trellisBinary()), "/opt/bin/gardener-node-agent");
  await node.writeFile("/etc/systemd/system/gardener-node-agent.service", opts.unit ?? agentUnitText, 0o644);
  if (opts.environment && Object.keys(opts.environment).length > 0) {
    const lines = Object.entries(opts.environment).map(([k, v]) => `Environment=${JSON.stringify(`${k}=${v}`)}`);
    await node.writeFile("/etc/systemd/system/gardener-node-agent.service.d/50-environment.conf", `[Service]\n${lines.join("\n")}\n`, 0o644);
  }
  await node.execOk(["systemctl", "daemon-reload"]);
  // --no-block: the unit is Type=notify, ready only after the first reconcile; tests wait for what they need.
  if (opts.start !== false) await node.execOk(["systemctl", "enable", "--now", "--no-block", "gardener-node-agent.service"]);
  return { node, name: node.name, user, core, healthPort, metricsPort };
}

/**
 * What kubelet would register: the hostname label is how the agent finds its Node, the InternalIP what
 * gardener-node-agent's health check expects of a registered node. `secretName`: the pool's OSC Secret, the
 * label Gardener's kubelet registers the Node with (--node-labels, rendered into the OSC), and gardenlet
 * rewrites; the agent only reads it.
 */
export async function registerNode(core: CoreV1Api, name: string, secretName?: string): Promise<void> {
  const labels = { "kubernetes.io/hostname": name, ...(secretName ? { [poolLabel]: secretName } : {}) };
  await core.createNode({ body: { metadata: { name, labels } } });
  // A patch, not read-then-replace: kube-controller-manager writes to a new Node at once (409 Conflict).
  await core.patchNodeStatus({ name, body: { status: { addresses: [{ type: "InternalIP", address: "127.0.0.1" }] } } }, setHeaderOptions("Content-Type", PatchStrategy.MergePatch));
}

/** Creates or replaces the OSC Secret the way Gardener writes it (data osc.yaml, checksum annotation). */
export async function putOscSecret(cluster: Cluster, name: string, oscYaml: string | Uint8Array, annotations: Record<string, string> = {}): Promise<string> {
  const core = cluster.admin().makeApiClient(CoreV1Api);
  const checksum = sha256Hex(oscYaml);
  const body = {
    metadata: {
      name,
      namespace: "kube-system",
      labels: { "gardener.cloud/role": "operating-system-config" },
      annotations: { "checksum/data-script": checksum, ...annotations },
    },
    data: { "osc.yaml": Buffer.from(oscYaml).toString("base64") },
  };
  try {
    await core.replaceNamespacedSecret({ name, namespace: "kube-system", body });
  } catch (err) {
    // Only a Secret that is not there yet is created: any other failure of the replace is the caller's
    // to see (a create would hide it behind a 409 AlreadyExists).
    if ((err as { code?: unknown }).code !== 404) throw err;
    await core.createNamespacedSecret({ namespace: "kube-system", body });
  }
  return checksum;
}

export async function readNode(a: AgentNode): Promise<V1Node> {
  return a.core.readNode({ name: a.name });
}

/** Waits until the Node carries `checksum` as applied, reading it every `intervalMs`. */
export async function waitApplied(a: AgentNode, checksum: string, timeoutMs = 30_000, intervalMs = 50): Promise<V1Node> {
  return waitFor(
    `${a.name} to apply ${checksum.slice(0, 12)}`,
    async () => {
      const n = await readNode(a);
      return n.metadata?.annotations?.["checksum/cloud-config-data"] === checksum ? n : undefined;
    },
    timeoutMs,
    intervalMs,
  );
}

export async function nodeEvents(a: AgentNode): Promise<CoreV1Event[]> {
  const list = await a.core.listNamespacedEvent({ namespace: "default", fieldSelector: `involvedObject.name=${a.name}` });
  return list.items;
}

/** A property of a systemd unit in the node (`systemctl show -P`). */
export async function unitProperty(node: Node, unit: string, property: string): Promise<string> {
  return (await node.execOk(["systemctl", "show", "-P", property, unit])).trim();
}

export async function mainPid(a: AgentNode, unit: string): Promise<number> {
  return Number(await unitProperty(a.node, unit, "MainPID"));
}
