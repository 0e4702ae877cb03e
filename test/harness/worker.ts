// A real worker node from a bare machine, shared by the worker e2e test, the demo and the bootstrap
// benchmark: a control plane that bootstraps kubelets (kube-controller-manager approves and signs
// kubelet client CSRs), a registry with the images a worker pulls (kubelet's hyperkube, pause, a web
// server, trellis's own image), a bare kubelet-capable node (bareNode { worker: true }), the OSC Gardener
// renders for its pool (worker-osc.ts), install.sh, the agent's CSR approved, the Node Ready.
import { readFileSync } from "node:fs";
import { CoreV1Api, type V1Pod } from "@kubernetes/client-node";
import { parse } from "yaml";
import { mainPid, putOscSecret, readNode, waitApplied } from "./agent.ts";
import { type BareNode, bareNode, type BareNodeOptions, initAndApprove, installAndApprove, pushImage, pushTrellis, upstream } from "./bare-node.ts";
import { trellisBinary } from "./binary.ts";
import { grantCsrRbac } from "./bootstrap.ts";
import { bridgeHostIp } from "./bridge-relay.ts";
import { type Cluster, startCluster } from "./cluster.ts";
import { runOk, waitFor } from "./exec.ts";
import { grantKubeletBootstrapRbac, waitForNodeReady, waitForPodReady } from "./kubelet.ts";
import { type KubeletImages, pushKubeletImages, webPort } from "./kubelet-images.ts";
import { type Registry, startRegistry } from "./registry.ts";
import { type WorkerOscInput, workerOsc } from "./worker-osc.ts";

export type WorkerWorld = { cluster: Cluster; registry: Registry; images: KubeletImages; stop(): Promise<void> };

/**
 * The node agent a worker runs: its image in the registry (repository and tag; the binary at
 * /gardener-node-agent, installed by install.sh and named by the OSC) and, for gardener-node-agent (the
 * benchmark's peer), what its configuration and RBAC need (BareNodeOptions.peer).
 */
export type WorkerAgent = { repo: string; tag: string; peer?: BareNodeOptions["peer"] };

/** trellis, as startWorkerWorld pushes it. */
export const trellisAgent: WorkerAgent = { repo: "trellis/agent", tag: "v1" };

/**
 * A node agent's binary pushed into the world's registry as the image its OSC deploys (the binary at
 * /gardener-node-agent): trellis's as build/image.ts makes it (`release`: at the release's levels), and
 * gardener-node-agent's as one plain layer, with what its configuration and RBAC need.
 */
export async function pushAgentImage(
  world: WorkerWorld,
  agent: { id: "trellis" | "gna"; binary: string; version: string; configName: string; rules: NonNullable<BareNodeOptions["peer"]>["rules"] },
  opts: { release?: boolean } = {},
): Promise<WorkerAgent> {
  const tag = `${agent.id}-${agent.version}`;
  if (agent.id === "trellis") {
    await pushTrellis(world.registry, tag, agent.binary, agent.version, opts);
    return { repo: trellisAgent.repo, tag };
  }
  await pushImage(world.registry, "gardener/node-agent", tag, { "gardener-node-agent": { content: readFileSync(agent.binary), mode: 0o755 } });
  return { repo: "gardener/node-agent", tag, peer: { configName: agent.configName, rules: agent.rules } };
}

/** `release`: trellis's image as a release compresses it (pushTrellis), for benchmarks of the boot. */
export async function startWorkerWorld(opts: { release?: boolean } = {}): Promise<WorkerWorld> {
  const binary = await trellisBinary();
  const [cluster, registry] = await Promise.all([startCluster({ servingIps: [bridgeHostIp] }), startRegistry()]);
  try {
    await Promise.all([grantCsrRbac(cluster), grantKubeletBootstrapRbac(cluster)]);
    const images = await pushKubeletImages(registry);
    await pushTrellis(registry, trellisAgent.tag, binary, JSON.parse(await runOk([binary, "version", "--json"])).version, opts);
    return {
      cluster,
      registry,
      images,
      stop: async () => {
        await registry.stop();
        await cluster.stop();
      },
    };
  } catch (err) {
    await Promise.all([registry.stop(), cluster.stop()]);
    throw err;
  }
}

