// gardener-node-agent's gates on the compiled agent, as v1.150.0 has them (issue 20, items 4 and 12):
// - When checksum/cloud-config-data is written (operatingsystemconfig/reconciler.go, Reconcile): only after a
//   registry with a readinessProbe answered (a real OCI registry, down and then up; probed again when its
//   configuration changes), and after the static pods the OSC brings are rolled out and Ready (their mirror
//   pods, made here as kubelet makes them: test/e2e/agent-static-pods.test.ts has a real kubelet). Meanwhile
//   everything else is applied, and the condition OperatingSystemConfigApplied says what the report waits for.
// - The serial lease's holder is the host's name (nodeagent.GetHostName), so a lease gardener-node-agent holds
//   on this machine when trellis takes it over is this node's own; a serial Secret skips the reconciliation
//   delay (add.go, EnqueueWithJitterDelay).
import { afterAll, beforeAll, expect, test } from "bun:test";
import { existsSync } from "node:fs";
import { CoordinationV1Api, CoreV1Api, PatchStrategy, setHeaderOptions, type V1Node } from "@kubernetes/client-node";
import { stringify } from "yaml";
import { microTime } from "../../src/kube/micro-time.ts";
import { type AgentNode, nodeEvents, putOscSecret, startAgentNode } from "../harness/agent.ts";
import { type Cluster, startCluster } from "../harness/cluster.ts";
import { waitFor } from "../harness/exec.ts";
import { type Registry, startRegistry } from "../harness/registry.ts";

const checksumAnnotation = "checksum/cloud-config-data";
const conditionType = "OperatingSystemConfigApplied";
const osc = (spec: Record<string, unknown>) => stringify({ apiVersion: "extensions.gardener.cloud/v1alpha1", kind: "OperatingSystemConfig", spec });
const versionFile = (version: number) => ({ path: "/etc/e2e/version", permissions: 0o644, content: { inline: { encoding: "", data: `${version}\n` } } });

let cluster: Cluster;
let core: CoreV1Api;
let registry: Registry;

beforeAll(async () => {
  [cluster, registry] = await Promise.all([startCluster({ controllerManager: false }), startRegistry()]);
  core = cluster.admin().makeApiClient(CoreV1Api);
}, 120_000);
afterAll(async () => {
  await registry?.stop();
  await cluster?.stop();
});

const conditionOf = (n: V1Node) => n.status?.conditions?.find((c) => c.type === conditionType);

/** Waits until Node `name`'s condition has `reason` for OSC `checksum`; returns the Node then. */
const waitCondition = (name: string, reason: string, checksum: string, says = "") =>
  waitFor(
    `Node ${name}: ${conditionType} ${reason} for ${checksum.slice(0, 12)}${says ? ` saying "${says}"` : ""}`,
    async () => {
      const n = await core.readNode({ name });
      const c = conditionOf(n);
      return c?.reason === reason && c.message?.includes(checksum.slice(0, 12)) && c.message.includes(says) ? n : undefined;
    },
    60_000,
    100,
  );

/** Waits until Node `name` carries `checksum` as applied. */
const waitApplied = (name: string, checksum: string, timeoutMs = 30_000) =>
  waitFor(`Node ${name} to carry ${checksum.slice(0, 12)}`, async () => ((await core.readNode({ name })).metadata?.annotations?.[checksumAnnotation] === checksum ? true : undefined), timeoutMs, 100);

const appliedEvents = async (a: AgentNode, checksum: string) => (await nodeEvents(a)).filter((e) => e.reason === "OSCApplied" && e.message?.includes(checksum.slice(0, 12)));

