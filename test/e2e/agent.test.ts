// The agent as it runs on a node: compiled binary, systemd unit, real kube-apiserver. The control
// plane writes the OSC Secret; the node follows it and reports.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { readFileSync } from "node:fs";
import { parse, stringify } from "yaml";
import { poolLabel } from "../../src/api/rollout.ts";
import { type AgentNode, mainPid, nodeEvents, putOscSecret, readNode, registerNode, startAgentNode, waitApplied } from "../harness/agent.ts";
import { type Cluster, startCluster } from "../harness/cluster.ts";
import { waitFor } from "../harness/exec.ts";

const secretName = "gardener-node-agent-worker-e2e";
const fixture = parse(readFileSync(new URL("../fixtures/web-osc.yaml", import.meta.url), "utf8"), { version: "1.1" });
const osc = (page: string, mutate: (o: typeof fixture) => void = () => {}) => {
  const o = structuredClone(fixture);
  o.spec.files[0].content.inline.data = page;
  mutate(o);
  return stringify(o);
};

let cluster: Cluster;
let agent: AgentNode;

beforeAll(async () => {
  cluster = await startCluster({ controllerManager: false });
  agent = await startAgentNode(cluster, { prefix: "agent", secretName, secretRefs: ["missing-secret"] });
}, 120_000);
afterAll(async () => {
  await agent?.node.stop();
  await cluster?.stop();
});

