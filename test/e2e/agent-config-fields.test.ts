// The compiled binary with NodeAgentConfiguration values (docs/gardener-fields.md). What gardener-node-agent
// refuses too, `check-config` and `run` each refuse with one line naming the field, before anything is read
// from the API or written to the node. What it accepts, trellis accepts: the agent on a real node starts
// with it and acts on it (a client-side rate limit, text logs), or says in its journal, at every start,
// which value it does not act on (protobuf, profiling); a key Gardener's type does not have is ignored,
// as gardener-node-agent ignores it, and named. (`bootstrap` reads the file the same way, first thing;
// it is not run here, on the host's own root.)
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { Buffer } from "node:buffer";
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { agentUnit } from "../../src/api/agent-unit.ts";
import { type AgentNode, putOscSecret, startAgentNode, waitApplied } from "../harness/agent.ts";
import { trellisBinary } from "../harness/binary.ts";
import { type Cluster, startCluster } from "../harness/cluster.ts";
import { run, runOk, waitFor } from "../harness/exec.ts";
import { minimalAgentConfig } from "../fixtures/agent-config.ts";
import { oneFileOsc } from "../fixtures/one-file-osc.ts";

const base = mkdtempSync("/tmp/trellis-config-fields-");
afterAll(() => rmSync(base, { recursive: true, force: true }));

const minimal = minimalAgentConfig;
let dirs = 0;
const configDir = (text: string) => {
  const dir = `${base}/${++dirs}`;
  mkdirSync(dir);
  writeFileSync(`${dir}/config.yaml`, text);
  return dir;
};

describe("the compiled binary", () => {
  test.each([
    ["featureGates", "featureGates: {SomeGate: false}\n"],
    ["clientConnection.burst", "clientConnection: {burst: -1}\n"],
    ["logFormat", "logFormat: yaml\n"],
  ])("refuses %s in check-config and run, naming it, as gardener-node-agent refuses it", async (field, extra) => {
    const dir = configDir(minimal + extra);
    const bin = await trellisBinary();
    for (const cmd of [["check-config"], ["run"]]) {
      const r = await run([bin, ...cmd, "--config-dir", dir], { timeoutMs: 30_000 });
      expect({ cmd: cmd[0], code: r.code }).toEqual({ cmd: cmd[0], code: 1 });
      expect(r.stderr).toContain(`${dir}/config.yaml: ${field}:`);
    }
    expect(readFileSync(`${dir}/config.yaml`, "utf8")).toBe(minimal + extra);
  }, 120_000);

  test.each([
    ["clientConnection: {qps: 20, burst: 130}\n", []],
    ["logFormat: text\n", []],
    ["clientConnection: {contentType: application/vnd.kubernetes.protobuf}\n", ["clientConnection.contentType: application/vnd.kubernetes.protobuf: not acted on"]],
    ["debugging: {enableProfiling: true}\n", ["debugging.enableProfiling: true: not acted on"]],
  ])("check-config accepts %p, as gardener-node-agent does, and notes what is not acted on", async (extra, notes) => {
    const dir = configDir(minimal + extra);
    const out = await runOk([await trellisBinary(), "check-config", "--config-dir", dir]);
    expect(out).toContain("is valid");
    expect(out.split("\n").filter((l) => l.startsWith("note: "))).toEqual(notes.map((n) => expect.stringContaining(`note: ${dir}/config.yaml: ${n}`)));
  }, 60_000);

  test("check-config accepts a key Gardener's type does not have, as gardener-node-agent does, and names it", async () => {
    const dir = configDir(`${minimal}spec: {}\n`);
    const out = await runOk([await trellisBinary(), "check-config", "--config-dir", dir]);
    expect(out).toContain("is valid");
    expect(out).toContain(`note: ${dir}/config.yaml: spec: not a field of Gardener v1.150's NodeAgentConfiguration; ignored, as gardener-node-agent ignores it`);
  }, 60_000);

  test("check-config accepts Gardener's zero values and an older Gardener's caBundle", async () => {
    const pem = readFileSync("/etc/ssl/certs/ca-certificates.crt", "utf8").split("-----END CERTIFICATE-----")[0] + "-----END CERTIFICATE-----\n";
    const dir = configDir(`${minimal}clientConnection: {qps: 0, burst: 0, contentType: "", acceptContentTypes: ""}\nlogFormat: ""\napiServer: {server: "https://api:443", caBundle: ${Buffer.from(pem).toString("base64")}}\n`);
    expect(await runOk([await trellisBinary(), "check-config", "--config-dir", dir])).toContain("is valid");
  }, 60_000);
});

