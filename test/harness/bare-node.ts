// A bare machine as a cloud provider hands it over, and the cluster side of bringing it up: the user
// data (a containerd mirror for the air-gapped registry name, the NodeAgentConfiguration, the cluster
// CA, a bootstrap token, the machine name, install.sh), the Node kubelet would register, the agent's
// RBAC, and the approver's hand for its CSR. Shared by the e2e test and the install benchmark.
import { existsSync, readdirSync, readFileSync, renameSync, rmSync } from "node:fs";
import { homedir } from "node:os";
import { CoreV1Api } from "@kubernetes/client-node";
import { stringify } from "yaml";
import { agentUnitContent } from "../../src/api/agent-unit.ts";
import { poolLabel } from "../../src/api/rollout.ts";
import { nodeAgentUserPrefix } from "../../src/kube/csr.ts";
import { sha256, writeLayout } from "../../build/oci-layout.ts";
import { fastCompression, releaseCompression, trellisImageSpec } from "../../build/trellis-image.ts";
import { type AgentNode, agentRules } from "./agent.ts";
import { repoRoot, trellisBinary } from "./binary.ts";
import { createBootstrapToken, decideCsr, grantCsrRbac, waitForCsr } from "./bootstrap.ts";
import { type Cluster, startCluster } from "./cluster.ts";
import { freePort, runDir, runOk } from "./exec.ts";
import { bootNode } from "./node.ts";
import { userWithRules } from "./rbac.ts";
import { type BridgeRelay, startBridgeRelay } from "./bridge-relay.ts";
import { writePodNetwork } from "./kubelet.ts";
import { mirrorHostsToml } from "./kubelet-config.ts";
import { type Registry, startRegistry } from "./registry.ts";

/** The registry name images are referenced by: it does not resolve, only the mirror serves it. */
export const upstream = "registry.example.invalid";
export const agentBase = "/var/lib/gardener-node-agent";
export const agentBinary = "/opt/bin/gardener-node-agent";

const layouts = runDir("bare-node-images");

/** Pushes a one-layer linux/amd64 image holding `files` as REPO:TAG (moving the tag if it exists). */
export async function pushImage(registry: Registry, repo: string, tag: string, files: Record<string, { content: Uint8Array | string; mode: number }>): Promise<void> {
  const dir = `${layouts}/${repo.replace(/\//g, "_")}-${tag}`;
  writeLayout(dir, tag, { platform: { os: "linux", architecture: "amd64" }, layers: [files] }, { level: 1 });
  await registry.push(dir, repo, tag);
}

/**
 * Pushes the trellis image of `binary` as build/image.ts makes it (an index: the zstd image first, the
 * same with a gzip layer after it) as trellis/agent:TAG; returns the index's digest. `release`: at the
 * release's levels, which take minutes of CPU, so the layout is kept in $TRELLIS_CACHE by the binary's
 * sha256 (for benchmarks of what a node really pulls); otherwise at fast levels.
 */
export async function pushTrellis(registry: Registry, tag: string, binary: string, version: string, opts: { release?: boolean } = {}): Promise<string> {
  const content = readFileSync(binary);
  const spec = trellisImageSpec("amd64", content, { version, commit: "e2e" });
  if (!opts.release) {
    const dir = `${layouts}/trellis-${tag}`;
    writeLayout(dir, tag, spec, fastCompression);
    return (await registry.push(dir, "trellis/agent", tag, { all: true })).digest;
  }
  const cache = process.env.TRELLIS_CACHE ?? `${homedir()}/.cache/trellis`;
  const name = `trellis-image-${sha256(content).slice(0, 16)}-${version}`;
  const dir = `${cache}/${name}`;
  // Written aside and renamed: a layout left half-written by a killed run is never taken for a cached one.
  if (!existsSync(`${dir}/index.json`)) {
    rmSync(`${dir}.tmp`, { recursive: true, force: true });
    writeLayout(`${dir}.tmp`, "release", spec, releaseCompression);
    renameSync(`${dir}.tmp`, dir);
    // Only the latest binary's (~95 MiB each): every build is another binary.
    for (const old of readdirSync(cache)) if (old.startsWith("trellis-image-") && old !== name) rmSync(`${cache}/${old}`, { recursive: true, force: true });
  }
  return (await registry.push(dir, "trellis/agent", tag, { all: true, layoutTag: "release" })).digest;
}