describe("the agent follows the OSC Secret", () => {
  test("first apply: files, units, Node annotation and labels, an OSCApplied event, the condition", async () => {
    const checksum = await putOscSecret(cluster, secretName, osc("<h1>v1</h1>\n"));
    const node = await waitApplied(agent, checksum);
    expect(await agent.node.readFile("/etc/web/index.html")).toBe("<h1>v1</h1>\n");
    expect((await agent.node.exec(["systemctl", "is-active", "web.service", "ticker.service"])).stdout).toBe("active\nactive\n");
    expect(node.metadata?.labels).toMatchObject({ "worker.gardener.cloud/kubernetes-version": "1.35.4", "node-role.kubernetes.io/worker": "", "worker.gardener.cloud/gardener-node-agent-secret-name": secretName });
    // The annotation is patched first; the event and the condition follow.
    const applied = await waitFor("the OSCApplied event", async () => (await nodeEvents(agent)).find((e) => e.reason === "OSCApplied"));
    expect(applied.message).toContain(`Applied OSC ${checksum.slice(0, 12)}`);
    const condition = await waitFor("the condition", async () =>
      (await readNode(agent)).status?.conditions?.find((c) => c.type === "OperatingSystemConfigApplied"),
    );
    expect(condition).toMatchObject({ status: "True", reason: "Applied" });
  });

  test("changing a file a unit lists restarts only that unit", async () => {
    const [web, ticker, self] = [await mainPid(agent, "web.service"), await mainPid(agent, "ticker.service"), await mainPid(agent, "gardener-node-agent.service")];
    const checksum = await putOscSecret(cluster, secretName, osc("<h1>v2</h1>\n"));
    await waitApplied(agent, checksum);
    expect(await agent.node.readFile("/etc/web/index.html")).toBe("<h1>v2</h1>\n");
    expect(await mainPid(agent, "web.service")).not.toBe(web);
    expect(await mainPid(agent, "ticker.service")).toBe(ticker);
    expect(await mainPid(agent, "gardener-node-agent.service")).toBe(self);
  });

  test("a bad OSC changes nothing, and says which field in a Warning event and the Node condition", async () => {
    await putOscSecret(cluster, secretName, osc("<h1>v3</h1>\n", (o) => o.spec.files.push({ path: "/etc/x", content: { inline: { encoding: "b64", data: "!!" } } })));
    const warning = await waitFor("an OSCInvalid event", async () => (await nodeEvents(agent)).find((e) => e.reason === "OSCInvalid"), 20_000);
    expect(warning.type).toBe("Warning");
    expect(warning.message).toContain("spec.files[2] (/etc/x).content.inline.data: not valid base64");
    const condition = await waitFor("the condition to say Invalid", async () => {
      const c = (await readNode(agent)).status?.conditions?.find((x) => x.type === "OperatingSystemConfigApplied");
      return c?.status === "False" ? c : undefined;
    });
    expect(condition).toMatchObject({ reason: "Invalid" });
    expect(condition.message).toContain("not valid base64");
    expect(await agent.node.readFile("/etc/web/index.html")).toBe("<h1>v2</h1>\n");
    // Fixed: applied again.
    await waitApplied(agent, await putOscSecret(cluster, secretName, osc("<h1>v4</h1>\n")));
    expect(await agent.node.readFile("/etc/web/index.html")).toBe("<h1>v4</h1>\n");
  });

  const bad = (mutate: (o: typeof fixture) => void) => osc("<h1>bad</h1>\n", mutate);
  test.each([
    ["invalid YAML", "spec: [unclosed\n", "not valid YAML"],
    ["wrong types", bad((o) => (o.spec.units = "kubelet.service")), "spec.units"],
    ["bad base64", bad((o) => (o.spec.files[1].content.inline.data = "!!not base64")), "spec.files[1] (/etc/ticker/message).content.inline.data: not valid base64"],
    ["a relative path", bad((o) => (o.spec.files[1].path = "etc/ticker/message")), "spec.files[1] (etc/ticker/message): path is not absolute"],
    ["a .. path", bad((o) => (o.spec.files[1].path = "/etc/../root/.ssh/authorized_keys")), 'path has a "." or ".." segment'],
    ["a drop-in name leaving its directory", bad((o) => (o.spec.units[1].dropIns = [{ name: "../../evil.service", content: "" }])), "name must be a file name in"],
    ["a unit name with /", bad((o) => (o.spec.units[1].name = "../evil.service")), "unit ../evil.service: name must be a systemd unit name"],
    ["an unknown encoding", bad((o) => (o.spec.files[1].content.inline.encoding = "gzip")), 'unknown encoding "gzip"'],
    ["a missing secretRef", bad((o) => o.spec.files.push({ path: "/etc/from-secret", content: { secretRef: { name: "missing-secret", dataKey: "x" } } })), "secret kube-system/missing-secret not found"],
    // Found as an attacker would: read as an OSC without units or files, it removed everything trellis owned.
    ["a list for spec", bad((o) => (o.spec = [])), "spec: Invalid type: Expected a mapping but received a list"],
    // Found: the files before it were written, and the saved plan blocked every later apply.
    ["a path that is an existing directory", bad((o) => o.spec.files.push({ path: "/etc/web", content: { inline: { data: "x" } } })), "/etc/web cannot be written: is a directory"],
    ["a path into /proc", bad((o) => o.spec.files.push({ path: "/proc/sys/kernel/core_pattern", content: { inline: { data: "|/tmp/x" } } })), "is under /proc, which belongs to the kernel"],
    ["bytes that are not UTF-8", new Uint8Array([...new TextEncoder().encode(bad(() => {})), 0x23, 0xff, 0x0a]), "is not valid UTF-8"],
    // 8 KB that kept the plain parser busy for seconds and took 550 MB.
    ["deep nesting plus an alias", `${bad(() => {})}x: &a ${"[".repeat(4000)}${"]".repeat(4000)}\ny: *a\n`, "nested more than 64 levels deep"],
  ])("bad input (%s): a Warning names the field, the node keeps its last good state", async (_case, text, expected) => {
    const pids = [await mainPid(agent, "web.service"), await mainPid(agent, "ticker.service")];
    const page = await agent.node.readFile("/etc/web/index.html");
    await putOscSecret(cluster, secretName, text);
    const warning = await waitFor(`an OSCInvalid event containing ${expected}`, async () =>
      (await nodeEvents(agent)).find((e) => e.reason === "OSCInvalid" && e.message?.includes(expected)),
    20_000);
    expect(warning.type).toBe("Warning");
    expect(await agent.node.readFile("/etc/web/index.html")).toBe(page);
    expect([await mainPid(agent, "web.service"), await mainPid(agent, "ticker.service")]).toEqual(pids);
    expect((await agent.node.exec(["test", "-e", "/etc/from-secret"])).code).toBe(1);
  });

  test("after bad input, going back to the last good OSC clears the condition without touching the node", async () => {
    const pids = [await mainPid(agent, "web.service"), await mainPid(agent, "ticker.service")];
    await waitApplied(agent, await putOscSecret(cluster, secretName, osc("<h1>v4</h1>\n")));
    await waitFor("the condition back to True", async () => {
      const c = (await readNode(agent)).status?.conditions?.find((x) => x.type === "OperatingSystemConfigApplied");
      return c?.status === "True";
    });
    expect([await mainPid(agent, "web.service"), await mainPid(agent, "ticker.service")]).toEqual(pids);
  });

  test("the reconciliation-delay annotation holds an update back for that long", async () => {
    const reconciles = async () => {
      const metrics = await (await fetch(`http://127.0.0.1:${agent.metricsPort}/metrics`)).text();
      return [...metrics.matchAll(/^trellis_reconcile_total\{[^}]*\} (\d+)$/gm)].reduce((n, m) => n + Number(m[1]), 0);
    };
    const before = await reconciles();
    await agent.core.patchNode(
      { name: agent.name, body: [{ op: "add", path: "/metadata/annotations/node-agent.gardener.cloud~1reconciliation-delay", value: "3s" }] },
    );
    // The agent saw the annotation on its Node watch once it reconciled for it.
    await waitFor("a reconcile for the new annotation", async () => (await reconciles()) > before, 10_000, 50);
    const t0 = Date.now();
    const checksum = await putOscSecret(cluster, secretName, osc("<h1>v5</h1>\n"));
    await Bun.sleep(1500);
    expect(await agent.node.readFile("/etc/web/index.html")).toBe("<h1>v4</h1>\n");
    await waitApplied(agent, checksum, 15_000);
    expect(Date.now() - t0).toBeGreaterThanOrEqual(2900);
    await agent.core.patchNode({ name: agent.name, body: [{ op: "remove", path: "/metadata/annotations/node-agent.gardener.cloud~1reconciliation-delay" }] });
  });

  test("after kube-apiserver restarts, the next change is still applied", async () => {
    await cluster.restartApiServer();
    const checksum = await putOscSecret(cluster, secretName, osc("<h1>v6</h1>\n"));
    await waitApplied(agent, checksum, 60_000);
    expect(await agent.node.readFile("/etc/web/index.html")).toBe("<h1>v6</h1>\n");
  }, 90_000);

  test("kill -9 of the agent right after an update: systemd restarts it and it finishes the work", async () => {
    const web = await mainPid(agent, "web.service");
    const checksum = await putOscSecret(cluster, secretName, osc("<h1>v7</h1>\n", (o) => {
      for (let i = 0; i < 200; i++) o.spec.files.push({ path: `/etc/bulk/f${i}`, permissions: 0o644, content: { inline: { encoding: "", data: `bulk ${i}\n` } } });
    }));
    await Bun.sleep(40);
    const agentPid = await mainPid(agent, "gardener-node-agent.service");
    await agent.node.exec(["kill", "-9", String(agentPid)]);
    // systemd starts it again (a fast apply may have finished before the kill: then the new agent finds it done).
    await waitFor("systemd started the agent again", async () => ((await mainPid(agent, "gardener-node-agent.service")) !== agentPid ? true : undefined), 30_000, 100);
    await waitApplied(agent, checksum, 30_000);
    expect(await agent.node.readFile("/etc/web/index.html")).toBe("<h1>v7</h1>\n");
    expect(await mainPid(agent, "web.service")).not.toBe(web);
    expect((await agent.node.execOk(["sh", "-c", "ls /etc/bulk | wc -l"])).trim()).toBe("200");
  }, 60_000);
});

