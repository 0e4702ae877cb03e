// The twin nodes of the differential test: one real node per agent (systemd, D-Bus and containerd in
// namespaces, test/harness/node.ts), trellis's compiled binary on one and Gardener's gardener-node-agent
// on the other (test/peer/build.sh), each with the same NodeAgentConfiguration, its own OSC Secret of
// identical content, against one real kube-apiserver; a real OCI registry serves the imageRef files.
import { Buffer } from "node:buffer";
import { dirname } from "node:path";
import { CoreV1Api } from "@kubernetes/client-node";
import { type AgentNode, mainPid, putOscSecret, startAgentNode } from "../harness/agent.ts";
import { pushImage } from "../harness/bare-node.ts";
import { type Cluster, startCluster } from "../harness/cluster.ts";
import { waitFor } from "../harness/exec.ts";
import { type Registry, startRegistry } from "../harness/registry.ts";
import { type BenchAgent, benchAgents } from "../bench/lib/agents.ts";
import { serviceUnit } from "./osc.ts";

export type Side = "gna" | "trellis";
export const sides: readonly Side[] = ["gna", "trellis"];

export type Twin = AgentNode & { side: Side; label: string; secretName: string; agent: BenchAgent };

/** What the scenario's OSCs refer to: the same for both nodes. */
export type Env = {
  /** The registry name imageRef files use; only the mirror in hosts.toml (the local registry) serves it. */
  upstream: string;
  /** "127.0.0.1:PORT" of the local registry. */
  mirror: string;
  nodeNames: Record<Side, string>;
  secretRefName: string;
  tokenSecretName: string;
  tokenPath: string;
};

/**
 * Token Secrets of controllers.token.syncConfigs: one synced into a directory that exists on the node (as
 * Gardener's are: /var/lib/gardener-node-agent/credentials), one into a directory that does not.
 */
const tokens = [
  { secretName: "parity-token", path: "/var/lib/parity-token/token" },
  { secretName: "parity-token-nodir", path: "/var/lib/parity-token-nodir/token" },
] as const;

export type World = { cluster: Cluster; registry: Registry; env: Env; twins: Record<Side, Twin>; stop(): Promise<void> };

const upstream = "registry.example.invalid";
const secretRefName = "parity-secret-ref";
/** A unit on both nodes before either agent runs, with a drop-in of its own: OSC drop-ins for it must leave both alone. */
export const foreignUnit = "parity-foreign.service";

export const toolImage = (tag: string) => `${upstream}/parity/tool:${tag}`;

/** The OS extension's update command of the in-place steps, on both nodes: `VERSION [--fail]`; a machine that updates without a reboot. */
export const osUpdateTool = "/usr/local/sbin/parity-os-update";
const osUpdateScript = `#!/bin/sh
set -eu
if [ "\${2:-}" = --fail ]; then echo "parity: the OS update to $1 failed" >&2; exit 1; fi
sed "s/^PRETTY_NAME=.*/PRETTY_NAME=\\"Debian GNU\\/Linux $1 (parity)\\"/" /etc/os-release > /etc/os-release.parity
mv /etc/os-release.parity /etc/os-release
`;

export async function startTwins(): Promise<World> {
  const agents = await benchAgents();
  const cluster = await startCluster({ controllerManager: false });
  const stops: (() => Promise<void>)[] = [() => cluster.stop()];
  const stop = async () => {
    for (const s of stops.reverse()) await s().catch((err: unknown) => console.error(`parity: stopping: ${String(err)}`));
  };
  try {
    const registry = await startRegistry();
    stops.push(() => registry.stop());
    for (const tag of ["v1", "v2"]) await pushImage(registry, "parity/tool", tag, { tool: { content: `#!/bin/sh\necho parity tool ${tag}\n`, mode: 0o755 } });
    // The stand-in kubelet both agents' health checks ask (the nodes share the host's network).
    const kubelet = standInKubelet();
    stops.push(async () => void kubelet.stop(true));
    const core = cluster.admin().makeApiClient(CoreV1Api);
    await putSecret(core, secretRefName, { content: "from the secret, v1\n" });
    for (const t of tokens) await putSecret(core, t.secretName, { token: "token-v1" });
    const twins = await Promise.all(agents.map((agent) => startTwin(cluster, agent, stops)));
    const bySide = Object.fromEntries(twins.map((t) => [t.side, t])) as Record<Side, Twin>;
    return {
      cluster,
      registry,
      env: { upstream, mirror: registry.host, nodeNames: { gna: bySide.gna.name, trellis: bySide.trellis.name }, secretRefName, tokenSecretName: tokens[0].secretName, tokenPath: tokens[0].path },
      twins: bySide,
      stop,
    };
  } catch (err) {
    await stop();
    throw err;
  }
}

