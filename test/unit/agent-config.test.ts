import { afterAll, describe, expect, test } from "bun:test";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { basename } from "node:path";
import { configFileIn } from "../../src/cli/agent-config.ts";
import { version } from "../../src/version.ts";
import { apiServerCa, parseAgentConfig } from "../../src/api/agent-config.ts";
import { formatDuration, formatElapsed, parseGoDuration } from "../../src/api/duration.ts";
import { minimalAgentConfig } from "../fixtures/agent-config.ts";

const minimal = minimalAgentConfig;

const pem = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";

describe("Go durations", () => {
  test.each([
    ["10m", 600_000],
    ["1h30m", 5_400_000],
    ["2m30s", 150_000],
    ["500ms", 500],
    ["1.5s", 1500],
    ["0", 0],
    ["-1s", -1000],
  ])("%s = %d ms", (text, ms) => expect(parseGoDuration(text)).toBe(ms));
  test.each(["", "10", "5 minutes", "1d", "m", "1h-5m"])("%p is not a duration", (text) => expect(parseGoDuration(text)).toBeUndefined());
  test.each([[3_600_000, "1h"], [90_000, "90s"], [600_000, "10m"], [250, "250ms"]])("%d ms prints as %s", (ms, text) => expect(formatDuration(ms)).toBe(text));
  test.each([[0, "0ms"], [350, "350ms"], [1999, "1s"], [65_400, "1m5s"], [60_000, "1m0s"], [7_203_000, "2h0m3s"]])("%d ms elapsed prints as %s", (ms, text) =>
    expect(formatElapsed(ms)).toBe(text),
  );
});

