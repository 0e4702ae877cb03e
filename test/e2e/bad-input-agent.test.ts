// The bad-input corpus (test/fixtures/bad-input) through the compiled agent on one real node: a last
// good OSC applied, then every case put as the OSC Secret in turn. Each one: a Warning event naming the
// Secret and the field, the Node condition saying the OSC is not applied, the log line; the node's
// files (all of /etc, /opt/bin and the agent's state directory, hashed inside the node, mtimes
// included) identical to the last good state, and no unit restarted. At the end the agent's peak RSS is
// bounded and the last good OSC is still what the node runs.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { Buffer } from "node:buffer";
import { readFileSync } from "node:fs";
import { CoreV1Api, type CoreV1Event } from "@kubernetes/client-node";
import { parse, stringify } from "yaml";
import { type AgentNode, mainPid, nodeEvents, putOscSecret, readNode, startAgentNode, waitApplied } from "../harness/agent.ts";
import { type BadCase, type CaseSecret, type CaseVars, caseOscBytes, caseSecret, loadBadCases, pushBadInputImages } from "../harness/bad-input.ts";
import { type Cluster, startCluster } from "../harness/cluster.ts";
import { runDir, waitFor } from "../harness/exec.ts";
import { type Registry, startRegistry } from "../harness/registry.ts";

/** Bounds: each case is reported within this long (an image case pulls first); the agent's peak RSS. */
const maxSecondsPerCase = 20;
const maxAgentRssMb = 200;

const secretName = "gardener-node-agent-worker-bad-input";
const source = `Secret kube-system/${secretName}`;
const units = ["web.service", "ticker.service", "gardener-node-agent.service"];
// The web fixture, with a web service that listens nowhere: the host's port 8089 may be another suite's.
const fixture = parse(readFileSync(new URL("../fixtures/web-osc.yaml", import.meta.url), "utf8"), { version: "1.1" });
fixture.spec.units[0].content = "[Unit]\nDescription=web stand-in\n[Service]\nExecStart=/bin/sleep infinity\n[Install]\nWantedBy=multi-user.target\n";
const goodOsc = stringify(fixture);
const cases = loadBadCases().filter((c) => c.only !== "plan");

let cluster: Cluster;
let registry: Registry;
let agent: AgentNode;
let core: CoreV1Api;
let vars: CaseVars;
let baseline: string;
let pids: number[];
const measured: { name: string; seconds: number }[] = [];

/** Every path under the trees trellis writes to, with type, mode, owner, size, mtime and content hash. */
const hashScript = `set -e
dirs="/etc /opt/bin /var/lib/gardener-node-agent"
find $dirs -xdev -printf '%p %y %m %U:%G %s %T@ %l\\n' | LC_ALL=C sort
find $dirs -xdev -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum`;
const nodeHash = async () => agent.node.execOk(["sh", "-c", hashScript]);

async function putSecret(s: CaseSecret): Promise<void> {
  const body = { metadata: { name: secretName, namespace: "kube-system", annotations: s.annotations }, data: s.data };
  await core.replaceNamespacedSecret({ name: secretName, namespace: "kube-system", body });
}

const journalCursor = async () => (await agent.node.execOk(["journalctl", "-u", "gardener-node-agent", "-n", "0", "--show-cursor", "-q"])).replace(/^-- cursor: /, "").trim();