test("a registry with a readiness probe: the rest is applied at once; its hosts.toml and the checksum wait until it answers, and again when its configuration changes", async () => {
  const secretName = "gardener-node-agent-probe";
  const a = await startAgentNode(cluster, { prefix: "rp", secretName, containerd: true });
  try {
    const hostsToml = "/etc/containerd/certs.d/probe.example/hosts.toml";
    const withRegistry = (version: number, capabilities?: string[]) =>
      osc({
        criConfig: { name: "containerd", containerd: { registries: [{ upstream: "probe.example", readinessProbe: true, hosts: [{ url: `http://${registry.host}`, ...(capabilities ? { capabilities } : {}) }] }] } },
        files: [versionFile(version)],
      });
    await registry.down();
    const v1 = await putOscSecret(cluster, secretName, withRegistry(1));
    const waiting = await waitCondition(a.name, "WaitingForRegistries", v1, "probe.example");
    expect(waiting.metadata?.annotations?.[checksumAnnotation]).toBeUndefined();
    expect(await a.node.readFile("/etc/e2e/version")).toBe("1\n");
    expect(existsSync(`${a.node.root}${hostsToml}`)).toBe(false);
    expect(await appliedEvents(a, v1)).toEqual([]);

    await registry.up();
    await waitApplied(a.name, v1);
    expect(await a.node.readFile(hostsToml)).toContain(`[host."http://${registry.host}"]\n  capabilities = ["pull","resolve"]`);
    await waitCondition(a.name, "Applied", v1);

    // Its configuration changes while it is down: probed again, and until it answers the old hosts.toml stays.
    await registry.down();
    const v2 = await putOscSecret(cluster, secretName, withRegistry(2, ["pull"]));
    const again = await waitCondition(a.name, "WaitingForRegistries", v2, "probe.example");
    expect(again.metadata?.annotations?.[checksumAnnotation]).toBe(v1);
    expect(await a.node.readFile("/etc/e2e/version")).toBe("2\n");
    expect(await a.node.readFile(hostsToml)).toContain('capabilities = ["pull","resolve"]');

    await registry.up();
    await waitApplied(a.name, v2);
    expect(await a.node.readFile(hostsToml)).toContain('capabilities = ["pull"]\n');
  } finally {
    await registry.up().catch(() => undefined);
    await a.node.stop();
  }
}, 180_000);

test("static pods: the checksum waits until their mirror pods carry the manifests' hashes and are Running and Ready", async () => {
  const secretName = "gardener-node-agent-static";
  const a = await startAgentNode(cluster, { prefix: "sp", secretName });
  const mirrorName = `web-${a.name}`;
  try {
    const manifest = (hash: string) =>
      stringify({
        apiVersion: "v1",
        kind: "Pod",
        metadata: { name: "web", namespace: "kube-system", labels: { "static-pod": "true" }, annotations: { "gardener.cloud/config.mirror": hash } },
        spec: { containers: [{ name: "web", image: "example.invalid/web" }] },
      });
    const withStaticPod = (version: number, hash: string) =>
      osc({ files: [versionFile(version), { path: "/etc/kubernetes/manifests/web.yaml", permissions: 0o640, content: { inline: { encoding: "", data: manifest(hash) } } }] });
    // What kubelet makes of the manifest: the mirror pod, with the manifest's labels and annotations.
    const mirror = async (hash: string, ready: boolean) => {
      await core.createNamespacedPod({
        namespace: "kube-system",
        body: {
          metadata: { name: mirrorName, labels: { "static-pod": "true" }, annotations: { "gardener.cloud/config.mirror": hash, "kubernetes.io/config.mirror": hash } },
          spec: { nodeName: a.name, containers: [{ name: "web", image: "example.invalid/web" }] },
        },
      });
      await setReady(ready);
    };
    const setReady = (ready: boolean) =>
      core.patchNamespacedPodStatus(
        { name: mirrorName, namespace: "kube-system", body: { status: { phase: "Running", conditions: [{ type: "Ready", status: ready ? "True" : "False" }] } } },
        setHeaderOptions("Content-Type", PatchStrategy.MergePatch),
      );

    const v1 = await putOscSecret(cluster, secretName, withStaticPod(1, "h1"));
    const waiting = await waitCondition(a.name, "WaitingForStaticPods", v1, "web: no mirror pod yet");
    expect(waiting.metadata?.annotations?.[checksumAnnotation]).toBeUndefined();
    expect(await a.node.readFile("/etc/kubernetes/manifests/web.yaml")).toBe(manifest("h1"));
    await mirror("h1", false);
    await waitCondition(a.name, "WaitingForStaticPods", v1, `kube-system/${mirrorName}: not Ready`);
    expect(await appliedEvents(a, v1)).toEqual([]);
    await setReady(true);
    await waitApplied(a.name, v1);
    // The event is recorded after the checksum is stamped and before the condition says Applied.
    await waitCondition(a.name, "Applied", v1);
    expect((await appliedEvents(a, v1)).length).toBe(1);

    // A new manifest: the mirror pod of the old one, Ready as it is, is not the new one rolled out.
    const v2 = await putOscSecret(cluster, secretName, withStaticPod(2, "h2"));
    const stale = await waitCondition(a.name, "WaitingForStaticPods", v2, `mirror pod kube-system/${mirrorName} runs hash h1, the manifest has hash h2`);
    expect(stale.metadata?.annotations?.[checksumAnnotation]).toBe(v1);
    await core.deleteNamespacedPod({ name: mirrorName, namespace: "kube-system", gracePeriodSeconds: 0 });
    await waitFor("the old mirror pod gone", async () => (await core.listNamespacedPod({ namespace: "kube-system", fieldSelector: `metadata.name=${mirrorName}` })).items.length === 0, 10_000, 50);
    await mirror("h2", true);
    await waitApplied(a.name, v2);
  } finally {
    await a.node.stop();
  }
}, 180_000);