describe("NodeAgentConfiguration", () => {
  test("a minimal config gets Gardener's defaults", () => {
    const r = parseAgentConfig(minimal, "config.yaml");
    if (!r.ok) throw new Error(r.errors.join("\n"));
    expect(r.config.logLevel).toBe("info");
    expect(r.config.logFormat).toBe("json");
    expect(r.config.server.healthProbes.port).toBe(2751);
    expect(r.config.server.metrics.port).toBe(2752);
    expect(r.config.controllers.operatingSystemConfig.syncPeriod).toBe(600_000);
    expect(r.config.controllers.token.syncPeriod).toBe(3_600_000);
    expect(r.config.controllers.systemdUnitCheck).toEqual({ syncPeriod: 60_000, stuckThreshold: 300_000 });
    expect(r.config.clientConnection).toMatchObject({ kubeconfig: "", qps: 50, burst: 100 });
    // trellis's own block, which Gardener never writes: gardener-node-agent's hard-coded values.
    expect(r.config.controllers.healthCheck).toEqual({
      syncPeriod: 30_000,
      kubeletFailureThreshold: 60_000,
      containerdFailureThreshold: 60_000,
      readinessFlaps: 5,
      readinessFlapWindow: 600_000,
    });
  });

  test("trellis's healthCheck block can be set", () => {
    const r = parseAgentConfig(minimal + "  healthCheck: {syncPeriod: 10s, kubeletFailureThreshold: 2m, readinessFlaps: 3, readinessFlapWindow: 5m}\n", "config.yaml");
    if (!r.ok) throw new Error(r.errors.join("\n"));
    expect(r.config.controllers.healthCheck).toEqual({
      syncPeriod: 10_000,
      kubeletFailureThreshold: 120_000,
      containerdFailureThreshold: 60_000,
      readinessFlaps: 3,
      readinessFlapWindow: 300_000,
    });
  });

  test("trellis's drift block: repair by default, report only or off on request", () => {
    const defaults = parseAgentConfig(minimal, "config.yaml");
    if (!defaults.ok) throw new Error(defaults.errors.join("\n"));
    expect(defaults.config.controllers.drift).toEqual({ mode: "repair", debounce: 200, recurringRepairs: 3, recurringWindow: 600_000 });
    const r = parseAgentConfig(minimal + "  drift: {mode: report, debounce: 50ms, recurringRepairs: 5, recurringWindow: 1m}\n", "config.yaml");
    if (!r.ok) throw new Error(r.errors.join("\n"));
    expect(r.config.controllers.drift).toEqual({ mode: "report", debounce: 50, recurringRepairs: 5, recurringWindow: 60_000 });
  });

  test("a full Gardener-written config is read", () => {
    const r = parseAgentConfig(
      `apiVersion: nodeagent.config.gardener.cloud/v1alpha1
kind: NodeAgentConfiguration
clientConnection: {kubeconfig: /var/lib/gardener-node-agent/credentials/kubeconfig, qps: 0, burst: 0, acceptContentTypes: "", contentType: ""}
logLevel: debug
logFormat: json
server: {healthProbes: {port: 0}, metrics: {bindAddress: 127.0.0.1, port: 9999}}
apiServer: {server: "https://api.example:443", caFile: /var/lib/gardener-node-agent/cluster-ca.crt}
bootstrap: {}
debugging: {enableProfiling: false}
controllers:
  operatingSystemConfig: {secretName: osc, kubernetesVersion: v1.34.2, syncPeriod: 1m30s}
  token:
    syncPeriod: 30m
    syncConfigs:
    - {secretName: gardener-valitail, path: /var/lib/valitail/auth-token}
  systemdUnitCheck: {syncPeriod: 30s, stuckThreshold: 2m}
`,
      "config.yaml",
    );
    if (!r.ok) throw new Error(r.errors.join("\n"));
    expect(r.config.server.healthProbes.port).toBe(2751);
    expect(r.config.server.metrics).toEqual({ bindAddress: "127.0.0.1", port: 9999 });
    expect(r.config.controllers.operatingSystemConfig.kubernetesVersion).toBe("1.34.2");
    expect(r.config.controllers.operatingSystemConfig.syncPeriod).toBe(90_000);
    expect(r.config.controllers.token.syncConfigs).toEqual([{ secretName: "gardener-valitail", path: "/var/lib/valitail/auth-token" }]);
    expect(r.config.apiServer.server).toBe("https://api.example:443");
  });

  test.each([
    ["missing secretName", minimal.replace("    secretName: gardener-node-agent-worker-abc\n", ""), "controllers.operatingSystemConfig.secretName"],
    ["bad kubernetesVersion", minimal.replace("1.35.4", "latest"), 'controllers.operatingSystemConfig.kubernetesVersion: not a version like "1.35.4": "latest"'],
    ["syncPeriod below 15s", minimal + "    syncPeriod: 5s\n", "controllers.operatingSystemConfig.syncPeriod: must be at least 15s"],
    ["syncPeriod not a duration", minimal + "    syncPeriod: soon\n", 'controllers.operatingSystemConfig.syncPeriod: not a duration like "10m" or "1h30m": "soon"'],
    ["stuckThreshold below 30s", minimal + "  systemdUnitCheck: {stuckThreshold: 10s}\n", "controllers.systemdUnitCheck.stuckThreshold: must be at least 30s"],
    ["healthCheck syncPeriod below 1s", minimal + "  healthCheck: {syncPeriod: 100ms}\n", "controllers.healthCheck.syncPeriod: must be at least 1s"],
    ["readinessFlaps below 2", minimal + "  healthCheck: {readinessFlaps: 1}\n", "controllers.healthCheck.readinessFlaps:"],
    ["unknown drift mode", minimal + "  drift: {mode: ignore}\n", "controllers.drift.mode:"],
    ["drift mode off (YAML 1.1's false)", minimal + "  drift: {mode: off}\n", "controllers.drift.mode:"],
    ["recurringRepairs below 2", minimal + "  drift: {recurringRepairs: 1}\n", "controllers.drift.recurringRepairs:"],
    ["duplicate token paths", minimal + "  token:\n    syncConfigs: [{secretName: a, path: /t}, {secretName: b, path: /t}]\n", "controllers.token.syncConfigs: paths must be unique"],
    ["unknown logLevel", minimal + "logLevel: verbose\n", "logLevel:"],
    ["wrong kind", minimal.replace("kind: NodeAgentConfiguration", "kind: Pod"), "kind:"],
    ["port out of range", minimal + "server: {metrics: {port: 70000}}\n", "server.metrics.port:"],
    ["not YAML", "controllers: [unclosed", "config.yaml: not valid YAML"],
    // What gardener-node-agent refuses too (its validation, or a feature gate it does not know).
    ["a negative burst", minimal + "clientConnection: {burst: -1}\n", "clientConnection.burst: must be non-negative"],
    ["an unknown logFormat", minimal + "logFormat: yaml\n", "logFormat:"],
    ["a feature gate", minimal + "featureGates: {SomeGate: true}\n", "featureGates: SomeGate: not supported by trellis: trellis has no feature gates"],
    ["a kubelet data volume of no size", minimal + "bootstrap: {kubeletDataVolumeSize: 0}\n", "bootstrap.kubeletDataVolumeSize:"],
    ["a caBundle that is no PEM", minimal + "apiServer: {caBundle: aGVsbG8=}\n", "apiServer.caBundle: not base64 of a PEM certificate bundle"],
    ["caFile and caBundle", minimal + `apiServer: {caFile: /ca.crt, caBundle: ${Buffer.from(pem).toString("base64")}}\n`, "apiServer: caFile and caBundle are both set"],
  ])("%s is rejected naming the field", (_name, text, expected) => {
    const r = parseAgentConfig(text, "config.yaml");
    expect(r.ok).toBe(false);
    if (!r.ok) expect(r.errors.join("\n")).toContain(expected);
  });

  // Values gardener-node-agent accepts: trellis acts on them (the rate limit, the log format) …
  test.each([
    ["Gardener's zero values", "clientConnection: {qps: 0, burst: 0}\n", { qps: 50, burst: 100 }],
    ["a qps and burst of the operator's", "clientConnection: {qps: 2.5, burst: 130}\n", { qps: 2.5, burst: 130 }],
    ["a negative qps (client-go: no limit)", "clientConnection: {qps: -1}\n", { qps: -1, burst: 100 }],
  ])("%s: the rate limit acted on", (_name, text, limit) => {
    const r = parseAgentConfig(minimal + text, "config.yaml");
    if (!r.ok) throw new Error(r.errors.join("\n"));
    expect(r.config.clientConnection).toMatchObject(limit);
    expect(r.ignored).toEqual([]);
  });

  test.each([["text", "text"], ["json", "json"], ['""', "json"]])("logFormat %s is acted on: %s", (value, format) => {
    const r = parseAgentConfig(`${minimal}logFormat: ${value}\n`, "config.yaml");
    if (!r.ok) throw new Error(r.errors.join("\n"));
    expect(r.config.logFormat).toBe(format as "json" | "text");
    expect(r.ignored).toEqual([]);
  });

  // … or take them without doing what they ask, and say so: the agent starts.
  test.each([
    ["protobuf", "clientConnection: {contentType: application/vnd.kubernetes.protobuf}\n", ["clientConnection.contentType: application/vnd.kubernetes.protobuf: not acted on: trellis's client sends application/json"]],
    ["JSON named", "clientConnection: {contentType: application/json, acceptContentTypes: application/json}\n", []],
    ["protobuf accepted only", "clientConnection: {acceptContentTypes: application/vnd.kubernetes.protobuf}\n", ["clientConnection.acceptContentTypes: application/vnd.kubernetes.protobuf: not acted on: trellis's client accepts application/json only"]],
    ["protobuf accepted before JSON", "clientConnection: {acceptContentTypes: 'application/vnd.kubernetes.protobuf,application/json'}\n", ["clientConnection.acceptContentTypes: application/vnd.kubernetes.protobuf,application/json: not acted on: trellis's client accepts application/json only"]],
    ["profiling", "debugging: {enableProfiling: true}\n", ["debugging.enableProfiling: true: not acted on: trellis serves no profiling endpoint"]],
    [
      "profiling with contention",
      "debugging: {enableProfiling: true, enableContentionProfiling: true}\n",
      ["debugging.enableProfiling: true: not acted on: trellis serves no profiling endpoint", "debugging.enableContentionProfiling: true: not acted on: trellis serves no profiling endpoint"],
    ],
    // gardener-node-agent sets the block profile rate only when it serves profiles.
    ["contention profiling alone", "debugging: {enableContentionProfiling: true}\n", []],
  ])("%s is accepted, and what is not acted on is named", (_name, text, lines) => {
    const r = parseAgentConfig(minimal + text, "config.yaml");
    if (!r.ok) throw new Error(r.errors.join("\n"));
    expect(r.ignored).toEqual(lines.map((l) => `config.yaml: ${l}`));
  });

  // gardener-node-agent decodes its configuration as it decodes the OSC, not strictly (cmd/gardener-node-agent/app/options.go).
  test.each([
    ["an unknown field", "logLevle: debug\n", "logLevle"],
    ["an unknown nested field", "apiServer: {servr: https://x}\n", "apiServer.servr"],
    ["an unknown field of a controller", "  token: {syncConfigs: [], resync: 1m}\n", "controllers.token.resync"],
  ])("%s is ignored as gardener-node-agent ignores it, and named", (_name, text, field) => {
    const r = parseAgentConfig(minimal + text, "config.yaml");
    if (!r.ok) throw new Error(r.errors.join("\n"));
    expect(r.ignored).toEqual([`config.yaml: ${field}: not a field of Gardener v1.150's NodeAgentConfiguration; ignored, as gardener-node-agent ignores it`]);
  });

  test("trellis's own controllers.healthCheck and controllers.drift are fields, not ignored", () => {
    const r = parseAgentConfig(`${minimal}  healthCheck: {syncPeriod: 10s}\n  drift: {mode: report}\n`, "config.yaml");
    if (!r.ok) throw new Error(r.errors.join("\n"));
    expect(r.ignored).toEqual([]);
    expect(r.config.controllers.drift.mode).toBe("report");
  });
});

