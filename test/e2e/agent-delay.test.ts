// The reconciliation delay on the compiled agent: measured from when the node first saw the OSC, on a
// clock a wall-clock jump does not move (libfaketime in the agent's process only: the host's clock is
// never touched, and the monotonic clocks stay real), kept across an agent restart, and applied to a node
// that lost its state (or was taken over from gardener-node-agent) as to any other.
import { afterAll, beforeAll, expect, test } from "bun:test";
import { CoordinationV1Api } from "@kubernetes/client-node";
import { stringify } from "yaml";
import { type AgentNode, nodeEvents, putOscSecret, startAgentNode, waitApplied } from "../harness/agent.ts";
import { type Cluster, startCluster } from "../harness/cluster.ts";
import { leaseName, leaseNamespace } from "../../src/controllers/lease.ts";
import { waitFor } from "../harness/exec.ts";

const secretName = "gardener-node-agent-delay";
const libfaketime = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";
const offsetFile = "/var/lib/test-faketime";
const delayStartFile = "/var/lib/gardener-node-agent/trellis/delay-start.json";
const delayAnnotation = "node-agent.gardener.cloud~1reconciliation-delay";
const osc = (version: number) =>
  stringify({
    apiVersion: "extensions.gardener.cloud/v1alpha1",
    kind: "OperatingSystemConfig",
    spec: { files: [{ path: "/etc/delay/version", permissions: 0o644, content: { inline: { encoding: "", data: `${version}\n` } } }] },
  });

let cluster: Cluster;
let agent: AgentNode;

/** The agent's wall clock offset from real time; libfaketime reads the file on every call. */
const setWallOffset = (seconds: number) => agent.node.execOk(["sh", "-c", `printf '+%s' '${seconds}' > ${offsetFile}.new && mv ${offsetFile}.new ${offsetFile}`]);
const setDelay = (value: string) => agent.core.patchNode({ name: agent.name, body: [{ op: "add", path: `/metadata/annotations/${delayAnnotation}`, value }] });
/** Resolves once the agent said it holds `checksum` back (it saw it first before that). */
const heldBack = (checksum: string) =>
  waitFor(
    `the agent to hold ${checksum.slice(0, 12)} back`,
    async () => (await agent.node.execOk(["journalctl", "-q", "-o", "cat", "-u", "gardener-node-agent.service"])).split("\n").some((l) => l.includes("holding the updated OSC back") && l.includes(checksum)),
    15_000,
    100,
  );
const restartAgent = () => agent.node.execOk(["systemctl", "restart", "gardener-node-agent.service"]);

beforeAll(async () => {
  cluster = await startCluster({ controllerManager: false });
  agent = await startAgentNode(cluster, { prefix: "dl", secretName, start: false });
  await setWallOffset(0);
  await agent.node.writeFile(
    "/etc/systemd/system/gardener-node-agent.service.d/50-faketime.conf",
    `[Service]\nEnvironment=LD_PRELOAD=${libfaketime} FAKETIME_TIMESTAMP_FILE=${offsetFile} FAKETIME_NO_CACHE=1 DONT_FAKE_MONOTONIC=1\n`,
    0o644,
  );
  await agent.node.execOk(["systemctl", "daemon-reload"]);
  await agent.node.execOk(["systemctl", "enable", "--now", "gardener-node-agent.service"]);
  await waitApplied(agent, await putOscSecret(cluster, secretName, osc(1)), 30_000);
}, 120_000);
afterAll(async () => {
  await agent?.node.stop();
  await cluster?.stop();
});

test("the delay counts from when the OSC was first seen: a wall-clock jump and an agent restart do not change it", async () => {
  const leases = cluster.admin().makeApiClient(CoordinationV1Api);
  await setDelay("30s");
  const t0 = Date.now();
  const checksum = await putOscSecret(cluster, secretName, osc(2));
  await heldBack(checksum);
  // The agent's wall clock jumps an hour ahead, and a changed delay makes it look again at once.
  await setWallOffset(3600);
  await setDelay("31s");
  // The proof that the agent runs on the jumped clock: the renewTime of its heartbeat Lease (every 10 s).
  await waitFor("the agent's Lease renewed with its clock an hour ahead", async () => {
    const lease = await leases.readNamespacedLease({ name: leaseName(agent.name), namespace: leaseNamespace });
    return Date.parse(String(lease.spec?.renewTime)) - Date.now() > 50 * 60_000;
  }, 20_000, 200);
  // Well into the wait, so that a wait started over from the restart is told apart.
  await Bun.sleep(Math.max(0, t0 + 8000 - Date.now()));
  expect(await agent.node.readFile("/etc/delay/version")).toBe("1\n");
  const restartedAt = Date.now();
  await restartAgent();
  await waitApplied(agent, checksum, 60_000);
  const elapsed = Date.now() - t0;
  console.log(`applied ${elapsed} ms after the Secret changed (delay 31 s, agent restarted after ${restartedAt - t0} ms)`);
  expect(elapsed).toBeGreaterThanOrEqual(30_500);
  expect(elapsed).toBeLessThan(38_000); // started over at the restart: ≥ 8 + 31 s
}, 90_000);

test("a node that lost its state (as one taken over from gardener-node-agent) still waits the delay", async () => {
  await setDelay("6s");
  await agent.node.execOk(["systemctl", "stop", "gardener-node-agent.service"]);
  await agent.node.execOk(["rm", "-f", "/var/lib/gardener-node-agent/trellis/state.json", delayStartFile]);
  await agent.node.execOk(["systemctl", "start", "gardener-node-agent.service"]);
  const t0 = Date.now();
  const checksum = await putOscSecret(cluster, secretName, osc(3));
  await waitApplied(agent, checksum, 30_000);
  expect(Date.now() - t0).toBeGreaterThanOrEqual(5_500);
  expect((await nodeEvents(agent)).filter((e) => e.type === "Warning").map((e) => `${e.reason}: ${e.message}`)).toEqual([]);
}, 60_000);
