// Serial rollout across three real nodes: with the Secret annotated serial, an updated OSC is applied
// by one node at a time, each inside its own turn on the Lease named after the Secret: a node that lost
// its state too, and a node whose apply keeps failing holds the lease no longer than the hold limit.
import { afterAll, beforeAll, expect, test } from "bun:test";
import { CoordinationV1Api } from "@kubernetes/client-node";
import { stringify } from "yaml";
import { type AgentNode, nodeEvents, putOscSecret, readNode, startAgentNode, waitApplied } from "../harness/agent.ts";
import { waitFor } from "../harness/exec.ts";
import { forbiddenRequests, installAdmissionPolicy } from "../harness/admission-policy.ts";
import { type Cluster, startCluster } from "../harness/cluster.ts";

const secretName = "gardener-node-agent-serial";
const serial = { "reconciliation.osc.node-agent.gardener.cloud/serial": "true" };
// A restart of slow.service takes over a second, so each node holds the lease that long.
const osc = (version: number) =>
  stringify({
    apiVersion: "extensions.gardener.cloud/v1alpha1",
    kind: "OperatingSystemConfig",
    spec: {
      units: [
        {
          name: "slow.service",
          command: "start",
          content: "[Service]\nExecStartPre=/bin/sleep 1\nExecStart=/bin/sleep infinity\n[Install]\nWantedBy=multi-user.target\n",
          filePaths: ["/etc/slow/version"],
        },
      ],
      files: [{ path: "/etc/slow/version", permissions: 0o644, content: { inline: { encoding: "", data: `${version}\n` } } }],
    },
  });

let cluster: Cluster;
let nodes: AgentNode[] = [];

beforeAll(async () => {
  cluster = await startCluster({ controllerManager: false });
  await installAdmissionPolicy(cluster); // docs/admission-policy.yaml: the agent works within it
  nodes = await Promise.all(["sa", "sb", "sc"].map((prefix) => startAgentNode(cluster, { prefix, secretName })));
}, 120_000);
afterAll(async () => {
  await Promise.all(nodes.map((n) => n.node.stop()));
  await cluster?.stop();
});

/** Puts `version` and samples the Lease and the Nodes until every node applied it and the lease is free. */
async function rollOut(version: number) {
  const leases = cluster.admin().makeApiClient(CoordinationV1Api);
  const samples: { t: number; holder: string; applied: string[] }[] = [];
  const checksum = await putOscSecret(cluster, secretName, osc(version), serial);
  const t0 = Date.now();
  for (;;) {
    const [lease, ...states] = await Promise.all([
      leases.readNamespacedLease({ name: secretName, namespace: "kube-system" }).catch(() => undefined),
      ...nodes.map(readNode),
    ]);
    const applied = nodes.filter((_, i) => states[i]?.metadata?.annotations?.["checksum/cloud-config-data"] === checksum).map((n) => n.name);
    samples.push({ t: Date.now() - t0, holder: lease?.spec?.holderIdentity ?? "", applied });
    if (applied.length === nodes.length && !lease?.spec?.holderIdentity) break;
    if (Date.now() - t0 > 60_000) throw new Error(`rollout did not finish: ${JSON.stringify(samples.at(-1))}`);
    await Bun.sleep(25);
  }
  return samples;
}