describe("apiServer's CA", () => {
  const ca = (apiServer: string) => {
    const r = parseAgentConfig(`${minimal}apiServer: ${apiServer}\n`, "config.yaml");
    if (!r.ok) throw new Error(r.errors.join("\n"));
    return apiServerCa(r.config.apiServer, "/cluster-ca.crt");
  };
  test("caFile names the file", () => expect(ca("{caFile: /etc/ca.crt}")).toEqual({ file: "/etc/ca.crt" }));
  test("caBundle (Gardener before v1.147) is the CA itself", () => expect(ca(`{caBundle: ${Buffer.from(pem).toString("base64")}}`)).toEqual({ data: pem }));
  test("neither: cluster-ca.crt", () => expect(ca("{server: https://api}")).toEqual({ file: "/cluster-ca.crt" }));
});

describe("which file in --config-dir", () => {
  const made: string[] = [];
  afterAll(() => {
    for (const dir of made) rmSync(dir, { recursive: true, force: true });
  });
  const dirWith = (names: string[]) => {
    const dir = mkdtempSync(`${tmpdir()}/trellis-config-dir-`);
    made.push(dir);
    for (const n of names) writeFileSync(`${dir}/${n}`, "");
    return dir;
  };
  test.each([
    ["its own version's first", [`config-v${version}.yaml`, "config-v1.150.0.yaml", "config.yaml"], `config-v${version}.yaml`],
    ["then the highest version the control plane wrote (an OSC brings it), before config.yaml", ["config.yaml", "config-v1.99.0.yaml", "config-v1.150.0.yaml", "config-v1.9.3.yaml"], "config-v1.150.0.yaml"],
    ["config.yaml when nothing else is there", ["config.yaml", "other.yaml"], "config.yaml"],
  ])("%s", (_, names, chosen) => {
    expect(basename(configFileIn(dirWith(names)))).toBe(chosen);
  });

  test("none at all is a ConfigError naming the directory", () => {
    const dir = dirWith(["notes.txt"]);
    expect(() => configFileIn(dir)).toThrow(`--config-dir ${dir}: no config-v${version}.yaml, config-*.yaml or config.yaml in it`);
  });
});