test("the bootstrap credentials stay until the Node is registered and kubelet holds its own certificate, then go", async () => {
  const late = await startAgentNode(cluster, { prefix: "creds", secretName: "osc-creds", registerNode: false, start: false });
  const exists = async (path: string) => (await late.node.exec(["test", "-e", path])).code === 0;
  const credentials = ["/var/lib/gardener-node-agent/credentials/bootstrap-token", "/var/lib/kubelet/kubeconfig-bootstrap"];
  // The agent logs why it keeps them whenever the reason changes: the event that proves each stage.
  const keptBecause = (why: string) =>
    waitFor(`the agent keeping the credentials because ${why}`, async () => (await late.node.exec(["journalctl", "-u", "gardener-node-agent", "-o", "cat"])).stdout.includes(`"why":"${why}"`), 30_000);
  try {
    await late.node.writeFile(credentials[0] as string, "abcdef.0123456789abcdef", 0o600);
    await late.node.writeFile(credentials[1] as string, "apiVersion: v1\nkind: Config\n", 0o600);
    await late.node.execOk(["systemctl", "enable", "--now", "gardener-node-agent.service"]);
    await putOscSecret(cluster, "osc-creds", osc("<h1>creds</h1>\n"));
    await keptBecause("kubelet has not registered the Node yet");
    expect(await Promise.all(credentials.map(exists))).toEqual([true, true]);
    await registerNode(late.core, late.name);
    await keptBecause("kubelet has no client certificate yet");
    expect(await Promise.all(credentials.map(exists))).toEqual([true, true]);
    await late.node.writeFile("/var/lib/kubelet/kubeconfig-real", "apiVersion: v1\nkind: Config\n", 0o600);
    await waitFor("the bootstrap credentials removed", async () => (await Promise.all(credentials.map(exists))).every((e) => !e), 30_000);
  } finally {
    await late.node.stop();
  }
}, 120_000);

