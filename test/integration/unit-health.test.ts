// src/controllers/unit-health.ts against real components: the units are applied by the compiled
// agent (`trellis apply --osc` inside a systemd node), so they are exactly what trellis manages, and
// the controller (in this process, over the node's bus, reading the node's state file) sets the Node
// condition SystemdUnitsReady on a real kube-apiserver as a user holding docs/rbac.md's node rules.
// The syncPeriod (200 ms) and stuckThreshold (1.5 s) are shortened; the rules are the same.
import { afterAll, beforeAll, expect, test } from "bun:test";
import { CoreV1Api, type V1NodeCondition } from "@kubernetes/client-node";
import { stringify } from "yaml";
import { startNodeSource } from "../../src/controllers/node-source.ts";
import type { Controller, NodeSource } from "../../src/controllers/types.ts";
import { startUnitHealthController } from "../../src/controllers/unit-health.ts";
import { createStateStore } from "../../src/apply/state-store.ts";
import { createFiles } from "../../src/host/files.ts";
import { createSystemd, type Systemd } from "../../src/host/systemd.ts";
import { createLogger } from "../../src/log.ts";
import { trellisBinary } from "../harness/binary.ts";
import { type Cluster, startCluster } from "../harness/cluster.ts";
import { waitFor } from "../harness/exec.ts";
import { bootNode, type Node } from "../harness/node.ts";
import { auditOf, userWithRules } from "../harness/rbac.ts";
import { memoryStatusBoard } from "../harness/observe.ts";

const agentUser = "units-agent";
const install = "[Install]\nWantedBy=multi-user.target\n";
const sleeper = (what: string) => `[Unit]\nDescription=${what}\n[Service]\nExecStart=/bin/sleep infinity\n${install}`;
const units = [
  { name: "u-ok.service", command: "start", enable: true, content: sleeper("runs") },
  { name: "u-crash.service", command: "start", enable: true, content: sleeper("runs until the test kills it") },
  {
    name: "u-slow.service",
    command: "start",
    enable: true,
    // Starts at once, unless /run/u-slow-hold exists: then it stays "activating (start-pre)".
    content: `[Service]\nExecStartPre=/bin/sh -c 'while [ -e /run/u-slow-hold ]; do sleep 0.1; done'\nExecStart=/bin/sleep infinity\n${install}`,
  },
  { name: "u-once.service", command: "start", enable: true, content: `[Service]\nType=oneshot\nExecStart=/bin/true\n${install}` },
  { name: "u-tick.timer", command: "start", enable: true, content: "[Timer]\nOnActiveSec=1h\n[Install]\nWantedBy=timers.target\n" },
  { name: "u-tick.service", command: "start", enable: true, content: "[Service]\nExecStart=/bin/true\n" },
  { name: "u-off.service", enable: false, content: sleeper("kept off by the OSC") },
];
const osc = {
  apiVersion: "extensions.gardener.cloud/v1alpha1",
  kind: "OperatingSystemConfig",
  metadata: { name: "units", namespace: "kube-system" },
  spec: { type: "debian", purpose: "reconcile", units },
};

let cluster: Cluster;
let core: CoreV1Api;
let node: Node;
let sd: Systemd;
let nodes: NodeSource & Controller;
let controller: Controller;
const board = memoryStatusBoard();

beforeAll(async () => {
  [cluster, node] = await Promise.all([startCluster({ controllerManager: false }), bootNode("units")]);
  core = cluster.admin().makeApiClient(CoreV1Api);
  await core.createNode({ body: { metadata: { name: node.name, labels: { "kubernetes.io/hostname": node.name } } } });
  const { kube } = await userWithRules(cluster, agentUser, [
    {
      rules: [
        { apiGroups: [""], resources: ["nodes"], verbs: ["get", "list", "watch"] },
        { apiGroups: [""], resources: ["nodes/status"], verbs: ["patch"] },
      ],
    },
  ]);
  const log = createLogger({ level: "error" });
  await node.install(await trellisBinary(), "/opt/bin/trellis");
  nodes = startNodeSource({ kube, hostName: node.name, log });
  sd = createSystemd({ address: node.busAddress });
  controller = startUnitHealthController({
    systemd: sd,
    kube,
    nodes,
    store: createStateStore(createFiles(node.root)),
    status: board,
    log,
    config: { syncPeriod: 200, stuckThreshold: 1500 },
  });
}, 180_000);
afterAll(async () => {
  await controller?.stop();
  await nodes?.stop();
  sd?.close();
  await node?.stop();
  await cluster?.stop();
}, 60_000);


async function condition(): Promise<V1NodeCondition | undefined> {
  const n = await core.readNode({ name: node.name });
  return n.status?.conditions?.find((c) => c.type === "SystemdUnitsReady");
}

