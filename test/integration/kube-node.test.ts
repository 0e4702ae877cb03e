// src/kube/node.ts, src/kube/events.ts and the Node source against a real kube-apiserver, as a user
// that holds only the rules docs/rbac.md lists for them: finding and watching the agent's Node,
// patching its labels, annotations and one condition, and recording (and counting) events about it.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { CoreV1Api, PatchStrategy, setHeaderOptions, type V1Node } from "@kubernetes/client-node";
import type { Kube } from "../../src/kube/client.ts";
import { rejection, waitFor } from "../harness/exec.ts";
import { KubeError } from "../../src/kube/errors.ts";
import { createEventRecorder } from "../../src/kube/events.ts";
import { findNode, patchNodeCondition, patchNodeMetadata } from "../../src/kube/node.ts";
import { startNodeSource } from "../../src/controllers/node-source.ts";
import { createLogger } from "../../src/log.ts";
import { type Cluster, startCluster } from "../harness/cluster.ts";
import { auditOf, userWithRules } from "../harness/rbac.ts";

let cluster: Cluster;
let core: CoreV1Api;
let agent: Kube;

beforeAll(async () => {
  cluster = await startCluster({ controllerManager: false });
  core = cluster.admin().makeApiClient(CoreV1Api);
  // Exactly the node and event rules of docs/rbac.md.
  ({ kube: agent } = await userWithRules(cluster, "node-agent", [
    {
      rules: [
        { apiGroups: [""], resources: ["nodes"], verbs: ["get", "list", "watch", "patch"] },
        { apiGroups: [""], resources: ["nodes/status"], verbs: ["patch"] },
      ],
    },
    { namespace: "default", rules: [{ apiGroups: [""], resources: ["events"], verbs: ["create", "patch"] }] },
  ]));
  for (const [name, host] of [["node-a", "host-a"], ["node-b", "host-b"], ["node-c", "host-dup"], ["node-d", "host-dup"]] as const) {
    await core.createNode({ body: { metadata: { name, labels: { "kubernetes.io/hostname": host } } } });
  }
}, 180_000);
afterAll(() => cluster?.stop(), 30_000);

const failure = (p: Promise<unknown>) => rejection(p, KubeError);

describe("findNode", () => {
  test("by kubelet's hostname label (trimmed, lower-cased)", async () => {
    expect((await findNode(agent, { hostname: " Host-A\n" })).metadata?.name).toBe("node-a");
    expect((await findNode(agent, { hostname: "host-b" })).metadata?.name).toBe("node-b");
  });

  test("no Node, or two Nodes with the hostname, is a clear error", async () => {
    const none = await failure(findNode(agent, { hostname: "host-none" }));
    expect(none.reason).toBe("not-found");
    expect(none.message).toBe("finding the Node of host host-none: no Node has the label kubernetes.io/hostname=host-none (has kubelet registered it yet?)");
    const two = await failure(findNode(agent, { hostname: "host-dup" }));
    expect(two.message).toBe("finding the Node of host host-dup: 2 Nodes have the label kubernetes.io/hostname=host-dup (node-c, node-d); expected exactly one");
  });
});

