// The OS update of Gardener's in-place update, with the machine restart it takes: the compiled agent on a
// node that really reboots (systemctl reboot inside the node ends its systemd; the harness boots the same
// root again and systemd starts the agent as at any boot). The OS extension's update tool is played as an
// A/B image update: it stages the new version, which a unit at the next boot makes the running one, and
// restarts the machine. machine-controller-manager's part (the drain, then reading the result) is played
// by the test through the API, as in test/e2e/in-place.test.ts.
import { afterAll, beforeAll, expect, test } from "bun:test";
import { Buffer } from "node:buffer";
import { CoreV1Api, PatchStrategy, setHeaderOptions, type V1Node } from "@kubernetes/client-node";
import { agentUnit } from "../../src/api/agent-unit.ts";
import { rolledBack } from "../../src/plan/os-update.ts";
import { type AgentNode, mainPid, nodeEvents, putOscSecret, readNode, startAgentNode, waitApplied } from "../harness/agent.ts";
import { type Cluster, startCluster } from "../harness/cluster.ts";
import { waitFor } from "../harness/exec.ts";
import { recordVersions } from "../harness/watch.ts";

const secretName = "gardener-node-agent-reboot";
const resultLabel = "node.machine.sapcloud.io/update-result";
const failedReason = "node.machine.sapcloud.io/update-failed-reason";
const updatingOs = "node-agent.gardener.cloud/updating-operating-system-version";
const checksumKey = "checksum/cloud-config-data";

/**
 * The OS extension's update tool: `update VERSION [--no-reboot|--broken]`; every run is counted. As a real
 * one, it does not return once it restarted the machine: the shutdown ends it, with the agent's unit, and
 * the agent may see it ended before its own stop.
 */
const updateTool = `#!/bin/sh
set -eu
echo "$1" >> /var/lib/os-update/runs
case "\${2:-}" in
  --broken) ;;   # the new image does not boot: the machine comes back with the one it ran
  *) sed "s/^PRETTY_NAME=.*/PRETTY_NAME=\\"Debian GNU\\/Linux $1 (next)\\"/" /etc/os-release > /var/lib/os-update/staged ;;
esac
[ "\${2:-}" = --no-reboot ] && exit 0
systemctl reboot
exec sleep infinity
`;
/** The next boot runs what was staged, before the agent starts. */
const activateUnit = `[Unit]
Description=e2e: boot the staged OS version
DefaultDependencies=no
Before=${agentUnit} sysinit.target
ConditionPathExists=/var/lib/os-update/staged
[Service]
Type=oneshot
ExecStart=/bin/sh -c 'rm -f /etc/os-release && mv /var/lib/os-update/staged /etc/os-release'
[Install]
WantedBy=sysinit.target
`;

/** kubelet's configuration inline, as an in-place pool's OSC carries it (the in-place checks read it). */
const kubeletConfig = Buffer.from("apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nmaxPods: 110\n").toString("base64");
const osc = (version: string, args: string[] = [version]) => `apiVersion: extensions.gardener.cloud/v1alpha1
kind: OperatingSystemConfig
metadata: {name: reboot, namespace: kube-system}
spec:
  type: debian
  purpose: reconcile
  inPlaceUpdates: {operatingSystemVersion: "${version}", kubelet: 1.35.4}
  files:
  - path: /var/lib/kubelet/config/kubelet
    permissions: 0600
    content: {inline: {encoding: b64, data: ${kubeletConfig}}}
status:
  inPlaceUpdates:
    osUpdate: {command: /opt/os-update/update, args: [${args.map((a) => `"${a}"`).join(", ")}]}
`;

let cluster: Cluster;
let agent: AgentNode;
const core = () => cluster.admin().makeApiClient(CoreV1Api);

beforeAll(async () => {
  cluster = await startCluster({ controllerManager: false });
  agent = await startAgentNode(cluster, { prefix: "osboot", secretName, start: false });
  await agent.node.writeFile("/opt/os-update/update", updateTool, 0o755);
  await agent.node.writeFile("/var/lib/os-update/runs", "");
  await agent.node.writeFile("/etc/systemd/system/os-update-activate.service", activateUnit);
  await agent.node.execOk(["systemctl", "daemon-reload"]);
  await agent.node.execOk(["systemctl", "enable", "os-update-activate.service"]);
  const first = await putOscSecret(cluster, secretName, osc("12"));
  // Enabled, as `trellis bootstrap` leaves it: systemd starts it at every boot.
  await agent.node.execOk(["systemctl", "enable", "--now", "--no-block", agentUnit]);
  await waitApplied(agent, first, 60_000);
}, 120_000);

afterAll(async () => {
  await agent?.node.stop();
  await cluster?.stop();
});