test("the configuration Gardener renders into the OSC (Go's zero values for unset fields) reads with Gardener's defaults", () => {
  // As test/peer/gna/render-osc renders it (gardener v1.150.0, nodeagent.ComponentConfig).
  const rendered = `apiServer:
  caFile: /var/lib/gardener-node-agent/cluster-ca.crt
  server: https://10.233.0.1:6443
apiVersion: nodeagent.config.gardener.cloud/v1alpha1
clientConnection:
  acceptContentTypes: ""
  burst: 0
  contentType: ""
  kubeconfig: ""
  qps: 0
controllers:
  operatingSystemConfig:
    kubernetesVersion: 1.35.4
    secretName: gardener-node-agent-worker-4efa1316d073e45e
  systemdUnitCheck: {}
  token:
    syncPeriod: 12h0m0s
kind: NodeAgentConfiguration
logFormat: ""
logLevel: ""
server: {}
`;
  const r = parseAgentConfig(rendered, "config-v1.150.0.yaml");
  if (!r.ok) throw new Error(r.errors.join("\n"));
  expect(r.config).toMatchObject({ logLevel: "info", logFormat: "json", clientConnection: { qps: 50, burst: 100 }, server: { healthProbes: { port: 2751 }, metrics: { port: 2752 } } });
  expect(r.config.controllers.token.syncPeriod).toBe(12 * 3600_000);
});