/** Waits for the condition to have this status and reason, and a message matching `message`. */
function conditionBecomes(status: string, reason: string, message: string | RegExp): Promise<V1NodeCondition> {
  return waitFor(
    `SystemdUnitsReady ${status}/${reason}`,
    async () => {
      const c = await condition();
      const matches = typeof message === "string" ? c?.message === message : message.test(c?.message ?? "");
      return c?.status === status && c.reason === reason && matches ? c : undefined;
    },
    10_000,
    50,
  );
}
const allHealthy = () => conditionBecomes("True", "AllUnitsHealthy", "All systemd units from the operating system config are running as expected.");
const systemctl = (...args: string[]) => node.execOk(["systemctl", ...args]);
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
/** Patches of the Node's status by the agent so far. */
const statusPatches = () => auditOf(cluster, agentUser).filter((e) => e.stage === "ResponseComplete" && e.verb === "patch" && e.objectRef?.resource === "nodes").length;

test("before any OSC is applied there are no units to check and no condition", async () => {
  await nodes.found;
  await sleep(600);
  expect(await condition()).toBeUndefined();
  expect(board.of("units")).toMatchObject({ ok: true, summary: "no OSC applied yet: no units to check" });
}, 30_000);

test("the applied units are healthy: a oneshot that has run and a timer's service between runs are not 'inactive'", async () => {
  await node.writeFile("/root/osc.yaml", stringify(osc));
  const applied = await node.exec(["/opt/bin/trellis", "apply", "--osc", "/root/osc.yaml"], { timeoutMs: 60_000 });
  expect(applied.stderr).not.toContain("failed");
  expect(applied.code).toBe(0);
  const c = await allHealthy();
  expect(c.lastTransitionTime).toBeDefined();
  // What makes this meaningful: both are enabled and inactive (dead), and the timer waits.
  for (const unit of ["u-once.service", "u-tick.service"]) expect((await sd.unitStatus(unit)).activeState).toBe("inactive");
  expect((await sd.unitStatus("u-tick.service")).triggeredBy).toEqual(["u-tick.timer"]);
  expect(board.of("units")).toMatchObject({ ok: true, summary: "7 unit(s): all healthy", checked: 7, units: [] });
}, 60_000);

test("a steady node costs no API request: the condition is patched only when it changes", async () => {
  await allHealthy();
  const before = statusPatches();
  await sleep(2_000); // ten checks
  expect(statusPatches()).toBe(before);
}, 30_000);

test("a failed unit makes the condition False naming it, and True again once it runs", async () => {
  await systemctl("kill", "--signal=KILL", "u-crash.service");
  await conditionBecomes("False", "UnhealthyUnits", "u-crash.service: failed (signal)");
  expect(board.of("units")).toMatchObject({ ok: true, units: [{ unit: "u-crash.service", health: "unhealthy", why: "failed (signal)" }] });
  await systemctl("start", "u-crash.service");
  await allHealthy();
}, 30_000);

test("every unhealthy unit is named: failed, enabled but inactive, active although the OSC disables it", async () => {
  await systemctl("kill", "--signal=KILL", "u-crash.service");
  await systemctl("stop", "u-ok.service");
  await systemctl("start", "u-off.service");
  await conditionBecomes(
    "False",
    "UnhealthyUnits",
    "u-crash.service: failed (signal); u-off.service: active but the OSC says enable: false; u-ok.service: inactive but enabled",
  );
  await systemctl("start", "u-crash.service", "u-ok.service");
  await systemctl("stop", "u-off.service");
  await allHealthy();
}, 30_000);

test("a failed unit the OSC disables is not reported, as gardener-node-agent reports only enabled ones", async () => {
  await systemctl("start", "u-off.service");
  await systemctl("kill", "--signal=KILL", "u-off.service");
  await waitFor("u-off.service failed", async () => (await sd.unitStatus("u-off.service")).activeState === "failed", 10_000, 50);
  // A unit the OSC enables, failed after it: the condition names it alone, so the disabled one was judged healthy.
  await systemctl("kill", "--signal=KILL", "u-crash.service");
  await conditionBecomes("False", "UnhealthyUnits", "u-crash.service: failed (signal)");
  expect((await sd.unitStatus("u-off.service")).activeState).toBe("failed");
  await systemctl("start", "u-crash.service");
  await allHealthy();
  await systemctl("reset-failed", "u-off.service");
}, 30_000);

test("a unit activating is progressing, then stuck once past stuckThreshold", async () => {
  await node.writeFile("/run/u-slow-hold", "");
  try {
    await systemctl("restart", "--no-block", "u-slow.service");
    const since = /since (\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ)/;
    const progressing = await conditionBecomes("True", "ProgressingUnits", /^u-slow\.service: activating \(start-pre\) since \S+Z$/);
    const stuck = await conditionBecomes("False", "UnhealthyUnits", /^u-slow\.service: stuck activating \(start-pre\) since \S+Z, longer than 1500ms$/);
    expect(stuck.message?.match(since)?.[1]).toBe(progressing.message?.match(since)?.[1] as string);
    const stateChange = (await sd.unitStatus("u-slow.service")).stateChangeTimestamp as Date;
    expect(stuck.message).toContain(stateChange.toISOString().replace(/\.\d+Z$/, "Z"));
  } finally {
    await node.execOk(["rm", "-f", "/run/u-slow-hold"]);
  }
  await allHealthy();
}, 30_000);