describe("the Node source", () => {
  test("a Node kubelet registers after the agent started is seen at once, through the watch by name", async () => {
    const source = startNodeSource({ kube: agent, hostName: "Late-Host", log: createLogger({ level: "error" }), retryMs: 3_600_000 });
    try {
      expect(source.current()).toBeUndefined();
      await core.createNode({ body: { metadata: { name: "late-host", labels: { "kubernetes.io/hostname": "late-host" } } } });
      // With an hour between label lookups, only the watch can have found it.
      expect((await source.found).metadata?.name).toBe("late-host");
    } finally {
      await source.stop();
    }
  });

  test("a Node named otherwise is found by kubelet's hostname label, then watched by its name", async () => {
    const source = startNodeSource({ kube: agent, hostName: "host-b", log: createLogger({ level: "error" }), retryMs: 100 });
    try {
      expect((await source.found).metadata?.name).toBe("node-b");
      const changed = new Promise<V1Node>((resolve) => source.subscribe(resolve));
      await patchNodeMetadata(agent, "node-b", { annotations: { "e2e/seen": "yes" } });
      expect((await changed).metadata?.annotations?.["e2e/seen"]).toBe("yes");
    } finally {
      await source.stop();
    }
  });

  // Found by test/chaos/scenarios/hostname-change.ts: after the hostname changed, the agent restarted
  // itself and never found its Node again (kubelet's Node keeps the old name and label), so it stopped
  // renewing its Lease and applying the Secret.
  test("with no Node for the hostname, the Node the agent reported on before is kept", async () => {
    const source = startNodeSource({ kube: agent, hostName: "renamed-host", lastNodeName: "node-a", log: createLogger({ level: "error" }), retryMs: 100 });
    try {
      expect((await source.found).metadata?.name).toBe("node-a");
    } finally {
      await source.stop();
    }
  });
});

test("labels and annotations: a merge patch adds, changes and removes keys and leaves the others alone", async () => {
  await patchNodeMetadata(agent, "node-a", {
    labels: { "worker.gardener.cloud/kubernetes-version": "1.35.4", "node-role.kubernetes.io/worker": "" },
    annotations: { "checksum/cloud-config-data": "abc", "worker.gardener.cloud/restart-systemd-services": "kubelet" },
  });
  const patched = await patchNodeMetadata(agent, "node-a", {
    labels: { "node-role.kubernetes.io/worker": null },
    annotations: { "checksum/cloud-config-data": "def", "worker.gardener.cloud/restart-systemd-services": null },
  });
  const read = await core.readNode({ name: "node-a" });
  for (const node of [patched, read]) {
    expect(node.metadata?.labels).toEqual({ "kubernetes.io/hostname": "host-a", "worker.gardener.cloud/kubernetes-version": "1.35.4" });
    expect(node.metadata?.annotations).toEqual({ "checksum/cloud-config-data": "def" });
  }
  // A patch that touches only annotations leaves the labels alone.
  await patchNodeMetadata(agent, "node-a", { annotations: { x: "y" } });
  expect((await core.readNode({ name: "node-a" })).metadata?.labels).toEqual(read.metadata?.labels);
});

test("a condition: set, heartbeat keeps lastTransitionTime while the status stays, a new status moves it, kubelet's conditions untouched", async () => {
  const ready = { type: "Ready", status: "True", reason: "KubeletReady", message: "kubelet is posting ready status", lastHeartbeatTime: "2026-01-01T00:00:00Z", lastTransitionTime: "2026-01-01T00:00:00Z" };
  await core.patchNodeStatus({ name: "node-b", body: { status: { conditions: [ready] } } }, setHeaderOptions("Content-Type", PatchStrategy.StrategicMergePatch));
  const at = (iso: string) => () => new Date(iso);
  const ours = (n: V1Node) => n.status?.conditions?.find((c) => c.type === "SystemdUnitsReady");
  // The agent's requests return the server's JSON (times as strings); client-node's client decodes them to Dates.
  const iso = (d: Date | string | undefined) => (d === undefined ? undefined : new Date(d).toISOString());

  await patchNodeCondition(agent, "node-b", { type: "SystemdUnitsReady", status: "True", reason: "ProgressingUnits", message: "kubelet.service: activating" }, { now: at("2026-02-01T10:00:00.700Z") });
  const healthy = await patchNodeCondition(
    agent,
    "node-b",
    { type: "SystemdUnitsReady", status: "True", reason: "AllUnitsHealthy", message: "All systemd units are running as expected." },
    { now: at("2026-02-01T10:01:00Z") },
  );
  expect(ours(healthy)).toMatchObject({ status: "True", reason: "AllUnitsHealthy", message: "All systemd units are running as expected." });
  expect(iso(ours(healthy)?.lastTransitionTime)).toBe("2026-02-01T10:00:00.000Z");
  expect(iso(ours(healthy)?.lastHeartbeatTime)).toBe("2026-02-01T10:01:00.000Z");

  const broken = await patchNodeCondition(agent, "node-b", { type: "SystemdUnitsReady", status: "False", reason: "UnhealthyUnits", message: "kubelet.service: failed" }, { now: at("2026-02-01T10:02:00Z") });
  expect(iso(ours(broken)?.lastTransitionTime)).toBe("2026-02-01T10:02:00.000Z");

  const node = await core.readNode({ name: "node-b" });
  expect(node.status?.conditions?.map((c) => c.type).sort()).toEqual(["Ready", "SystemdUnitsReady"]);
  expect(node.status?.conditions?.find((c) => c.type === "Ready")).toMatchObject({ status: "True", reason: "KubeletReady" });
  expect(ours(node)).toMatchObject({ status: "False", reason: "UnhealthyUnits" });
});