/** Each node applied inside its own turn on the Lease, one at a time. */
function expectOneAtATime(samples: { t: number; holder: string; applied: string[] }[]) {
  // Turns: maximal runs of samples with the same non-empty holder.
  const turns: { holder: string; from: number; to: number }[] = [];
  for (const s of samples) {
    const last = turns.at(-1);
    if (s.holder && last?.holder === s.holder && last.to === samples.indexOf(s) - 1) last.to = samples.indexOf(s);
    else if (s.holder) turns.push({ holder: s.holder, from: samples.indexOf(s), to: samples.indexOf(s) });
  }
  expect(turns.map((t) => t.holder).sort()).toEqual(nodes.map((n) => n.name).sort()); // each node exactly one turn
  for (const n of nodes) {
    // A node's apply shows up during its turn or in the sample right after it.
    const appliedAt = samples.findIndex((s) => s.applied.includes(n.name));
    const turn = turns.find((t) => t.holder === n.name);
    expect({ node: n.name, appliedDuringTurn: turn !== undefined && appliedAt >= turn.from && appliedAt <= turn.to + 1 }).toEqual({ node: n.name, appliedDuringTurn: true });
  }
  // Nodes apply in the order of their turns, never two in the same window.
  const order = nodes.map((n) => ({ name: n.name, at: samples.findIndex((s) => s.applied.includes(n.name)) })).sort((a, b) => a.at - b.at);
  expect(order.map((o) => o.name)).toEqual(turns.map((t) => t.holder));
  expect(new Set(order.map((o) => o.at)).size).toBe(nodes.length);
  expect(samples.at(-1)?.t ?? 0).toBeGreaterThanOrEqual(3000); // three turns of at least a second each
}

test("fresh nodes take their turns for their first OSC too (as gardener-node-agent's do)", async () => {
  expectOneAtATime(await rollOut(1));
}, 120_000);

test("an updated OSC is applied one node at a time, each inside its turn on the Lease", async () => {
  expectOneAtATime(await rollOut(2));
}, 120_000);

test("a node that lost its state (as one taken over from gardener-node-agent) still waits its turn", async () => {
  const lost = nodes[2] as AgentNode;
  await lost.node.execOk(["systemctl", "stop", "gardener-node-agent.service"]);
  await lost.node.execOk(["rm", "-f", "/var/lib/gardener-node-agent/trellis/state.json"]);
  await lost.node.execOk(["systemctl", "start", "gardener-node-agent.service"]);
  expectOneAtATime(await rollOut(3));
}, 120_000);

const breakDropIn = "/etc/systemd/system/slow.service.d/99-broken.conf";

test("a node whose apply keeps failing gives the serial lease up after the hold limit, and says so", async () => {
  const broken = nodes[0] as AgentNode;
  // A local fault: a drop-in of someone else's makes slow.service fail to start on this node only, so its
  // apply (which restarts slow.service for the changed file) fails every time.
  await broken.node.writeFile(breakDropIn, "[Service]\nExecStartPre=/bin/false\n", 0o644);
  await broken.node.execOk(["systemctl", "daemon-reload"]);
  const checksum = await putOscSecret(cluster, secretName, osc(4), { ...serial, "rollout.trellis.dev/serial-hold-limit": "5s" });
  // Without the hold limit the broken node, once it has the lease, keeps it for as long as it fails.
  await Promise.all(nodes.slice(1).map((n) => waitApplied(n, checksum, 60_000)));
  const given = await waitFor("the broken node's SerialLeaseGivenUp event", async () => (await nodeEvents(broken)).find((e) => e.reason === "SerialLeaseGivenUp"), 60_000, 200);
  expect(given.type).toBe("Warning");
  expect(given.message).toStartWith(`${broken.name} held the serial lease kube-system/${secretName} for `);
  expect(given.message).toContain(`OSC ${checksum.slice(0, 12)}`);
  const metrics = await (await fetch(`http://127.0.0.1:${broken.metricsPort}/metrics`)).text();
  expect(Number(/^trellis_serial_lease_given_up_total (\d+)$/m.exec(metrics)?.[1] ?? 0)).toBeGreaterThanOrEqual(1);
  await broken.node.execOk(["rm", "-f", breakDropIn]);
  await broken.node.execOk(["systemctl", "daemon-reload"]);
}, 120_000);

test("the admission policy (and RBAC) refused none of the agents' requests", () => {
  for (const n of nodes) expect({ node: n.name, refused: forbiddenRequests(cluster, n.user) }).toEqual({ node: n.name, refused: [] });
});