/**
 * What a bare node is brought up against: a control plane whose controller manager signs approved CSRs
 * (the CSR rules of docs/rbac.md granted), and a registry holding the compiled trellis as
 * trellis/agent:v1 and `tool` as tools/tool:v1 (bareOsc's kubelet stand-in lists it).
 */
export async function startBareWorld(tool: Record<string, { content: Uint8Array | string; mode: number }>): Promise<{ cluster: Cluster; registry: Registry }> {
  const binary = await trellisBinary();
  const [cluster, registry] = await Promise.all([startCluster(), startRegistry()]);
  await grantCsrRbac(cluster);
  await pushTrellis(registry, "v1", binary, JSON.parse(await runOk([binary, "version", "--json"])).version);
  await pushImage(registry, "tools/tool", "v1", tool);
  return { cluster, registry };
}

/** Stops what a bare-machine test started, the node first (it reaches the registry and the API server). */
export async function stopBareWorld(w: { agent: BareNode | undefined; registry: Registry | undefined; cluster: Cluster | undefined }): Promise<void> {
  await w.agent?.stop();
  await w.registry?.stop();
  await w.cluster?.stop();
}

export type BareNode = AgentNode & {
  machine: string;
  bootstrapUser: string;
  /** The API server and the registry as the node reaches them ("https://host:port", "host:port"). */
  server: string;
  mirror: string;
  /** Stops the node (and the relays a worker reaches the host through). */
  stop(): Promise<void>;
};

export type BareNodeOptions = {
  /**
   * A worker for a real kubelet: a kubelet-capable node on the bridge (test/harness/kubelet.ts), reaching
   * the API server and the registry through relays; its Node is registered by kubelet, not by the test.
   * What the machine image and the network extension would bring is put in place too: containerd's base
   * configuration and the pod network.
   */
  worker?: boolean;
  /** controllers.healthCheck of the agent's configuration (default: stand-ins serve no /healthz, so never). */
  healthCheck?: Record<string, string | number>;
  /**
   * The agent is gardener-node-agent (the benchmark's peer): its configuration file is named after its
   * version (`configName`), carries none of trellis's additions (controllers.healthCheck), and its user
   * gets the wider RBAC it needs (`rules`).
   */
  peer?: { configName: string; rules: (secrets: string[]) => Parameters<typeof userWithRules>[2] };
  /**
   * A worker's containerd configuration as its machine image brings it: Debian's (the CNI directories
   * only, the default) or containerd's own default (`containerd config default`, its runc runtime
   * table included, as most images ship it). Either with `restrict_oom_score_adj` (see below).
   */
  machineContainerd?: "debian" | "containerd-default";
  /** More Secrets the agent is granted (secretRef files, token secrets) besides the OSC Secret. */
  secretRefs?: string[];
  /** controllers.token.syncConfigs of the agent's configuration. */
  tokenSyncConfigs?: { secretName: string; path: string }[];
};

