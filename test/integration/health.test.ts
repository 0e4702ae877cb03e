// src/controllers/health.ts against real components: a systemd node running containerd and a kubelet
// stand-in (a kubelet.service answering /healthz like kubelet, switched to HTTP 500 by a file), and a
// real kube-apiserver for the Node and the events. The controller runs in this process, as a user
// holding the node and event rules of docs/rbac.md, and drives the node's systemd over its bus.
//
// Why this shape: the controller must reach kubelet's port and containerd's socket the way it would on
// a node. The node shares the host's network (net "host") so the probe is a plain HTTP GET on
// 127.0.0.1; the stand-in listens on a free port instead of 10248, so parallel tests cannot clash, and
// that URL is the one thing injected. containerd's socket is reached through /proc/<pid>/root.
// Thresholds are shortened (sync 200 ms, threshold 1 s) to keep the test quick; the logic is the same.
import { afterAll, afterEach, beforeAll, describe, expect, test } from "bun:test";
import { CoreV1Api, type CoreV1Event, PatchStrategy, setHeaderOptions, type V1Node, type V1NodeAddress } from "@kubernetes/client-node";
import { startHealthController } from "../../src/controllers/health.ts";
import { startNodeSource } from "../../src/controllers/node-source.ts";
import type { Controller, NodeSource } from "../../src/controllers/types.ts";
import { createSystemd, type Systemd } from "../../src/host/systemd.ts";
import type { Kube } from "../../src/kube/client.ts";
import { createEventRecorder } from "../../src/kube/events.ts";
import { createLogger } from "../../src/log.ts";
import { createRegistry } from "../../src/metrics.ts";
import { type Cluster, startCluster } from "../harness/cluster.ts";
import type { FirstAfter } from "../../src/loops.ts";
import { freePort, waitFor } from "../harness/exec.ts";
import { bootNode, type Node } from "../harness/node.ts";
import { userWithRules } from "../harness/rbac.ts";
import { memoryStatusBoard, metricSample } from "../harness/observe.ts";

const config = { syncPeriod: 200, kubeletFailureThreshold: 1000, containerdFailureThreshold: 1000, readinessFlaps: 5, readinessFlapWindow: 600_000 };
const log = createLogger({ level: "error" });

// Serves /healthz like kubelet (200 "ok"), or 500 while /run/kubelet-fail exists; every start appends
// "<pid> <unix time>" to /run/kubelet-starts, which is how the test counts restarts and times them.
const standIn = `import http.server, os, sys, time
with open("/run/kubelet-starts", "a") as f:
    f.write(f"{os.getpid()} {time.time()}\\n")
class Healthz(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        failing = os.path.exists("/run/kubelet-fail")
        body = b"[-]syncloop failed: told to by the test" if failing else b"ok"
        self.send_response(500 if failing else 200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Healthz).serve_forever()
`;

let cluster: Cluster;
let core: CoreV1Api;
let agent: Kube;
let node: Node;
let sd: Systemd;
let nodes: NodeSource & Controller;
let port: number;

beforeAll(async () => {
  [cluster, node, port] = await Promise.all([startCluster({ controllerManager: false }), bootNode("health", { net: "host", containerd: true }), freePort()]);
  core = cluster.admin().makeApiClient(CoreV1Api);
  await core.createNode({ body: { metadata: { name: node.name, labels: { "kubernetes.io/hostname": node.name } } } });
  ({ kube: agent } = await userWithRules(cluster, "health-agent", [
    { rules: [{ apiGroups: [""], resources: ["nodes"], verbs: ["get", "list", "watch"] }] },
    { namespace: "default", rules: [{ apiGroups: [""], resources: ["events"], verbs: ["create", "patch"] }] },
  ]));
  nodes = startNodeSource({ kube: agent, hostName: node.name, log });
  await nodes.found;
  sd = createSystemd({ address: node.busAddress });

  await node.writeFile("/opt/kubelet-standin.py", standIn);
  await node.writeFile("/etc/systemd/system/kubelet.service", `[Service]\nExecStart=/usr/bin/python3 /opt/kubelet-standin.py ${port}\n`);
  await node.execOk(["systemctl", "daemon-reload"]);
  await node.execOk(["systemctl", "start", "kubelet.service"]);
  await waitFor("the kubelet stand-in to answer", async () => (await fetch(`http://127.0.0.1:${port}/healthz`)).ok, 10_000, 50);
}, 180_000);
afterAll(async () => {
  sd?.close();
  await nodes?.stop();
  await node?.stop();
  await cluster?.stop();
}, 60_000);



