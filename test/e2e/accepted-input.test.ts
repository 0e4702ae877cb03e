// The accepted-input corpus (test/fixtures/accepted-input): OSCs gardener-node-agent applies and trellis
// once refused (fields a newer Gardener adds, anchors and merge keys, a megabyte of small keys, an entry
// a later one replaces, a drop-in systemd does not read), through the compiled binary. `trellis plan`
// notes what is not acted on as written; the agent on a real node applies each case — the Node gets its
// checksum, the node holds what gardener-node-agent would leave — and reports it: one OSCUnsupported
// Warning, the condition OperatingSystemConfigApplied True with a message naming it, the gauge
// trellis_osc_not_acted_on. The agent's configuration carries a key Gardener's type does not have: it
// starts, and says so.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { mkdirSync, writeFileSync } from "node:fs";
import type { CoreV1Event } from "@kubernetes/client-node";
import { type AcceptedCase, acceptedOscBytes, loadAcceptedCases } from "../harness/accepted-input.ts";
import { type AgentNode, nodeEvents, putOscSecret, readNode, startAgentNode, waitApplied } from "../harness/agent.ts";
import { trellisBinary } from "../harness/binary.ts";
import { type Cluster, startCluster } from "../harness/cluster.ts";
import { run, runDir, waitFor } from "../harness/exec.ts";

/** The agent's peak RSS after the megabyte OSCs (134 MB measured), as the bad-input corpus bounds it. */
const maxAgentRssMb = 200;
const secretName = "gardener-node-agent-worker-accepted";
const source = `Secret kube-system/${secretName}`;
const cases = loadAcceptedCases();
const base = runDir("accepted-input");
const root = `${base}/root`;

let cluster: Cluster;
let agent: AgentNode;

beforeAll(async () => {
  mkdirSync(root, { recursive: true });
  cluster = await startCluster({ controllerManager: false });
  agent = await startAgentNode(cluster, { prefix: "accin", secretName, controllers: "  futureController: {enabled: true}\n" });
}, 120_000);
afterAll(async () => {
  await agent?.node.stop();
  await cluster?.stop();
});

test("the corpus: distinct classes", () => {
  expect(new Set(cases.map((c) => c.class)).size).toBe(cases.length);
  expect(cases.length).toBeGreaterThanOrEqual(15);
});

describe("trellis plan notes what it does not act on as written", () => {
  test.each(cases.map((c) => [c.name, c] as [string, AcceptedCase]))("%s", async (_name, c) => {
    const file = `${base}/${c.name}.yaml`;
    writeFileSync(file, acceptedOscBytes(c));
    const r = await run([await trellisBinary(), "plan", "--root", root, "--osc", file, "--hostname", "corpus"], { timeoutMs: 30_000 });
    expect({ code: r.code, stderr: r.stderr }).toEqual({ code: 3, stderr: "" });
    expect(r.stdout.split("\n").filter((l) => l.startsWith("note: ") && l.includes(`${file}: ${c.report}`))).toHaveLength(1);
  });
});

describe("the agent applies every case as gardener-node-agent would, and reports what it does not act on", () => {
  test.each(cases.map((c) => [c.name, c] as [string, AcceptedCase]))("%s", async (_name, c) => {
    const earlier = new Map((await nodeEvents(agent)).map((e) => [e.metadata?.uid, e.count ?? 1]));
    const recordedNow = (e: CoreV1Event) => (earlier.get(e.metadata?.uid) ?? 0) < (e.count ?? 1);
    const checksum = await putOscSecret(cluster, secretName, acceptedOscBytes(c));
    await waitApplied(agent, checksum, 60_000);
    for (const [path, content] of Object.entries(c.files)) expect({ path, content: await agent.node.readFile(path) }).toEqual({ path, content });
    const warning = await waitFor(
      `an OSCUnsupported Warning naming ${c.report}`,
      async () => (await nodeEvents(agent)).find((e) => e.reason === "OSCUnsupported" && recordedNow(e) && e.message?.includes(`${source}: ${c.report}`)),
      10_000,
    );
    expect(warning.type).toBe("Warning");
    expect(warning.message).toStartWith(`OSC ${checksum.slice(0, 12)} is applied, but `);
    const condition = await waitFor("the condition naming it", async () => {
      const cond = (await readNode(agent)).status?.conditions?.find((x) => x.type === "OperatingSystemConfigApplied");
      return cond?.message?.startsWith(`OSC ${checksum.slice(0, 12)} is applied; `) ? cond : undefined;
    }, 10_000);
    expect(condition).toMatchObject({ status: "True", reason: "Applied" });
    expect(condition.message).toContain(`${source}: ${c.report}`);
    const metrics = await (await fetch(`http://127.0.0.1:${agent.metricsPort}/metrics`)).text();
    expect(Number(/^trellis_osc_not_acted_on (\d+)$/m.exec(metrics)?.[1])).toBeGreaterThan(0);
  });

  test("the agent's peak RSS, after the megabyte OSCs, stays bounded", async () => {
    const pid = (await agent.node.execOk(["systemctl", "show", "-p", "MainPID", "--value", "gardener-node-agent"])).trim();
    const peakMb = Number(/^VmHWM:\s+(\d+) kB/m.exec(await agent.node.execOk(["cat", `/proc/${pid}/status`]))?.[1]) / 1024;
    console.log(`accepted-input agent: peak RSS ${peakMb.toFixed(0)} MB`);
    expect(peakMb).toBeLessThan(maxAgentRssMb);
  });

  test("a field of the agent's configuration that Gardener's type does not have: the agent runs, and says which", async () => {
    const journal = await agent.node.execOk(["journalctl", "-u", "gardener-node-agent", "-o", "cat"]);
    const warned = journal.split("\n").flatMap((l) => (l.startsWith("{") ? [JSON.parse(l) as { msg: string; field?: string }] : [])).filter((l) => l.msg === "configuration field not acted on");
    // Once per start of the agent.
    expect(warned.length).toBeGreaterThan(0);
    for (const l of warned) expect(l.field).toContain("config.yaml: controllers.futureController: not a field of Gardener v1.150's NodeAgentConfiguration; ignored, as gardener-node-agent ignores it");
  });
});
