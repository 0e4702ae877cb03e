// Restarts on request (src/controllers/restart.ts) against a real kube-apiserver and a real systemd node:
// the controller runs in this process, drives the node's systemd over its D-Bus and watches the Node as
// a user holding only the node and event rules of docs/rbac.md. The stand-in for the agent's own unit
// (gardener-node-agent.service, a sleeper in the node) shows that it restarts last, after the
// annotation is gone.
import { afterAll, beforeAll, expect, test } from "bun:test";
import { CoreV1Api, PatchStrategy, setHeaderOptions } from "@kubernetes/client-node";
import { restartAnnotation, startRestartController } from "../../src/controllers/restart.ts";
import type { Controller, NodeSource } from "../../src/controllers/types.ts";
import { createSystemd, type Systemd } from "../../src/host/systemd.ts";
import { createEventRecorder } from "../../src/kube/events.ts";
import { createLogger } from "../../src/log.ts";
import { type Cluster, startCluster } from "../harness/cluster.ts";
import { waitFor } from "../harness/exec.ts";
import { bootNode, type Node } from "../harness/node.ts";
import { userWithRules } from "../harness/rbac.ts";
import { startNodeSource } from "../../src/controllers/node-source.ts";

const selfUnit = "gardener-node-agent.service";
const sleeper = (extra = "") => `[Unit]\nDescription=trellis e2e sleeper\n[Service]\n${extra}ExecStart=/bin/sleep infinity\n`;

let cluster: Cluster;
let node: Node;
let core: CoreV1Api;
let systemd: Systemd;
let nodes: NodeSource & Controller;
let controller: Controller;
/** Every restart the controller asked for, with the annotation as the API server had it at that moment. */
const restarts: { unit: string; annotation: string | undefined }[] = [];
const log = createLogger({ level: "error" });

beforeAll(async () => {
  [cluster, node] = await Promise.all([startCluster({ controllerManager: false }), bootNode("restart")]);
  core = cluster.admin().makeApiClient(CoreV1Api);
  await core.createNode({ body: { metadata: { name: node.name, labels: { "kubernetes.io/hostname": node.name } } } });
  const { kube } = await userWithRules(cluster, `gardener.cloud:node-agent:machine:${node.name}`, [
    { rules: [{ apiGroups: [""], resources: ["nodes"], verbs: ["get", "list", "watch", "patch"] }] },
    { namespace: "default", rules: [{ apiGroups: [""], resources: ["events"], verbs: ["create", "patch"] }] },
  ]);
  for (const unit of ["alpha.service", "beta.service", selfUnit]) await node.writeFile(`/etc/systemd/system/${unit}`, sleeper());
  // Its restart takes 2 s: time enough for the control plane to change the request meanwhile.
  await node.writeFile("/etc/systemd/system/slow.service", sleeper("ExecStartPre=/bin/sleep 2\n"));
  await node.execOk(["systemctl", "daemon-reload"]);
  await node.execOk(["systemctl", "start", "alpha.service", "beta.service", "slow.service", selfUnit]);

  systemd = createSystemd({ address: node.busAddress });
  const record = async (unit: string) => {
    const current = await core.readNode({ name: node.name });
    restarts.push({ unit, annotation: current.metadata?.annotations?.[restartAnnotation] });
  };
  const recording: Systemd = {
    ...systemd,
    restart: async (unit) => {
      await record(unit);
      return systemd.restart(unit);
    },
    queueRestart: async (unit) => {
      await record(unit);
      return systemd.queueRestart(unit);
    },
  };
  nodes = startNodeSource({ kube, hostName: node.name, log });
  await nodes.found;
  controller = startRestartController({ kube, systemd: recording, events: createEventRecorder({ kube, log }), nodes, log, selfUnit, retryMs: 200 });
}, 180_000);

afterAll(async () => {
  await controller?.stop();
  await nodes?.stop();
  systemd?.close();
  await Promise.all([node?.stop(), cluster?.stop()]);
}, 60_000);

const annotate = (value: string) =>
  core.patchNode({ name: node.name, body: { metadata: { annotations: { [restartAnnotation]: value } } } }, setHeaderOptions("Content-Type", PatchStrategy.MergePatch));