beforeAll(async () => {
  cluster = await startCluster({ controllerManager: false });
  registry = await startRegistry();
  await pushBadInputImages(registry, runDir("bad-input-images"));
  vars = { registry: registry.host };
  agent = await startAgentNode(cluster, { prefix: "badin", secretName, secretRefs: ["corpus-missing", "corpus-ref"] });
  core = cluster.admin().makeApiClient(CoreV1Api);
  await core.createNamespacedSecret({ namespace: "kube-system", body: { metadata: { name: "corpus-ref" }, data: { present: Buffer.from("x").toString("base64") } } });
  await waitApplied(agent, await putOscSecret(cluster, secretName, goodOsc));
  await waitFor("the units of the last good OSC active", async () => (await agent.node.exec(["systemctl", "is-active", ...units])).stdout === "active\nactive\nactive\n");
  baseline = await nodeHash();
  pids = await Promise.all(units.map((u) => mainPid(agent, u)));
}, 120_000);
afterAll(async () => {
  await agent?.node.stop();
  await registry?.stop();
  await cluster?.stop();
  const slowest = measured.reduce((a, b) => (b.seconds > a.seconds ? b : a), measured[0] ?? { name: "-", seconds: 0 });
  if (measured.length > 0) console.log(`bad-input agent: ${measured.length} cases, slowest ${slowest.name} ${slowest.seconds.toFixed(2)} s, total ${measured.reduce((n, m) => n + m.seconds, 0).toFixed(1)} s`);
});

describe("the agent refuses every bad input and keeps the last good state", () => {
  test.each(cases.map((c) => [c.name, c] as [string, BadCase]))("%s", async (_name, c) => {
    const cursor = await journalCursor();
    // Earlier cases' Warnings stay: only one recorded for this case counts (a new one, or a repeat of
    // the same message, which the recorder counts on the event already there).
    const earlier = new Map((await nodeEvents(agent)).map((e) => [e.metadata?.uid, e.count ?? 1]));
    const recordedNow = (e: CoreV1Event) => (earlier.get(e.metadata?.uid) ?? 0) < (e.count ?? 1);
    const started = performance.now();
    if (c.form === "osc") await putOscSecret(cluster, secretName, caseOscBytes(c, vars));
    else await putSecret(caseSecret(c, vars));
    const names = (text: string | undefined) => text !== undefined && text.includes(source) && text.includes(c.field) && (!c.error || c.error.test(text));
    const warning = await waitFor(`an OSCInvalid Warning naming ${c.field}`, async () => (await nodeEvents(agent)).find((e) => e.reason === "OSCInvalid" && recordedNow(e) && names(e.message)), maxSecondsPerCase * 1000);
    measured.push({ name: c.name, seconds: (performance.now() - started) / 1000 });
    expect(warning.type).toBe("Warning");
    const firstError = (warning.message ?? "").split("\n")[0]?.slice(0, 200) ?? "";
    const condition = await waitFor("the condition saying the OSC is invalid", async () => {
      const cond = (await readNode(agent)).status?.conditions?.find((x) => x.type === "OperatingSystemConfigApplied");
      return cond?.status === "False" && names(cond.message) && cond.message?.includes(firstError) ? cond : undefined;
    }, 5_000);
    expect(condition.reason).toBe("Invalid");
    const journal = await agent.node.execOk(["journalctl", "-u", "gardener-node-agent", `--after-cursor=${cursor}`, "-o", "cat"]);
    const logged = journal.split("\n").flatMap((line) => (line.startsWith("{") ? [JSON.parse(line) as { msg: string; errors?: string[] }] : []));
    expect(logged.some((l) => l.msg === "the OSC is invalid; nothing was changed on the node" && names(l.errors?.join("\n")))).toBe(true);
    expect(await nodeHash()).toBe(baseline);
    expect(await Promise.all(units.map((u) => mainPid(agent, u)))).toEqual(pids);
  });

  test("afterwards: the node still runs the last good OSC, units never restarted, the agent's peak RSS bounded", async () => {
    const good = await putOscSecret(cluster, secretName, goodOsc);
    await waitApplied(agent, good);
    await waitFor("the condition back to True", async () => (await readNode(agent)).status?.conditions?.find((x) => x.type === "OperatingSystemConfigApplied")?.status === "True");
    expect(await Promise.all(units.map((u) => mainPid(agent, u)))).toEqual(pids);
    const status = await agent.node.execOk(["cat", `/proc/${pids[2]}/status`]);
    const peakMb = Number(/^VmHWM:\s+(\d+) kB/m.exec(status)?.[1]) / 1024;
    console.log(`bad-input agent: peak RSS ${peakMb.toFixed(0)} MB`);
    expect(peakMb).toBeLessThan(maxAgentRssMb);
  });
});