const osVersion = async () => /^PRETTY_NAME="Debian GNU\/Linux (\S+)/m.exec(await agent.node.readFile("/etc/os-release"))?.[1];
const runs = async () => (await agent.node.readFile("/var/lib/os-update/runs")).split("\n").filter(Boolean);
const oscCondition = (n: V1Node) => n.status?.conditions?.find((c) => c.type === "OperatingSystemConfigApplied");

/** Puts the OSC and waits until the agent holds it for machine-controller-manager, which then drains the node. */
async function updateInPlace(oscYaml: string): Promise<string> {
  const checksum = await putOscSecret(cluster, secretName, oscYaml);
  await waitFor("the condition InPlaceUpdatePending", async () => oscCondition(await readNode(agent))?.reason === "InPlaceUpdatePending", 60_000, 100);
  const condition = { type: "InPlaceUpdate", status: "True", reason: "ReadyForUpdate", message: "Node drain successful. Node is ready for update", lastTransitionTime: new Date() };
  await core().patchNodeStatus({ name: agent.name, body: { status: { conditions: [condition] } } }, setHeaderOptions("Content-Type", PatchStrategy.StrategicMergePatch));
  return checksum;
}

/** machine-controller-manager read the result: its condition, the label and the reason go. */
async function resultRead(): Promise<void> {
  const conditions = ((await readNode(agent)).status?.conditions ?? []).filter((c) => c.type !== "InPlaceUpdate");
  await core().patchNodeStatus({ name: agent.name, body: [{ op: "replace", path: "/status/conditions", value: conditions }] }, setHeaderOptions("Content-Type", PatchStrategy.JsonPatch));
  await core().patchNode({ name: agent.name, body: { metadata: { labels: { [resultLabel]: null }, annotations: { [failedReason]: null } } } }, setHeaderOptions("Content-Type", PatchStrategy.MergePatch));
}

/** Restarts the agent and waits until the new process logged `msg` with `text` in one of its fields (its decision). */
async function restartAgentUntil(msg: string, text: string): Promise<void> {
  const old = await mainPid(agent, agentUnit);
  await agent.node.execOk(["systemctl", "restart", agentUnit]);
  const pid = await mainPid(agent, agentUnit);
  expect(pid).not.toBe(old);
  await waitFor(`the restarted agent (pid ${pid}) to log "${msg}" with ${text}`, async () => {
    const out = await agent.node.execOk(["journalctl", "-u", agentUnit, "-o", "json", "--no-pager", `_PID=${pid}`, "--output-fields=MESSAGE"]);
    return out.split("\n").some((l) => l.includes(msg) && l.includes(text));
  }, 60_000, 200);
}

/** Every version of the Node from now on, and the transitions of a key in them. */
async function recordNode() {
  const rec = recordVersions<V1Node>(cluster.admin(), "/api/v1/nodes", agent.name);
  await waitFor("the Node watch's first event", () => rec.versions.length > 0, 10_000, 20);
  const value = (n: V1Node | undefined, key: string) => n?.metadata?.annotations?.[key] ?? n?.metadata?.labels?.[key];
  /** When `key` became `to`, each time it did. */
  const becomes = (key: string, to: string) => rec.versions.flatMap((v, i) => (value(v.object, key) === to && value(rec.versions[i - 1]?.object, key) !== to ? [v.at] : []));
  return { ...rec, becomes };
}

test("the update command restarts the machine: after the reboot the agent, started by systemd, finds the new version, reports update-result=successful and stamps the checksum once", async () => {
  const node = await recordNode();
  try {
    const [pid, agentPid] = [agent.node.pid, await mainPid(agent, agentUnit)];
    const checksum = await updateInPlace(osc("13"));
    // The agent runs the tool, which reboots the node: nothing else ends its systemd.
    const { endedAt } = await agent.node.bootAfterReboot(60_000);
    expect(agent.node.pid).not.toBe(pid);
    const after = await waitApplied(agent, checksum, 60_000, 100).catch(async (err) => {
      console.error((await agent.node.exec(["journalctl", "--no-pager", "-n", "80", "-u", agentUnit, "-u", "os-update-activate"])).stdout, JSON.stringify((await readNode(agent)).metadata, null, 1));
      throw err;
    });
    expect(await osVersion()).toBe("13");
    expect(await runs()).toEqual(["13"]);
    expect(await mainPid(agent, agentUnit)).not.toBe(agentPid);
    expect(after.metadata?.labels?.[resultLabel]).toBe("successful");
    expect(after.metadata?.annotations?.[updatingOs]).toBeUndefined();
    expect(after.metadata?.annotations?.[failedReason]).toBeUndefined();
    // Before the reboot the Node was marked with the version it goes to, and nothing was reported done.
    const before = node.versions.filter((v) => v.at < endedAt).map((v) => v.object);
    expect(before.some((n) => n.metadata?.annotations?.[updatingOs] === "13")).toBe(true);
    expect(before.every((n) => n.metadata?.annotations?.[checksumKey] !== checksum && n.metadata?.labels?.[resultLabel] === undefined)).toBe(true);
    // After it: the result and the checksum, once each.
    const [stamped, told] = [node.becomes(checksumKey, checksum), node.becomes(resultLabel, "successful")];
    expect({ stamped: stamped.length, told: told.length }).toEqual({ stamped: 1, told: 1 });
    expect(stamped[0]).toBeGreaterThan(endedAt);
    // The condition follows the checksum.
    await waitFor("the condition Applied", async () => oscCondition(await readNode(agent))?.reason === "Applied", 30_000, 100);
  } finally {
    node.stop();
  }
  await resultRead();
}, 180_000);