test("concurrent condition writers: a 409 on the resourceVersion they decided on is answered by reading again", async () => {
  const statuses = ["True", "False", "True", "False"] as const;
  const results = await Promise.all(
    statuses.map((status, i) => patchNodeCondition(agent, "node-d", { type: "SystemdUnitsReady", status, reason: `Writer${i}`, message: "" })),
  );
  expect(results).toHaveLength(4);
  const conflicts = auditOf(cluster, "node-agent").filter((e) => e.objectRef?.name === "node-d" && e.responseStatus?.code === 409);
  expect(conflicts.length).toBeGreaterThan(0);
});

test("a condition patched against the Node a write just returned: no read; a stale one costs a 409 and the read", async () => {
  const reads = () => auditOf(cluster, "node-agent").filter((e) => e.objectRef?.name === "node-a" && e.verb === "get").length;
  const condition = { type: "OperatingSystemConfigApplied", status: "True", reason: "Applied", message: "OSC abc is applied" } as const;
  const patched = await patchNodeMetadata(agent, "node-a", { annotations: { "checksum/cloud-config-data": "fresh" } });
  const before = reads();
  const node = await patchNodeCondition(agent, "node-a", condition, { fresh: patched });
  expect(node.status?.conditions?.find((c) => c.type === condition.type)).toMatchObject({ status: "True", reason: "Applied" });
  expect(reads()).toBe(before);

  // The Node changed since `patched` was answered: the precondition fails, and the next attempt reads it.
  await patchNodeMetadata(agent, "node-a", { annotations: { x: "changed meanwhile" } });
  const again = await patchNodeCondition(agent, "node-a", { ...condition, status: "False", reason: "ApplyFailed", message: "failed" }, { fresh: patched });
  expect(again.status?.conditions?.find((c) => c.type === condition.type)).toMatchObject({ status: "False", reason: "ApplyFailed" });
  // The audit log is written as each response completes.
  const conflicts = () => auditOf(cluster, "node-agent").filter((e) => e.objectRef?.name === "node-a" && e.objectRef.subresource === "status" && e.responseStatus?.code === 409).length;
  await waitFor("the 409 and the read in the audit log", () => reads() === before + 1 && conflicts() === 1, 5_000, 50);
  expect(reads()).toBe(before + 1);
  expect(conflicts()).toBe(1);
});