const annotation = async () => (await core.readNode({ name: node.name })).metadata?.annotations?.[restartAnnotation];
const show = async (unit: string, prop: string) => (await node.execOk(["systemctl", "show", "-P", prop, unit])).trim();
const mainPid = (unit: string) => show(unit, "MainPID").then(Number);
const startedAt = (unit: string) => show(unit, "ExecMainStartTimestampMonotonic").then(Number);
const restartEvents = async () =>
  (await core.listNamespacedEvent({ namespace: "default", fieldSelector: `involvedObject.name=${node.name},reason=SystemDUnitRestart` })).items
    .map((e) => `${e.type} ${e.message}`)
    .sort();
const annotationGone = () => waitFor("the annotation to be removed", async () => (await annotation()) === undefined, 30_000, 50);

test("the listed units restart (.service added where missing), the annotation goes, then the agent's own unit restarts last", async () => {
  restarts.length = 0;
  const before = { alpha: await mainPid("alpha.service"), beta: await mainPid("beta.service"), self: await startedAt(selfUnit) };
  // The own unit first in the list, and without its suffix: still last.
  await annotate("gardener-node-agent,alpha,beta.service");
  await annotationGone();
  await waitFor("the own unit to restart", async () => (await startedAt(selfUnit)) > before.self, 30_000, 50);

  expect(await mainPid("alpha.service")).not.toBe(before.alpha);
  expect(await mainPid("beta.service")).not.toBe(before.beta);
  const [alpha, beta, self] = [await startedAt("alpha.service"), await startedAt("beta.service"), await startedAt(selfUnit)];
  expect(alpha).toBeLessThan(beta);
  expect(beta).toBeLessThan(self);
  expect(await show(selfUnit, "ActiveState")).toBe("active");
  // The annotation was there for the others' restarts and gone before the own one.
  const value = "gardener-node-agent,alpha,beta.service";
  expect(restarts).toEqual([
    { unit: "alpha.service", annotation: value },
    { unit: "beta.service", annotation: value },
    { unit: selfUnit, annotation: undefined },
  ]);
  expect(await restartEvents()).toEqual([
    `Normal Restarted alpha.service as requested by the annotation ${restartAnnotation}`,
    `Normal Restarted beta.service as requested by the annotation ${restartAnnotation}`,
    `Normal Restarting ${selfUnit} (the agent itself) as requested by the annotation ${restartAnnotation}`,
  ]);
}, 60_000);

test("a unit that cannot restart is a Warning event; the others still restart and the annotation still goes", async () => {
  restarts.length = 0;
  const alpha = await mainPid("alpha.service");
  await annotate("no-such-unit,alpha");
  await annotationGone();
  expect(restarts.map((r) => r.unit)).toEqual(["no-such-unit.service", "alpha.service"]);
  expect(await mainPid("alpha.service")).not.toBe(alpha);
  const events = await restartEvents();
  expect(events.filter((e) => e.includes("no-such-unit"))).toEqual([
    expect.stringMatching(/^Warning Restarting no-such-unit\.service as requested by the annotation .* failed: RestartUnit no-such-unit\.service .*not found/),
  ]);
}, 60_000);

test("each request is handled once: Node updates during a restart do not repeat it, and a request changed meanwhile is not lost", async () => {
  restarts.length = 0;
  const [slow, alpha] = [await mainPid("slow.service"), await mainPid("alpha.service")];
  await annotate("slow");
  await waitFor("the slow restart to begin", () => restarts.length === 1, 10_000, 20);
  // Still "slow": kubelet-like updates of the Node, which the controller sees while slow.service restarts.
  for (let i = 0; i < 3; i++) {
    await core.patchNode({ name: node.name, body: { metadata: { labels: { heartbeat: String(i) } } } }, setHeaderOptions("Content-Type", PatchStrategy.MergePatch));
  }
  // The control plane asks for another restart before the first one is done: removing "slow" must not drop it.
  await annotate("alpha");
  await waitFor("alpha to restart", async () => (await mainPid("alpha.service")) !== alpha, 30_000, 50);
  await annotationGone();
  expect(restarts.map((r) => r.unit)).toEqual(["slow.service", "alpha.service"]);
  expect(await mainPid("slow.service")).not.toBe(slow);
  // Nothing more happens afterwards.
  await Bun.sleep(500);
  expect(restarts).toHaveLength(2);
}, 60_000);