export type Worker = {
  bare: BareNode;
  secretName: string;
  /** The checksum of the first OSC the worker applied. */
  checksum: string;
  /** What the pool's OSC is rendered from; `apply` renders it again with changes. */
  input: WorkerOscInput;
  /**
   * performance.now() when install.sh started, when the agent's CSR appeared, when the Node was Ready and
   * when it carried the OSC's checksum (the agent reports once kubelet has registered the Node).
   */
  startedMs: number;
  csrSeenMs: number;
  readyMs: number;
  appliedMs: number;
};

export type WorkerOptions = {
  /** The node agent (default: trellis). */
  agent?: WorkerAgent;
  /**
   * How the machine gets the agent at its first boot: trellis's install.sh (the default), or Gardener's own
   * gardener-node-init from the pool's provisioning OSC (its init.sh pulls the agent's image with ctr).
   */
  init?: "install.sh" | "gardener-node-init";
  /** The worker pool (Gardener's default: worker); each pool has its own OSC Secret. */
  pool?: string;
  machineContainerd?: BareNodeOptions["machineContainerd"];
  /** Settings of the pool's OSC from the start (e.g. an in-place update strategy, an older kubelet). */
  osc?: Partial<Pick<WorkerOscInput, "updateStrategy" | "kubernetesVersion" | "images">>;
};

/** A bare machine brought up to a Ready Node with the OSC Gardener renders, applied by the agent. */
export async function bringUpWorker(world: WorkerWorld, prefix: string, o: WorkerOptions = {}): Promise<Worker> {
  const { cluster, registry, images } = world;
  const { agent = trellisAgent, pool, machineContainerd } = o;
  const values = { caPem: cluster.caPem, kubeletCaPem: readFileSync(cluster.clientCaFile, "utf8"), images, agentImage: `${upstream}/${agent.repo}:${agent.tag}`, pool, ...o.osc };
  // Gardener names the pool's Secret after what the pool's nodes share (version, machine, image, CRI,
  // parts of kubelet's config), not after the API server's address: known before the node is.
  const { secretName } = await workerOsc({ ...values, server: "https://unknown.invalid" });
  // Gardener's defaults for the agent's checks: its rendered configuration replaces the bootstrap one.
  const bare = await bareNode(cluster, registry, prefix, secretName, { worker: true, machineContainerd, ...(agent.peer ? { peer: agent.peer } : { healthCheck: {} }) });
  try {
    const input = { ...values, server: bare.server };
    const rendered = await workerOsc(input);
    if (rendered.secretName !== secretName) throw new Error(`the pool's Secret name changed with the API server's address: ${secretName} → ${rendered.secretName}`);
    const checksum = await putOscSecret(cluster, secretName, rendered.osc);
    const { startedMs, csrSeenMs } = o.init === "gardener-node-init" ? await initAndApprove(cluster, bare, () => gardenerNodeInit(bare, rendered.init)) : await installAndApprove(cluster, registry, bare, agent.tag, agent.repo);
    const [readyMs, appliedMs] = await Promise.all([
      waitForNodeReady(cluster.admin(), bare.name, 180_000).then(() => performance.now()),
      waitApplied(bare, checksum, 180_000, 100).then(() => performance.now()),
    ]);
    return { bare, secretName, checksum, input, startedMs, csrSeenMs, readyMs, appliedMs };
  } catch (err) {
    // What the node was doing, before it goes: the test's error alone says only what did not happen.
    const journal = await bare.node.exec(["journalctl", "--no-pager", "-o", "short-monotonic", "-n", "60", "-u", "gardener-node-init", "-u", "gardener-node-agent", "-u", "kubelet", "-u", "containerd"]).catch(() => undefined);
    console.error(`bringUpWorker(${prefix}) failed on ${bare.name}; its journal (last 60 lines of init, agent, kubelet, containerd):\n${journal?.stdout ?? "(unreadable)"}`);
    await bare.stop();
    throw err;
  }
}

/**
 * Gardener's node init, as machine-controller-manager's user data brings it: the provisioning OSC's files
 * (init.sh, the agent's bootstrap configuration, the cluster CA) and its gardener-node-init.service, started.
 * The bootstrap token and machine name, placeholders there, are the machine's own (bareNode wrote them).
 */