describe("events", () => {
  const listEvents = async (node: string) =>
    (await core.listNamespacedEvent({ namespace: "default", fieldSelector: `involvedObject.name=${node}` })).items.sort((a, b) =>
      (a.metadata?.name ?? "").localeCompare(b.metadata?.name ?? ""),
    );

  test("recorded in default for the Node; an identical one within the window bumps count; others are new events", async () => {
    const node = await core.readNode({ name: "node-c" });
    const ref = { name: "node-c", uid: node.metadata?.uid as string };
    let clock = new Date("2026-03-01T12:00:00Z");
    // Both clocks step together here; the window is measured by the monotonic one.
    const recorder = createEventRecorder({ kube: agent, log: createLogger({ write: () => {} }), now: () => clock, clock: () => clock.getTime() });
    const applied = { node: ref, type: "Normal", reason: "OSCApplied", message: "Operating system config applied (checksum abc)" } as const;

    expect(await recorder.record(applied)).toBeUndefined();
    clock = new Date("2026-03-01T12:01:00Z");
    expect(await recorder.record(applied)).toBeUndefined();
    let events = await listEvents("node-c");
    expect(events).toHaveLength(1);
    expect(events[0]).toMatchObject({
      metadata: { namespace: "default" },
      involvedObject: { kind: "Node", apiVersion: "v1", name: "node-c", uid: ref.uid },
      type: "Normal",
      reason: "OSCApplied",
      message: applied.message,
      source: { component: "trellis", host: "node-c" },
      reportingComponent: "trellis",
      reportingInstance: "node-c",
      count: 2,
    });
    expect(events[0]?.firstTimestamp?.toISOString()).toBe("2026-03-01T12:00:00.000Z");
    expect(events[0]?.lastTimestamp?.toISOString()).toBe("2026-03-01T12:01:00.000Z");

    // A different message, a different type, or a message beyond 1024 characters: new events.
    await recorder.record({ ...applied, message: "Operating system config applied (checksum def)" });
    await recorder.record({ ...applied, type: "Warning" });
    await recorder.record({ ...applied, reason: "OSCApplyFailed", message: "é".repeat(2000) });
    events = await listEvents("node-c");
    expect(events.map((e) => e.count)).toEqual([2, 1, 1, 1]);
    const long = events.find((e) => e.reason === "OSCApplyFailed")?.message ?? "";
    expect(Array.from(long)).toHaveLength(1024);
    expect(long.endsWith("é…")).toBe(true);

    // The event expired (deleted here): the next identical one is a new event, as is one after the window.
    await core.deleteNamespacedEvent({ namespace: "default", name: events[0]?.metadata?.name as string });
    await recorder.record(applied);
    clock = new Date("2026-03-01T12:20:00Z");
    await recorder.record(applied);
    const bumped = (await listEvents("node-c")).filter((e) => e.message === applied.message && e.type === "Normal");
    expect(bumped.map((e) => e.count)).toEqual([1, 1]);
  });

  test("a wall-clock step does not end the aggregation window: the monotonic clock measures it", async () => {
    const node = await core.readNode({ name: "node-c" });
    const ref = { name: "node-c", uid: node.metadata?.uid as string };
    let wall = new Date("2026-03-02T12:00:00Z");
    const recorder = createEventRecorder({ kube: agent, log: createLogger({ write: () => {} }), now: () => wall, clock: () => 1_000 });
    const drift = { node: ref, type: "Normal", reason: "WallStep", message: "the same event, an hour apart on the wall clock" } as const;
    await recorder.record(drift);
    wall = new Date("2026-03-02T13:00:00Z");
    await recorder.record(drift);
    expect((await listEvents("node-c")).filter((e) => e.reason === "WallStep").map((e) => e.count)).toEqual([2]);
  });

  test("a failure to record is logged and returned, never thrown", async () => {
    const { kube: mute } = await userWithRules(cluster, "no-events", []);
    const logs: string[] = [];
    const recorder = createEventRecorder({ kube: mute, log: createLogger({ write: (l) => logs.push(l) }) });
    const err = await recorder.record({ node: { name: "node-d", uid: "u" }, type: "Warning", reason: "OSCApplyFailed", message: "boom" });
    expect(err).toBeInstanceOf(KubeError);
    expect(err?.reason).toBe("forbidden");
    expect(err?.message).toStartWith("recording event OSCApplyFailed for Node node-d: forbidden (403): events is forbidden: User \"no-events\" cannot create resource");
    expect(logs.map((l) => JSON.parse(l))).toEqual([expect.objectContaining({ level: "warn", msg: "could not record event", reason: "OSCApplyFailed" })]);
  });
});
