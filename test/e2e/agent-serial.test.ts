// Serial rollout across three real nodes: with the Secret annotated serial, an updated OSC is applied
// by one node at a time, each inside its own turn on the Lease named after the Secret: a node that lost
// its state too, and a node whose apply keeps failing holds the lease no longer than the hold limit.
import { afterAll, beforeAll, expect, test } from "bun:test";
import { CoordinationV1Api } from "@kubernetes/client-node";
import { stringify } from "yaml";
import { type AgentNode, mainPid, nodeEvents, putOscSecret, readNode, startAgentNode, waitApplied } from "../harness/agent.ts";
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

// Under /run, not /etc: a changed unit the OSC gives no drop-ins loses its whole /etc/systemd/system/<unit>.d
// (as with gardener-node-agent), and with it a fault put there.
const breakDropIn = "/run/systemd/system/slow.service.d/99-broken.conf";

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

test("in a crash loop too: the hold limit counts across the broken agent's restarts, it gives the lease up, and its cool-off survives a restart", async () => {
  const [broken, ...others] = nodes as [AgentNode, ...AgentNode[]];
  const unit = "gardener-node-agent.service";
  const leases = cluster.admin().makeApiClient(CoordinationV1Api);
  const holder = async () => (await leases.readNamespacedLease({ name: secretName, namespace: "kube-system" }).catch(() => undefined))?.spec?.holderIdentity ?? "";
  let checksum = "";
  /** The agent's log messages about this test's OSC, of process `pid`. */
  const said = async (pid: number) =>
    (await broken.node.execOk(["journalctl", "-u", unit, "-o", "cat", "--no-pager", `_PID=${pid}`]))
      .split("\n")
      .filter((l) => l.startsWith("{"))
      .map((l) => JSON.parse(l) as { msg: string; checksum?: string })
      .filter((l) => l.checksum === checksum)
      .map((l) => l.msg);
  const newPid = (old: number) => waitFor("the agent started again", async () => ((await mainPid(broken, unit)) || old) !== old ? mainPid(broken, unit) : undefined, 30_000, 50);
  // The others wait, stopped, until the broken node holds the lease: it goes first, and would block them.
  await Promise.all(others.map((n) => n.node.execOk(["systemctl", "stop", unit])));
  await broken.node.writeFile(breakDropIn, "[Service]\nExecStartPre=/bin/false\n", 0o644);
  // The test's crash loop (RestartSec=1) is faster than systemd's default start rate limit allows.
  await broken.node.writeFile(`/run/systemd/system/${unit}.d/no-start-limit.conf`, "[Unit]\nStartLimitIntervalSec=0\n", 0o644);
  await broken.node.execOk(["systemctl", "daemon-reload"]);
  const limitS = 6;
  checksum = await putOscSecret(cluster, secretName, osc(5), { ...serial, "rollout.trellis.dev/serial-hold-limit": `${limitS}s` });
  await waitFor("the broken node holding the lease", async () => (await holder()) === broken.name, 30_000, 50);
  await Promise.all(others.map((n) => n.node.execOk(["systemctl", "start", "--no-block", unit])));

  // Every failed apply ends in a crash: each process sees at most one failure, far less than the limit.
  const givenUp = async () => (await nodeEvents(broken)).find((e) => e.reason === "SerialLeaseGivenUp" && e.message?.includes(`OSC ${checksum.slice(0, 12)}`));
  let pid = await mainPid(broken, unit);
  let crashes = 0;
  for (;;) {
    const failed = await waitFor("a failed apply, or the lease given up", async () => ((await said(pid)).includes("OSC apply incomplete") ? "failed" : (await givenUp()) ? "given up" : undefined), 60_000, 50);
    if (failed === "given up" || (await said(pid)).some((m) => m.startsWith("gave up the serial lease"))) break;
    // An agent that starts its hold over at every start never reaches the limit: the loop would not end.
    if (crashes === 12) throw new Error(`the lease was not given up after ${crashes} crashes, ${limitS} s hold limit`);
    await broken.node.execOk(["systemctl", "kill", "-s", "KILL", unit]);
    crashes++;
    pid = await newPid(pid);
  }
  // Crashed once more right after giving it up (well within the cool-off, as long as the limit): the new
  // process keeps to the cool-off instead of asking for the lease again.
  await broken.node.execOk(["systemctl", "kill", "-s", "KILL", unit]);
  const after = await newPid(pid);
  await waitFor("the restarted agent keeping to the cool-off", async () => (await said(after)).includes("gave up the serial lease for this OSC: letting the waiting nodes go first"), 30_000, 100);

  const given = await waitFor("the SerialLeaseGivenUp event", givenUp, 30_000, 100);
  console.log(`[agent-serial] crash loop: ${crashes} crashes before the lease was given up: ${given.message}`);
  expect(crashes).toBeGreaterThanOrEqual(2);
  const heldS = Number(/held the serial lease \S+ for (\d+(?:\.\d+)?)s/.exec(given.message ?? "")?.[1]);
  expect(heldS).toBeGreaterThanOrEqual(limitS);
  // Each process saw one failure: a count of two or more was carried across restarts. A kill that lands
  // between the "OSC apply incomplete" line the loop waits for and the hold's save loses that one failure.
  const attempts = Number(/failed (\d+) apply attempt/.exec(given.message ?? "")?.[1]);
  expect(attempts).toBeGreaterThanOrEqual(2);
  expect(attempts).toBeLessThanOrEqual(crashes + 1);
  await Promise.all(others.map((n) => waitApplied(n, checksum, 60_000)));

  await broken.node.execOk(["rm", "-f", breakDropIn, `/run/systemd/system/${unit}.d/no-start-limit.conf`]);
  await broken.node.execOk(["systemctl", "daemon-reload"]);
}, 180_000);

test("the admission policy (and RBAC) refused none of the agents' requests", () => {
  for (const n of nodes) expect({ node: n.name, refused: forbiddenRequests(cluster, n.user) }).toEqual({ node: n.name, refused: [] });
});