test("the command ran but did not restart the machine: the agent holds the update, a restart of the agent is no restart of the machine, and the machine's restart completes it", async () => {
  const checksum = await updateInPlace(osc("14", ["14", "--no-reboot"]));
  const pending = await waitFor("the condition InPlaceUpdateRestartPending", async () => {
    const c = oscCondition(await readNode(agent));
    return c?.reason === "InPlaceUpdateRestartPending" ? c : undefined;
  }, 60_000, 100);
  expect(pending.message).toContain("the OS update to 14 ran; the machine has not restarted into it yet");
  await restartAgentUntil("the in-place update waits", "the OS update to 14 ran; the machine has not restarted into it yet");
  expect(oscCondition(await readNode(agent))?.reason).toBe("InPlaceUpdateRestartPending");
  expect((await readNode(agent)).metadata?.labels?.[resultLabel]).toBeUndefined();
  expect(await runs()).toEqual(["13", "14"]);
  // An operator restarts the machine.
  await agent.node.exec(["systemctl", "reboot", "--no-block"]);
  await agent.node.bootAfterReboot(60_000);
  const after = await waitApplied(agent, checksum, 60_000, 100);
  expect(after.metadata?.labels?.[resultLabel]).toBe("successful");
  expect(await osVersion()).toBe("14");
  expect(await runs()).toEqual(["13", "14"]);
  await resultRead();
}, 180_000);

test("the machine comes back with the old version: rolled back, update-result=failed with gardener-node-agent's reason, a Warning, no checksum, and the command is not run again", async () => {
  const applied = (await readNode(agent)).metadata?.annotations?.[checksumKey];
  const checksum = await updateInPlace(osc("15", ["15", "--broken"]));
  await agent.node.bootAfterReboot(60_000);
  const failed = await waitFor("update-result=failed", async () => {
    const n = await readNode(agent);
    return n.metadata?.labels?.[resultLabel] === "failed" ? n : undefined;
  }, 60_000, 100);
  const reason = rolledBack("15", "14");
  expect(failed.metadata?.annotations?.[failedReason]).toBe(reason);
  expect(failed.metadata?.annotations?.[updatingOs]).toBe("15");
  await waitFor("an InPlaceUpdateFailed Warning", async () => (await nodeEvents(agent)).some((e) => e.reason === "InPlaceUpdateFailed" && e.message === reason), 30_000, 100);
  await waitFor("the condition InPlaceUpdateFailed", async () => oscCondition(await readNode(agent))?.reason === "InPlaceUpdateFailed", 30_000, 100);
  // Not tried again for this version: neither by this agent's later passes nor after a restart of it.
  await restartAgentUntil("the in-place update failed", "rolled back to the previous version");
  expect(await runs()).toEqual(["13", "14", "15"]);
  expect(await osVersion()).toBe("14");
  const after = await readNode(agent);
  expect(after.metadata?.annotations?.[checksumKey]).toBe(applied);
  expect(after.metadata?.annotations?.[checksumKey]).not.toBe(checksum);
  expect(after.metadata?.annotations?.[failedReason]).toBe(reason);
}, 180_000);

test("the OSC goes back to the version the machine runs: nothing is done in place and, as gardener-node-agent, update-result=successful with the failure's marks gone, the checksum stamped, the command not run again", async () => {
  // The pool's OSC for 14 as it is rendered now, not the bytes of the one the Node carries (gardener-node-agent
  // would not even reconcile that one).
  const checksum = await putOscSecret(cluster, secretName, osc("14"));
  const after = await waitApplied(agent, checksum, 60_000, 100);
  expect(after.metadata?.labels?.[resultLabel]).toBe("successful");
  expect(after.metadata?.annotations?.[failedReason]).toBeUndefined();
  expect(after.metadata?.annotations?.[updatingOs]).toBeUndefined();
  expect(await runs()).toEqual(["13", "14", "15"]);
  expect(await osVersion()).toBe("14");
  await waitFor("the condition Applied", async () => oscCondition(await readNode(agent))?.reason === "Applied", 30_000, 100);
  await resultRead();
}, 120_000);