/** Boots a bare node with containerd and writes its user data; the agent's RBAC exists (and the Node, unless a worker). */
export async function bareNode(cluster: Cluster, registry: Registry, prefix: string, secretName: string, opts: BareNodeOptions = {}): Promise<BareNode> {
  const node = await bootNode(prefix, opts.worker ? { net: "bridge", containerd: true, kubelet: true } : { net: "host", containerd: true });
  const relays: BridgeRelay[] = [];
  const stop = async () => {
    for (const r of relays) await r.close();
    await node.stop();
  };
  try {
    let server = cluster.server;
    let mirror = registry.host;
    if (opts.worker) {
      const [api, reg] = [await startBridgeRelay(Number(new URL(cluster.server).port)), await startBridgeRelay(Number(registry.host.split(":")[1]))];
      relays.push(api, reg);
      [server, mirror] = [`https://${api.address}`, reg.address];
      if (opts.machineContainerd === "containerd-default") {
        await node.execOk(["sh", "-c", "containerd config default | sed 's/restrict_oom_score_adj = false/restrict_oom_score_adj = true/' > /etc/containerd/config.toml"]);
      } else {
        await node.writeFile("/etc/containerd/config.toml", machineImageContainerdConfig);
      }
      await node.execOk(["systemctl", "restart", "containerd.service"]);
      // The network extension's part: its CNI plugins where Gardener's containerd config looks (trellis
      // sets bin_dir to /opt/cni/bin), and the pod network.
      await node.execOk(["sh", "-c", "mkdir -p /opt/cni/bin && cp -a /usr/lib/cni/. /opt/cni/bin/"]);
      await writePodNetwork(node);
      // The machine image's sshd, which Gardener's sshd-ensurer keeps enabled and running (without one it
      // fails and is restarted every 5 s, a restart no agent made).
      await node.writeFile("/usr/lib/systemd/system/sshd.service", sshdStandIn);
      await node.execOk(["systemctl", "daemon-reload"]);
    }
    const machine = `machine-${node.name}`;
    const user = nodeAgentUserPrefix + machine;
    const core = cluster.admin().makeApiClient(CoreV1Api);
    // A worker's kubelet registers its Node, labelled with the pool's Secret by the OSC's --node-labels.
    if (!opts.worker) await core.createNode({ body: { metadata: { name: node.name, labels: { "kubernetes.io/hostname": node.name, [poolLabel]: secretName } } } });
    await userWithRules(cluster, user, (opts.peer?.rules ?? agentRules)([secretName, ...(opts.secretRefs ?? [])]));
    const token = await createBootstrapToken(cluster);
    const [healthPort, metricsPort] = [await freePort(), await freePort()];
    await node.writeFile(`/etc/containerd/certs.d/${upstream}/hosts.toml`, mirrorHostsToml(upstream, mirror));
    await node.writeFile(
      `${agentBase}/${opts.peer?.configName ?? "config.yaml"}`,
      stringify({
        apiVersion: "nodeagent.config.gardener.cloud/v1alpha1",
        kind: "NodeAgentConfiguration",
        apiServer: { server, caFile: `${agentBase}/cluster-ca.crt` },
        server: { healthProbes: { port: healthPort }, metrics: { port: metricsPort } },
        controllers: {
          operatingSystemConfig: { secretName, kubernetesVersion: "1.35.4", syncPeriod: "15s" },
          // Kubelet stand-ins serve no /healthz: the agent must not restart them in the middle of a test.
          ...(opts.peer ? {} : { healthCheck: opts.healthCheck ?? { kubeletFailureThreshold: "24h" } }),
          ...(opts.tokenSyncConfigs ? { token: { syncConfigs: opts.tokenSyncConfigs } } : {}),
        },
      }),
      0o600,
    );
    await node.writeFile(`${agentBase}/cluster-ca.crt`, cluster.caPem, 0o644);
    await node.writeFile(`${agentBase}/machine-name`, `${machine}\n`, 0o644);
    await node.writeFile(`${agentBase}/credentials/bootstrap-token`, token.token, 0o600);
    await node.install(`${repoRoot}/install.sh`, "/var/lib/cloud/install.sh", 0o755);
    return { node, name: node.name, user, core, healthPort, metricsPort, machine, bootstrapUser: token.user, server, mirror, stop };
  } catch (err) {
    await stop();
    throw err;
  }
}

const sshdStandIn = `[Unit]
Description=OpenSSH server (a stand-in)
[Service]
ExecStart=/bin/sleep infinity
[Install]
WantedBy=multi-user.target
`;

/**
 * containerd's configuration as the machine image brings it: Debian's (the CNI directories) plus
 * `restrict_oom_score_adj`, which this machine needs (the test process, hence the node, lacks
 * CAP_SYS_RESOURCE, and runc fails every sandbox whose OOM score it cannot lower). trellis patches it.
 */