async function startTwin(cluster: Cluster, agent: BenchAgent, stops: (() => Promise<void>)[]): Promise<Twin> {
  const secretName = `osc-parity-${agent.id}`;
  const a = await startAgentNode(cluster, {
    prefix: `par-${agent.id}`,
    secretName,
    syncPeriod: "10m",
    binary: agent.binary,
    configName: agent.configName,
    unit: agent.unit,
    // Both request a client certificate of their own in a CA rotation (the test signs it: startCsrSigner).
    rules: [...agent.rules([secretName, secretRefName, ...tokens.map((t) => t.secretName)]), { rules: [{ apiGroups: ["certificates.k8s.io"], resources: ["certificatesigningrequests"], verbs: ["create", "get", "list", "watch"] }] }],
    containerd: true,
    start: false,
    controllers: `  token:\n    syncPeriod: 15s\n    syncConfigs:\n${tokens.map((t) => `    - secretName: ${t.secretName}\n      path: ${t.path}\n`).join("")}`,
  });
  stops.push(() => a.node.stop());
  await a.node.writeFile(`/etc/systemd/system/${foreignUnit}`, serviceUnit("foreign"), 0o644);
  await a.node.writeFile(`/etc/systemd/system/${foreignUnit}.d/10-existing.conf`, "[Service]\nEnvironment=EXISTING=1\n", 0o644);
  await a.node.execOk(["systemctl", "daemon-reload"]);
  await a.node.execOk(["systemctl", "enable", "--now", foreignUnit]);
  await a.node.execOk(["mkdir", "-p", "-m", "0755", dirname(tokens[0].path)]);
  await a.node.writeFile(osUpdateTool, osUpdateScript, 0o755);
  // --no-block: trellis's unit is Type=notify and ready only after its first reconcile, and there is no OSC yet.
  await a.node.execOk(["systemctl", "enable", "--now", "--no-block", "gardener-node-agent.service"]);
  // The first step's "before" must see the agent's process: a start job still queued then would count as a
  // restart of the agent by that step (its InvocationID appears only after it).
  await waitFor(`${agent.label}'s process on ${a.name}`, async () => ((await mainPid(a, "gardener-node-agent.service")) > 0 ? true : undefined), 60_000, 50);
  return { ...a, side: agent.id, label: agent.label, secretName, agent };
}

function standInKubelet() {
  try {
    return Bun.serve({ hostname: "127.0.0.1", port: 10248, fetch: () => new Response("ok") });
  } catch (err) {
    throw new Error(`the stand-in kubelet cannot listen on 127.0.0.1:10248 (a real kubelet on this machine?): ${String(err)}`);
  }
}

export async function putSecret(core: CoreV1Api, name: string, data: Record<string, string>): Promise<void> {
  const body = { metadata: { name, namespace: "kube-system" }, data: Object.fromEntries(Object.entries(data).map(([k, v]) => [k, Buffer.from(v).toString("base64")])) };
  try {
    await core.replaceNamespacedSecret({ name, namespace: "kube-system", body });
  } catch (err) {
    if ((err as { code?: unknown }).code !== 404) throw err;
    await core.createNamespacedSecret({ namespace: "kube-system", body });
  }
}

/** Both OSC Secrets get the same text (and so the same checksum); returns it. */
export async function putBoth(w: World, text: string, annotations: Record<string, string> = {}): Promise<string> {
  const checksums = await Promise.all(sides.map((s) => putOscSecret(w.cluster, w.twins[s].secretName, text, annotations)));
  return checksums[0] as string;
}