describe("the agent on a node, with every such value gardener-node-agent accepts", () => {
  const secretName = "gardener-node-agent-config-fields";
  // Slow enough that the agent's first requests cannot come sooner than the limit lets them.
  const qps = 2;
  let cluster: Cluster;
  let agent: AgentNode;
  beforeAll(async () => {
    cluster = await startCluster({ controllerManager: false });
    agent = await startAgentNode(cluster, {
      prefix: "cfgfields",
      secretName,
      config: `clientConnection: {qps: ${qps}, burst: 1, contentType: application/vnd.kubernetes.protobuf, acceptContentTypes: "application/vnd.kubernetes.protobuf,application/json"}
logFormat: text
debugging: {enableProfiling: true, enableContentionProfiling: true}
`,
    });
  }, 180_000);
  afterAll(async () => {
    await agent?.node.stop();
    await cluster?.stop();
  });

  test("it starts, applies an OSC, and its journal names each value it does not act on, in text lines", async () => {
    await waitApplied(agent, await putOscSecret(cluster, secretName, oneFileOsc("fields", "/etc/config-fields/ok", "ok\n")), 90_000);
    expect(await agent.node.readFile("/etc/config-fields/ok")).toBe("ok\n");
    const fields = ["clientConnection.contentType", "clientConnection.acceptContentTypes", "debugging.enableProfiling", "debugging.enableContentionProfiling"];
    const warnings = await waitFor("the agent's warnings naming each field", async () => {
      const journal = await agent.node.execOk(["journalctl", "-u", agentUnit, "-o", "cat", "--no-pager"]);
      const lines = journal.split("\n").filter((l) => l.includes("\tWARN\tconfiguration field not acted on\t"));
      return fields.every((f) => lines.some((l) => l.includes(`config.yaml: ${f}: `))) ? lines : undefined;
    }, 30_000);
    // zap's console format, as gardener-node-agent's text logs: time, level, message, the fields as JSON.
    for (const l of warnings) expect(JSON.parse(l.split("\t")[3] as string)).toMatchObject({ field: expect.stringContaining(": not acted on: ") });
    const journal = await agent.node.execOk(["journalctl", "-u", agentUnit, "-o", "cat", "--no-pager"]);
    expect(journal).toMatch(/^\d{4}-\d\d-\d\dT[\d:.]+Z\tINFO\ttrellis starting\t\{/m);
    expect(journal.split("\n").filter((l) => l.startsWith("{"))).toEqual([]);
    const metrics = await (await fetch(`http://127.0.0.1:${agent.metricsPort}/metrics`)).text();
    expect(metrics).toMatch(/^trellis_config_not_acted_on 4$/m);
  }, 120_000);

  test("its requests keep clientConnection's rate limit: after the first, one per 1/qps second at most", async () => {
    const received = await waitFor("8 of the agent's requests in the audit log", () => {
      const times = new Map<string, number>();
      for (const line of readFileSync(cluster.auditLog, "utf8").split("\n")) {
        if (!line.startsWith("{")) continue;
        const e = JSON.parse(line) as { auditID: string; user: { username: string }; requestReceivedTimestamp: string };
        if (e.user.username === agent.user) times.set(e.auditID, Date.parse(e.requestReceivedTimestamp));
      }
      const sorted = [...times.values()].sort((a, b) => a - b);
      return sorted.length >= 8 ? sorted : undefined;
    }, 60_000);
    // A lower bound only (a request is sent no sooner than its token is there); the first request's own
    // TLS handshake may delay its arrival by up to the slack.
    const slackMs = 400;
    const first = received[0] as number;
    const tooEarly = received.flatMap((t, k) => (t - first < (k * 1000) / qps - slackMs ? [{ request: k, msAfterFirst: t - first }] : []));
    expect(tooEarly).toEqual([]);
  }, 90_000);
});