async function gardenerNodeInit(bare: BareNode, initOsc: string): Promise<void> {
  const osc = parse(initOsc) as { spec: { files: { path: string; permissions?: number; content: { inline: { encoding?: string; data: string } } }[]; units: { name: string; content: string }[] } };
  for (const f of osc.spec.files) {
    const { encoding, data } = f.content.inline;
    if (data.startsWith("<<")) continue;
    await bare.node.writeFile(f.path, encoding === "b64" ? Buffer.from(data, "base64") : data, f.permissions ?? 0o600);
  }
  for (const u of osc.spec.units) await bare.node.writeFile(`/etc/systemd/system/${u.name}`, u.content);
  await bare.node.execOk(["sh", "-c", `touch /etc/environment && systemctl daemon-reload && systemctl enable --now --no-block ${osc.spec.units.map((u) => u.name).join(" ")}`]);
}

/** Renders the pool's OSC with `changes`, puts it into the Secret and waits until the node applied it. */
export async function applyToWorker(world: WorkerWorld, w: Worker, changes: Partial<WorkerOscInput>): Promise<string> {
  const checksum = await putOscSecret(world.cluster, w.secretName, (await workerOsc({ ...w.input, ...changes })).osc);
  await waitApplied(w.bare, checksum, 90_000);
  return checksum;
}

/** Creates the web Pod bound to the worker (spec.nodeName) and waits until it is Running and Ready. */
export async function runWebPod(world: WorkerWorld, w: Worker, name = "web"): Promise<V1Pod> {
  await world.cluster.admin().makeApiClient(CoreV1Api).createNamespacedPod({
    namespace: "default",
    body: {
      metadata: { name },
      spec: {
        nodeName: w.bare.name,
        // kubelet probes the pod's address over the pod network before it calls the pod Ready.
        containers: [{ name: "web", image: world.images.web, ports: [{ containerPort: webPort }], readinessProbe: { httpGet: { path: "/", port: webPort }, periodSeconds: 1 } }],
      },
    },
  });
  return waitForPodReady(world.cluster.admin(), "default", name, 120_000);
}

/** What the Pod's container answers, asked from the node over the pod network. */
export async function webAnswer(w: Worker, pod: V1Pod): Promise<string> {
  return w.bare.node.execOk(["busybox", "wget", "-qO-", `http://${pod.status?.podIP}:${webPort}/`]);
}

export type UnitPids = { kubelet: number; containerd: number; agent: number };

/** The units' main PIDs once each one runs (MainPID is 0 while a unit restarts: never signal that). */
export function unitPids(w: Worker): Promise<UnitPids> {
  return waitFor("kubelet, containerd and the agent running", async () => {
    const p = {
      kubelet: await mainPid(w.bare, "kubelet.service"),
      containerd: await mainPid(w.bare, "containerd.service"),
      agent: await mainPid(w.bare, "gardener-node-agent.service"),
    };
    return Object.values(p).every((pid) => pid > 1) ? p : undefined;
  }, 60_000, 200);
}

/**
 * The Node's Ready condition's last heartbeat (ms since the epoch; 0 without one), returned once the wall
 * clock is past that heartbeat's second: heartbeats have whole seconds, so a kubelet restarted within the
 * same second would report a heartbeat `readyAgain` could not tell from this one. Call it before a change.
 */
export async function readyHeartbeat(w: Worker): Promise<number> {
  const ready = (await readNode(w.bare)).status?.conditions?.find((c) => c.type === "Ready");
  const heartbeat = new Date(ready?.lastHeartbeatTime ?? 0).getTime();
  const wait = heartbeat + 1000 - Date.now();
  if (wait > 0) await new Promise((resolve) => setTimeout(resolve, wait));
  return heartbeat;
}

/**
 * Waits for the Node Ready as a kubelet that runs since `sinceMs` (wall clock) reports it: a heartbeat other
 * than `previous` (the one before) and not before the second of `sinceMs` (heartbeats have one second's
 * precision), so that the old kubelet's last report never counts.
 */
export function readyAgain(w: Worker, previous: number, sinceMs: number, timeoutMs = 120_000): Promise<true> {
  return waitFor(`${w.bare.name} Ready as reported after ${new Date(sinceMs).toISOString()}`, async () => {
    const ready = (await readNode(w.bare)).status?.conditions?.find((c) => c.type === "Ready");
    const at = new Date(ready?.lastHeartbeatTime ?? 0).getTime();
    return ready?.status === "True" && at !== previous && at >= Math.floor(sinceMs / 1000) * 1000 ? true : undefined;
  }, timeoutMs, 50);
}