const serial = { "reconciliation.osc.node-agent.gardener.cloud/serial": "true" };
const delayAnnotation = "node-agent.gardener.cloud/reconciliation-delay";

/**
 * An agent whose Node is not named after its host (it finds the Node by the hostname label), so that the two
 * identities a serial lease's holder could have differ; the Node carries `annotations`.
 */
async function unlikeNamedNode(prefix: string, secretName: string, annotations: Record<string, string> = {}): Promise<{ a: AgentNode; nodeName: string; stop(): Promise<void> }> {
  const a = await startAgentNode(cluster, { prefix, secretName, registerNode: false });
  const nodeName = `${a.name}-node`;
  await core.createNode({ body: { metadata: { name: nodeName, labels: { "kubernetes.io/hostname": a.name }, annotations } } });
  return {
    a,
    nodeName,
    stop: async () => {
      await a.node.stop();
      await core.deleteNode({ name: nodeName }).catch(() => undefined);
    },
  };
}

test("a serial Secret's update is not held back by the node's reconciliation delay", async () => {
  const secretName = "gardener-node-agent-serial-delay";
  const n = await unlikeNamedNode("sd", secretName, { [delayAnnotation]: "1h" });
  try {
    await waitApplied(n.nodeName, await putOscSecret(cluster, secretName, osc({ files: [versionFile(1)] }), serial));
    // An update with an hour's delay on the Node: gardener-node-agent queues a serial Secret's update at once.
    await waitApplied(n.nodeName, await putOscSecret(cluster, secretName, osc({ files: [versionFile(2)] }), serial));
  } finally {
    await n.stop();
  }
}, 120_000);

test("a serial lease gardener-node-agent holds on this machine (as its hostname) when trellis takes over is this node's own", async () => {
  const secretName = "gardener-node-agent-serial-holder";
  const leases = cluster.admin().makeApiClient(CoordinationV1Api);
  const n = await unlikeNamedNode("sh", secretName);
  try {
    await waitApplied(n.nodeName, await putOscSecret(cluster, secretName, osc({ files: [versionFile(1)] }), serial));
    const lease = await waitFor(
      "the serial lease released",
      async () => {
        const l = await leases.readNamespacedLease({ name: secretName, namespace: "kube-system" });
        return l.spec?.holderIdentity ? undefined : l;
      },
      10_000,
      50,
    );
    // gardener-node-agent, replaced by trellis during a rollout, held the lease as this machine and renewed it just now.
    const now = microTime(new Date());
    await leases.replaceNamespacedLease({
      name: secretName,
      namespace: "kube-system",
      body: { ...lease, spec: { ...lease.spec, holderIdentity: n.a.name, leaseDurationSeconds: 600, acquireTime: now, renewTime: now } },
    });
    await waitApplied(n.nodeName, await putOscSecret(cluster, secretName, osc({ files: [versionFile(2)] }), serial));
    await waitFor("the serial lease released", async () => !(await leases.readNamespacedLease({ name: secretName, namespace: "kube-system" })).spec?.holderIdentity, 10_000, 50);
  } finally {
    await n.stop();
  }
}, 120_000);
