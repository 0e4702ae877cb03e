// The compiled binary with NodeAgentConfiguration fields it cannot honour (docs/gardener-fields.md):
// `check-config` and `run` each refuse the file with one line naming the field, before anything is read
// from the API or written to the node; the fields it honours in part pass, and a key Gardener's type does
// not have is ignored, as gardener-node-agent ignores it, and named. (`bootstrap` reads the file the
// same way, first thing; it is not run here, on the host's own root.)
import { afterAll, describe, expect, test } from "bun:test";
import { Buffer } from "node:buffer";
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { trellisBinary } from "../harness/binary.ts";
import { run, runOk } from "../harness/exec.ts";
import { minimalAgentConfig } from "../fixtures/agent-config.ts";

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
    ["clientConnection.qps", "clientConnection: {qps: 20}\n"],
    ["clientConnection.contentType", "clientConnection: {contentType: application/vnd.kubernetes.protobuf}\n"],
    ["logFormat", "logFormat: text\n"],
    ["featureGates", "featureGates: {SomeGate: false}\n"],
    ["debugging.enableProfiling", "debugging: {enableProfiling: true}\n"],
  ])("refuses %s in check-config and run, naming it", async (field, extra) => {
    const dir = configDir(minimal + extra);
    const bin = await trellisBinary();
    for (const cmd of [["check-config"], ["run"]]) {
      const r = await run([bin, ...cmd, "--config-dir", dir], { timeoutMs: 30_000 });
      expect({ cmd: cmd[0], code: r.code }).toEqual({ cmd: cmd[0], code: 1 });
      expect(r.stderr).toContain(`${dir}/config.yaml: ${field}:`);
    }
    expect(readFileSync(`${dir}/config.yaml`, "utf8")).toBe(minimal + extra);
  }, 120_000);

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