test("a Node that registers only after the first apply (as kubelet's does) still gets the OSCApplied event naming the steps, and no pool label from the agent", async () => {
  const late = await startAgentNode(cluster, { prefix: "late", secretName: "osc-late", registerNode: false });
  try {
    const checksum = await putOscSecret(cluster, "osc-late", osc("<h1>late</h1>\n"));
    await waitFor("the OSC applied on the node", async () => (await late.node.exec(["systemctl", "is-active", "web.service"])).stdout === "active\n", 30_000);
    // Registered without the pool's label: it is Gardener's (kubelet's --node-labels, gardenlet), never the agent's.
    await registerNode(late.core, late.name);
    const node = await waitApplied(late, checksum);
    expect(node.metadata?.labels?.[poolLabel]).toBeUndefined();
    const applied = await waitFor("the OSCApplied event", async () => (await nodeEvents(late)).find((e) => e.reason === "OSCApplied"));
    expect(applied.message).toMatch(new RegExp(`^Applied OSC ${checksum.slice(0, 12)}: [1-9]\\d* step\\(s\\)`));
  } finally {
    await late.node.stop();
  }
}, 90_000);

/** An OSC of `files` and `units` alone (the web fixture's port is the first node's: these nodes share the host's network). */
const small = (spec: { files?: unknown[]; units?: unknown[] }) =>
  stringify({ apiVersion: "extensions.gardener.cloud/v1alpha1", kind: "OperatingSystemConfig", metadata: { name: "small", namespace: "kube-system" }, spec: { type: "debian", purpose: "reconcile", ...spec } });
const inlineFile = (path: string, hostName?: string) => ({ path, ...(hostName ? { hostName } : {}), permissions: 0o644, content: { inline: { encoding: "", data: `${path}\n` } } });

test("a host whose name has capitals gets the files for its name lower-cased, as gardener-node-agent and kubelet spell it", async () => {
  const caps = await startAgentNode(cluster, { prefix: "caps", secretName: "osc-caps", start: false });
  try {
    const upper = caps.name.toUpperCase();
    await caps.node.execOk(["hostname", upper]);
    await caps.node.execOk(["systemctl", "enable", "--now", "--no-block", "gardener-node-agent.service"]);
    const checksum = await putOscSecret(cluster, "osc-caps", small({ files: [inlineFile("/etc/caps/everyone"), inlineFile("/etc/caps/mine", caps.name), inlineFile("/etc/caps/as-spelled", upper)] }));
    await waitApplied(caps, checksum);
    expect((await caps.node.execOk(["hostname"])).trim()).toBe(upper);
    expect(await caps.node.readFile("/etc/caps/everyone")).toBe("/etc/caps/everyone\n");
    expect(await caps.node.readFile("/etc/caps/mine")).toBe("/etc/caps/mine\n");
    // The OSC's hostName is compared as it is spelled: capitals match no host.
    expect((await caps.node.exec(["test", "-e", "/etc/caps/as-spelled"])).code).toBe(1);
  } finally {
    await caps.node.stop();
  }
}, 90_000);

test("the role and zone labels are set before the OSC is applied, as gardener-node-agent sets them: an OSC that fails still sets them", async () => {
  const zoned = await startAgentNode(cluster, { prefix: "zone", secretName: "osc-zone", start: false });
  try {
    await zoned.node.writeFile("/var/lib/gardener-node-agent/zone", "zone-b\n", 0o600);
    await zoned.node.execOk(["systemctl", "enable", "--now", "--no-block", "gardener-node-agent.service"]);
    const broken = { name: "zone-broken.service", command: "start", enable: true, content: "[Service]\nType=oneshot\nExecStart=/bin/false\n[Install]\nWantedBy=multi-user.target\n" };
    await putOscSecret(cluster, "osc-zone", small({ units: [broken] }));
    const failed = await waitFor("the OSCApplyFailed event", async () => (await nodeEvents(zoned)).find((e) => e.reason === "OSCApplyFailed"), 30_000);
    expect(failed.message).toContain("zone-broken.service");
    const node = await readNode(zoned);
    expect(node.metadata?.labels).toMatchObject({ "topology.kubernetes.io/zone": "zone-b", "node-role.kubernetes.io/worker": "" });
    expect(node.metadata?.annotations?.["checksum/cloud-config-data"]).toBeUndefined();
  } finally {
    await zoned.node.stop();
  }
}, 90_000);