/** A health controller for `target` with its own metrics and status board. */
function start(target: Node, overrides: { kubeletHealthzUrl?: string; systemd?: Systemd; nodes?: NodeSource; kube?: Kube; firstAfter?: FirstAfter } = {}) {
  const metrics = createRegistry();
  const status = memoryStatusBoard();
  const controller = startHealthController({
    systemd: overrides.systemd ?? sd,
    kube: overrides.kube ?? agent,
    nodes: overrides.nodes ?? nodes,
    events: createEventRecorder({ kube: agent, log }),
    metrics,
    status,
    log,
    config,
    kubeletHealthzUrl: overrides.kubeletHealthzUrl ?? `http://127.0.0.1:${port}/healthz`,
    containerdSocket: `${target.root}/run/containerd/containerd.sock`,
    probeTimeoutMs: 500,
    firstAfter: overrides.firstAfter,
  });
  return { controller, metrics, status };
}

async function events(reason: string): Promise<CoreV1Event[]> {
  const list = await core.listNamespacedEvent({ namespace: "default", fieldSelector: `involvedObject.name=${node.name},reason=${reason}` });
  return list.items;
}
const eventCount = async (reason: string) => (await events(reason)).reduce((n, e) => n + (e.count ?? 1), 0);

/** Start times (ms since the epoch) of every kubelet stand-in process so far. */
async function kubeletStarts(): Promise<number[]> {
  const text = await node.readFile("/run/kubelet-starts");
  return text.trim().split("\n").map((line) => Number(line.split(" ")[1]) * 1000);
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

describe("kubelet", () => {
  test("a healthy kubelet is left alone", async () => {
    const before = (await kubeletStarts()).length;
    const { controller, metrics, status } = start(node);
    try {
      await sleep(2_500); // two and a half thresholds
      expect((await kubeletStarts()).length).toBe(before);
      expect(metricSample(metrics, 'trellis_health_check_failures_total{component="kubelet"}')).toBe(0);
      expect(metricSample(metrics, 'trellis_health_restarts_total{component="kubelet"}')).toBe(0);
      expect(status.of("health")).toMatchObject({ ok: true, summary: "kubelet healthy, containerd healthy", kubelet: { state: "healthy", answer: "ok", restarts: 0 } });
      expect(await events("KubeletUnhealthy")).toEqual([]);
    } finally {
      await controller.stop();
    }
  }, 30_000);

  test("a failing kubelet is restarted once it has failed for the threshold, and the clock starts over", async () => {
    const { controller, metrics, status } = start(node);
    const before = (await kubeletStarts()).length;
    try {
      await sleep(300);
      const failFrom = Date.now();
      await node.writeFile("/run/kubelet-fail", "");
      const first = await waitFor("the first restart", async () => (await kubeletStarts())[before], 10_000, 50);
      // Not before a full threshold of failing; and then not again before another full threshold,
      // although the stand-in keeps failing after its restart.
      expect(first - failFrom).toBeGreaterThanOrEqual(config.kubeletFailureThreshold);
      expect(first - failFrom).toBeLessThan(config.kubeletFailureThreshold + 2_000);
      const second = await waitFor("the second restart", async () => (await kubeletStarts())[before + 1], 10_000, 50);
      expect(second - first).toBeGreaterThanOrEqual(config.kubeletFailureThreshold);

      await node.execOk(["rm", "/run/kubelet-fail"]);
      await waitFor("kubelet healthy again", () => (status.of("health") as { kubelet?: { state?: string } } | undefined)?.kubelet?.state === "healthy", 5_000, 50);
      const restarts = (await kubeletStarts()).length - before;
      await sleep(2_000);
      expect((await kubeletStarts()).length - before).toBe(restarts); // healthy again: no more restarts
      expect(restarts).toBeGreaterThanOrEqual(2);
      expect(metricSample(metrics, 'trellis_health_restarts_total{component="kubelet"}')).toBe(restarts);
      expect(metricSample(metrics, 'trellis_health_check_failures_total{component="kubelet"}')).toBeGreaterThanOrEqual(restarts * 4);

      const warnings = await waitFor("the Warning events", async () => ((await eventCount("KubeletUnhealthy")) === restarts ? events("KubeletUnhealthy") : undefined), 5_000);
      for (const e of warnings) {
        expect(e.type).toBe("Warning");
        expect(e.message).toMatch(
          new RegExp(
            `^kubelet has been failing its health check for [12]s \\(threshold 1s\\); last error: GET http://127\\.0\\.0\\.1:${port}/healthz: HTTP 500: \\[-\\]syncloop failed: told to by the test\\. Restarted kubelet\\.service\\.$`,
          ),
        );
      }
      expect(status.of("health")).toMatchObject({ ok: true, kubelet: { state: "healthy", restarts } });
    } finally {
      await controller.stop();
      await node.exec(["rm", "-f", "/run/kubelet-fail"]);
    }
  }, 30_000);
});

describe("containerd", () => {
  const containerdPid = async () => (await sd.unitStatus("containerd.service")).mainPID;
  const answers = async () => (await node.exec(["ctr", "--timeout", "2s", "version"])).code === 0;

  test("a hung containerd (SIGSTOP: its socket still accepts connections) is restarted after the threshold", async () => {
    const { controller, metrics } = start(node);
    try {
      await sleep(300);
      const pid = await containerdPid();
      expect(pid).toBeGreaterThan(0);
      const hungFrom = Date.now();
      await node.execOk(["kill", "-STOP", String(pid)]);
      const restarted = await waitFor("containerd restarted", async () => {
        const s = await sd.unitStatus("containerd.service");
        return s.mainPID !== pid && s.activeState === "active" ? s : undefined;
      }, 15_000, 50);
      expect((restarted.activeEnterTimestamp?.getTime() ?? 0) - hungFrom).toBeGreaterThanOrEqual(config.containerdFailureThreshold);
      expect(await answers()).toBe(true);
      expect(metricSample(metrics, 'trellis_health_restarts_total{component="containerd"}')).toBe(1);
      const [warning] = await waitFor("the Warning event", async () => ((await events("ContainerdUnhealthy")).length ? events("ContainerdUnhealthy") : undefined), 5_000);
      expect(warning?.message).toMatch(
        /^containerd has been failing its health check for [12]s \(threshold 1s\); last error: containerd Version call on \/proc\/\d+\/root\/run\/containerd\/containerd\.sock: no answer within 500 ms\. Restarted containerd\.service\.$/,
      );
    } finally {
      await controller.stop();
    }
  }, 60_000);

  test("a dead containerd is restarted by the controller, before systemd's own RestartSec=5s", async () => {
    const { controller, metrics } = start(node);
    try {
      await sleep(300);
      const pid = await containerdPid();
      const killedAt = Date.now();
      await node.execOk(["kill", "-KILL", String(pid)]);
      const restarted = await waitFor("containerd restarted", async () => {
        const s = await sd.unitStatus("containerd.service");
        return s.mainPID !== pid && s.mainPID > 0 && s.activeState === "active" ? s : undefined;
      }, 15_000, 50);
      const after = (restarted.activeEnterTimestamp?.getTime() ?? 0) - killedAt;
      expect(after).toBeGreaterThanOrEqual(config.containerdFailureThreshold);
      expect(after).toBeLessThan(4_500);
      expect(await answers()).toBe(true);
      expect(metricSample(metrics, 'trellis_health_restarts_total{component="containerd"}')).toBe(1);
      await waitFor("the Warning event", async () => (await events("ContainerdUnhealthy")).some((e) => /connect ECONNREFUSED|ENOENT/.test(e.message ?? "")), 5_000);
    } finally {
      await controller.stop();
    }
  }, 60_000);
});

test("the first check waits for the agent's first reconcile (firstAfter), then runs at once", async () => {
  let reconciled!: () => void;
  const firstReconcile = new Promise<void>((resolve) => (reconciled = resolve));
  const { controller, status } = start(node, { firstAfter: { until: firstReconcile, maxMs: 60_000 } });
  try {
    await sleep(1_000); // five sync periods in which nothing may be checked
    expect(status.of("health")).toBeUndefined();
    reconciled();
    await waitFor("the first check", () => status.of("health")?.summary === "kubelet healthy, containerd healthy", 5_000, 20);
  } finally {
    await controller.stop();
  }
}, 30_000);

test("components whose unit is not on the node are skipped, not counted as failing", async () => {
  // A node without kubelet.service and with containerd masked; nothing listens on this port.
  const bare = await bootNode("health-bare");
  const bareSd = createSystemd({ address: bare.busAddress });
  // Its Node is not registered: a restart here must not add events to the other node's.
  const unregistered: NodeSource = { current: () => undefined, subscribe: () => () => {}, found: new Promise(() => {}), listed: Promise.resolve() };
  const { controller, metrics, status } = start(bare, { kubeletHealthzUrl: `http://127.0.0.1:${await freePort()}/healthz`, systemd: bareSd, nodes: unregistered });
  try {
    await sleep(2_000);
    for (const component of ["kubelet", "containerd"]) {
      expect(metricSample(metrics, `trellis_health_check_failures_total{component="${component}"}`)).toBe(0);
      expect(metricSample(metrics, `trellis_health_restarts_total{component="${component}"}`)).toBe(0);
    }
    expect(status.of("health")).toMatchObject({
      ok: true,
      summary: "kubelet not installed, containerd not installed",
      kubelet: { state: "not installed" },
      containerd: { state: "not installed" },
    });

    // Once kubelet is installed (and not answering), its failures count.
    await bare.writeFile("/etc/systemd/system/kubelet.service", "[Service]\nExecStart=/bin/sleep infinity\n");
    await bare.execOk(["systemctl", "daemon-reload"]);
    await waitFor("kubelet failures to count", () => (metricSample(metrics, 'trellis_health_check_failures_total{component="kubelet"}') ?? 0) > 0, 5_000, 50);
    expect(metricSample(metrics, 'trellis_health_check_failures_total{component="containerd"}')).toBe(0);
  } finally {
    await controller.stop();
    bareSd.close();
    await bare.stop();
  }
}, 30_000);

test("the Node's readiness flapping NotReady → Ready 5 times makes one Warning event", async () => {
  const { controller, status } = start(node);
  const setReady = async (ready: boolean) => {
    const now = new Date().toISOString().replace(/\.\d+Z$/, "Z");
    const condition = { type: "Ready", status: ready ? "True" : "False", reason: ready ? "KubeletReady" : "KubeletNotReady", message: "set by the test", lastHeartbeatTime: now, lastTransitionTime: now };
    await core.patchNodeStatus({ name: node.name, body: { status: { conditions: [condition] } } }, setHeaderOptions("Content-Type", PatchStrategy.StrategicMergePatch));
    // Each state must reach the controller (the Node watch delivers every change; this only keeps the test in step).
    await waitFor(`the Node source to see Ready=${ready}`, () => readyOf(nodes.current()) === ready, 5_000, 10);
  };
  try {
    for (let i = 1; i <= 4; i++) {
      await setReady(false);
      await setReady(true);
    }
    await sleep(300);
    expect(await events("KubeletReadinessFlapping")).toEqual([]);
    expect(status.of("health")).toMatchObject({ readiness: { becameReadyInWindow: 4, window: "10m" } });

    await setReady(false);
    await setReady(true);
    const [event] = await waitFor("the flapping event", async () => ((await events("KubeletReadinessFlapping")).length ? events("KubeletReadinessFlapping") : undefined), 5_000);
    expect(event).toMatchObject({
      type: "Warning",
      count: 1,
      message: "The Node went from NotReady to Ready 5 times within 10m (threshold 5): kubelet's readiness is flapping.",
    });

    // More flapping within the same window: no second event.
    for (let i = 0; i < 3; i++) {
      await setReady(false);
      await setReady(true);
    }
    await sleep(500);
    expect(await eventCount("KubeletReadinessFlapping")).toBe(1);
  } finally {
    await controller.stop();
  }
}, 30_000);

function readyOf(n: V1Node | undefined): boolean | undefined {
  const c = n?.status?.conditions?.find((x) => x.type === "Ready");
  return c ? c.status === "True" : undefined;
}

describe("the Node's InternalIP, restored when kubelet lost it (gardener-node-agent's healthcheck/kubelet.go)", () => {
  const merge = setHeaderOptions("Content-Type", PatchStrategy.MergePatch);
  const setAddresses = (addresses: V1NodeAddress[]) => core.patchNodeStatus({ name: node.name, body: { status: { addresses } } }, merge);
  const addressesNow = async () => (await core.readNode({ name: node.name })).status?.addresses;
  const hostname = { type: "Hostname", address: "kubelet-lost-the-ips" };
  /** Waits until the controller remembers `ip` (its status board says so). */
  const remembers = (status: ReturnType<typeof start>["status"], ip: string) =>
    waitFor(`the controller to remember ${ip}`, () => (status.of("health") as { internalIP?: string } | undefined)?.internalIP === ip, 5_000, 20);
  const warning = (says: string) => waitFor(`a NodeAddressesMissing Warning saying "${says}"`, async () => (await events("NodeAddressesMissing")).find((e) => e.message?.includes(says)), 5_000, 50);
  let restorer: Kube;

  beforeAll(async () => {
    // The agent's rules of docs/rbac.md that this needs: patching the Node's status, and events.
    ({ kube: restorer } = await userWithRules(cluster, "health-restorer", [
      { rules: [{ apiGroups: [""], resources: ["nodes"], verbs: ["get", "list", "watch"] }, { apiGroups: [""], resources: ["nodes/status"], verbs: ["patch"] }] },
      { namespace: "default", rules: [{ apiGroups: [""], resources: ["events"], verbs: ["create", "patch"] }] },
    ]));
  });
  afterEach(async () => {
    await setAddresses([]);
  });

  test("lost while still the host's (127.0.0.1, on lo): the addresses become that InternalIP alone, with a Warning and a Normal event", async () => {
    await setAddresses([{ type: "InternalIP", address: "127.0.0.1" }, hostname]);
    const { controller, status } = start(node, { kube: restorer });
    try {
      await remembers(status, "127.0.0.1");
      await setAddresses([hostname]);
      const restored = await waitFor("the InternalIP restored", async () => {
        const a = await addressesNow();
        return a?.length === 1 && a[0]?.type === "InternalIP" ? a : undefined;
      }, 5_000, 20);
      expect(restored).toEqual([{ type: "InternalIP", address: "127.0.0.1" }]);
      const missing = await warning("restoring the last one it had, 127.0.0.1, which is still this host's");
      expect(missing).toMatchObject({ type: "Warning", message: "The Node has neither an InternalIP nor an ExternalIP: restoring the last one it had, 127.0.0.1, which is still this host's." });
      const [normal] = await waitFor("the NodeInternalIPRestored event", async () => ((await events("NodeInternalIPRestored")).length ? events("NodeInternalIPRestored") : undefined), 5_000, 50);
      expect(normal).toMatchObject({ type: "Normal", message: "Set the Node's lost InternalIP to 127.0.0.1, the last one it had." });
    } finally {
      await controller.stop();
    }
  }, 30_000);

  test("lost and no longer the host's (192.0.2.7, a documentation address): said, and the addresses left as they are", async () => {
    await setAddresses([{ type: "InternalIP", address: "192.0.2.7" }]);
    const { controller, status } = start(node, { kube: restorer });
    try {
      await remembers(status, "192.0.2.7");
      await setAddresses([hostname]);
      // The look that made this Warning decided not to restore: the event says why.
      await warning("the last one it had, 192.0.2.7, is no longer this host's");
      expect(await addressesNow()).toEqual([hostname]);
    } finally {
      await controller.stop();
    }
  }, 30_000);

  test("a restore the API server refuses restarts kubelet, which registers its addresses again, and says so", async () => {
    await setAddresses([{ type: "InternalIP", address: "127.0.0.1" }]);
    const before = (await kubeletStarts()).length;
    // The agent's user here may not patch the Node's status: the API server refuses the restore (403).
    const { controller, status } = start(node, { kube: agent });
    try {
      await remembers(status, "127.0.0.1");
      await setAddresses([hostname]);
      const [failed] = await waitFor("the NodeInternalIPRestoreFailed event", async () => ((await events("NodeInternalIPRestoreFailed")).length ? events("NodeInternalIPRestoreFailed") : undefined), 5_000, 50);
      expect(failed?.type).toBe("Warning");
      expect(failed?.message).toMatch(/^Could not set the Node's InternalIP to 127\.0\.0\.1: restoring the InternalIP 127\.0\.0\.1 of Node health-\S+: forbidden \(403\): .*\. Restarted kubelet\.service\.$/);
      await waitFor("kubelet restarted", async () => (await kubeletStarts()).length > before, 5_000, 50);
      expect(await addressesNow()).toEqual([hostname]);
    } finally {
      await controller.stop();
    }
  }, 30_000);
});