const machineImageContainerdConfig = `version = 2

[plugins]
  [plugins."io.containerd.grpc.v1.cri"]
    restrict_oom_score_adj = true
    [plugins."io.containerd.grpc.v1.cri".cni]
      bin_dir = "/usr/lib/cni"
      conf_dir = "/etc/cni/net.d"
  [plugins."io.containerd.internal.v1.opt"]
    path = "/var/lib/containerd/opt"
`;

/**
 * Runs install.sh as cloud-init would, for the agent image `repo`:`tag` (trellis's by default), and approves the node's CSR as
 * soon as it appears. Returns the CSR's name and when (performance.now()) install.sh started and the
 * CSR was seen.
 */
export async function installAndApprove(cluster: Cluster, registry: Registry, bare: BareNode, tag: string, repo = "trellis/agent"): Promise<{ csr: string; startedMs: number; csrSeenMs: number }> {
  const digest = (await runOk(["skopeo", "inspect", "--tls-verify=false", "--format", "{{.Digest}}", `docker://${registry.host}/${repo}:${tag}`])).trim();
  return initAndApprove(cluster, bare, () => bare.node.execOk(["sh", "/var/lib/cloud/install.sh"], { env: { TRELLIS_IMAGE: `${upstream}/${repo}:${tag}@${digest}` }, underCpuLimit: true }));
}

/**
 * Starts the machine's node init with `init` and approves the agent's bootstrap CSR as soon as it appears.
 * Returns the CSR's name and when (performance.now()) the init started and the CSR was seen.
 */
export async function initAndApprove(cluster: Cluster, bare: BareNode, init: () => Promise<unknown>): Promise<{ csr: string; startedMs: number; csrSeenMs: number }> {
  const startedMs = performance.now();
  await init();
  const csr = await waitForCsr(cluster, `the bootstrap CSR of ${bare.name}`, (c) => c.spec.username === bare.bootstrapUser, 120_000);
  const csrSeenMs = performance.now();
  const name = csr.metadata?.name as string;
  await decideCsr(cluster, name, "Approved", "E2E", "approved by the test");
  return { csr: name, startedMs, csrSeenMs };
}

const kubeletUnit = `[Unit]
Description=kubelet stand-in
[Service]
ExecStart=/bin/sh -c 'exec sleep infinity'
[Install]
WantedBy=multi-user.target
`;

export type BareOscOptions = { mirror: string; agentTag?: string; toolTag?: string; sandboxImage?: string; extraFile?: string };

/**
 * The OSC of a bare node, shaped like Gardener's: the agent's unit listing its binary (an imageRef file
 * of the trellis image), a kubelet stand-in listing a tool extracted from an image, and containerd
 * configured with the mirror.
 */
export function bareOsc(o: BareOscOptions): string {
  return stringify({
    apiVersion: "extensions.gardener.cloud/v1alpha1",
    kind: "OperatingSystemConfig",
    metadata: { name: "pool-e2e", namespace: "kube-system" },
    spec: {
      type: "debian",
      purpose: "reconcile",
      units: [
        { name: "gardener-node-agent.service", enable: true, content: agentUnitContent({ restartSec: 1 }), filePaths: [agentBinary] },
        { name: "kubelet.service", command: "start", enable: true, content: kubeletUnit, filePaths: ["/opt/bin/tool"] },
      ],
      files: [
        { path: agentBinary, permissions: 0o755, content: { imageRef: { image: `${upstream}/trellis/agent:${o.agentTag ?? "v1"}`, filePathInImage: "/gardener-node-agent" } } },
        { path: "/opt/bin/tool", permissions: 0o755, content: { imageRef: { image: `${upstream}/tools/tool:${o.toolTag ?? "v1"}`, filePathInImage: "/usr/bin/tool" } } },
        ...(o.extraFile ? [{ path: "/etc/extra", permissions: 0o644, content: { inline: { data: o.extraFile } } }] : []),
      ],
      criConfig: {
        name: "containerd",
        cgroupDriver: "systemd",
        containerd: {
          sandboxImage: o.sandboxImage ?? `${upstream}/pause:3.10`,
          registries: [{ upstream, server: `https://${upstream}`, hosts: [{ url: `http://${o.mirror}` }] }],
        },
      },
    },
  });
}
