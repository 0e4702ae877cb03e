// Secrets stay secret: a bare machine brought up by the compiled agent (bootstrap token → CSR → client
// certificate), an OSC with a secretRef file, a token Secret synced to its file, and a crash of the
// agent (SIGSEGV: the runtime's own crash report lands in the journal). Then every place an operator or
// another process can read is scanned for every credential the agent handled, as it is and in base64:
// the node's whole journal (every unit, every field), the status file, every Event of the cluster,
// /metrics, `trellis status` (text and JSON), and every file under the agent's state directory and
// /run/trellis except the credential files themselves, whose modes must be what docs/install.md says.
import { afterAll, beforeAll, expect, test } from "bun:test";
import { randomBytes } from "node:crypto";
import { CoreV1Api } from "@kubernetes/client-node";
import { parse, stringify } from "yaml";
import { statusPath } from "../../src/api/status-file.ts";
import { mainPid, putOscSecret, unitProperty, waitApplied } from "../harness/agent.ts";
import { agentBase as base, agentBinary, type BareNode, bareNode, bareOsc, installAndApprove, startBareWorld, stopBareWorld } from "../harness/bare-node.ts";
import type { Cluster } from "../harness/cluster.ts";
import { waitFor } from "../harness/exec.ts";
import type { Registry } from "../harness/registry.ts";

const secretName = "gardener-node-agent-pool-scan";
const tokenSecret = "gardener-node-agent";
const fileSecret = "scan-file-secret";
const tokenPath = `${base}/credentials/token`;
const secretFilePath = "/etc/scan/password";
/** The credential files and the modes docs/install.md ("Credentials on the node") gives them. */
const credentialFiles: Record<string, string> = {
  [`${base}/credentials/kubeconfig`]: "600",
  [`${base}/credentials/bootstrap-token`]: "600",
  [`${base}/credentials/csr-pending.json`]: "600",
  [tokenPath]: "640",
  "/var/lib/kubelet/kubeconfig-bootstrap": "600",
};

let cluster: Cluster;
let registry: Registry;
let agent: BareNode;
/** name → value of every credential the agent handled. */
const secrets: Record<string, string> = {};

const sh = (cmd: string) => agent.node.execOk(["sh", "-c", cmd]);

beforeAll(async () => {
  ({ cluster, registry } = await startBareWorld({ "usr/bin/tool": { content: "#!/bin/sh\necho tool\n", mode: 0o755 } }));

  secrets.token = `token-${randomBytes(24).toString("hex")}`;
  secrets.secretRef = `secret-file-${randomBytes(24).toString("hex")}`;
  const core = cluster.admin().makeApiClient(CoreV1Api);
  await core.createNamespacedSecret({ namespace: "kube-system", body: { metadata: { name: tokenSecret }, stringData: { token: secrets.token } } });
  await core.createNamespacedSecret({ namespace: "kube-system", body: { metadata: { name: fileSecret }, stringData: { password: secrets.secretRef } } });

  agent = await bareNode(cluster, registry, "scan", secretName, { secretRefs: [tokenSecret, fileSecret], tokenSyncConfigs: [{ secretName: tokenSecret, path: tokenPath }] });
  secrets.bootstrapToken = (await agent.node.readFile(`${base}/credentials/bootstrap-token`)).trim();
  const osc = parse(bareOsc({ mirror: registry.host }));
  osc.spec.files.push({ path: secretFilePath, permissions: 0o600, content: { secretRef: { name: fileSecret, dataKey: "password" } } });
  const checksum = await putOscSecret(cluster, secretName, stringify(osc));
  await installAndApprove(cluster, registry, agent, "v1");
  await waitApplied(agent, checksum, 120_000);
  await waitFor("the token file", async () => ((await agent.node.readFile(tokenPath).catch(() => "")) === secrets.token ? true : undefined), 30_000, 200);
  expect(await agent.node.readFile(secretFilePath)).toBe(secrets.secretRef);
  // The client key the CSR was made for, as it sits in the kubeconfig bootstrap wrote.
  const kubeconfig = parse(await agent.node.readFile(`${base}/credentials/kubeconfig`));
  secrets.clientKey = Buffer.from(kubeconfig.users[0].user["client-key-data"], "base64").toString();
  expect(secrets.clientKey).toContain("PRIVATE KEY-----");

  // A crash: the runtime's crash report goes to the journal, systemd starts the agent again. Sent to a
  // running agent (ready, Type=notify), not one restarting itself after the update it just applied.
  const before = await waitFor(
    "the agent running",
    async () => ((await unitProperty(agent.node, "gardener-node-agent.service", "SubState")) === "running" ? await mainPid(agent, "gardener-node-agent.service") : undefined),
    30_000,
    200,
  );
  await sh("systemctl kill --signal=SIGSEGV gardener-node-agent.service");
  await waitFor("the crash in the journal", async () => ((await sh("journalctl -b -o cat -u gardener-node-agent.service")).includes("status=11/SEGV") ? true : undefined), 30_000, 200);
  await waitFor(
    "the agent running again, /metrics answering",
    async () => {
      const pid = await mainPid(agent, "gardener-node-agent.service");
      return pid !== before && pid !== 0 && (await agent.node.exec(["curl", "-sf", `http://127.0.0.1:${agent.metricsPort}/metrics`])).code === 0 ? true : undefined;
    },
    60_000,
    200,
  );
}, 300_000);

afterAll(() => stopBareWorld({ agent, registry, cluster }), 60_000);

/** Every form a credential could leak in: itself, base64 of it, and for a PEM key each line of its body. */
function needles(): [string, string][] {
  const out: [string, string][] = [];
  for (const [name, value] of Object.entries(secrets)) {
    out.push([name, value], [`${name} (base64)`, Buffer.from(value).toString("base64")]);
    if (value.includes("-----BEGIN")) for (const line of value.split("\n").filter((l) => l.length >= 40 && !l.startsWith("-----"))) out.push([`${name} (PEM line)`, line]);
  }
  return out;
}
const leaksIn = (text: string) => needles().filter(([, v]) => text.includes(v)).map(([name]) => name);

test("the node's journal, every unit and field, the crash report included, holds no credential", async () => {
  const journal = await sh("journalctl -b --no-pager -o verbose");
  expect(journal).toMatch(/gardener-node-agent\.service: Main process exited, code=(killed|dumped), status=11\/SEGV/);
  expect(leaksIn(journal)).toEqual([]);
  console.log(`journal: ${journal.length} bytes; the crash: ${(await sh("journalctl -b -o cat -u gardener-node-agent.service | grep -iE 'segmentation|panic|SEGV' | head -3")).trim()}`);
});

/**
 * What `trellis status` prints, on both streams (it exits 1 while a component is not ready), once every
 * component of the agent restarted after the crash has reported (the lease is among the last).
 */
function statusOutput(...args: string[]): Promise<string> {
  return waitFor(
    "trellis status showing every component",
    async () => {
      const r = await agent.node.exec([agentBinary, "status", ...args]);
      return r.stdout.includes("lease") ? r.stdout + r.stderr : undefined;
    },
    30_000,
    200,
  );
}

test("the status file, /metrics and `trellis status` hold none", async () => {
  const metrics = await sh(`curl -sf http://127.0.0.1:${agent.metricsPort}/metrics`);
  expect(metrics).toContain("trellis_token_writes_total");
  for (const [where, text] of [
    ["status file", await agent.node.readFile(statusPath)],
    ["/metrics", metrics],
    ["trellis status", await statusOutput()],
    ["trellis status --json", await statusOutput("--json")],
  ]) {
    expect({ where, leaks: leaksIn(text as string) }).toEqual({ where, leaks: [] });
  }
});

test("no Event in the cluster holds one", async () => {
  const events = await cluster.admin().makeApiClient(CoreV1Api).listEventForAllNamespaces();
  expect(events.items.length).toBeGreaterThan(0);
  expect(leaksIn(JSON.stringify(events.items))).toEqual([]);
});

test("no file under the agent's state directory or /run/trellis holds one, besides the credential files", async () => {
  // grep takes each line of a pattern as a pattern of its own: a PEM key is looked for by its body lines.
  const patterns = needles().filter(([, v]) => !v.includes("\n")).flatMap(([, v]) => ["-e", v]);
  const excluded = Object.keys(credentialFiles);
  const found = await agent.node.exec(["grep", "-rlF", ...patterns, base, "/run/trellis"]);
  expect(found.code).toBeLessThanOrEqual(1); // 1: nothing found
  const files = found.stdout.split("\n").filter(Boolean);
  expect(files).toContain(`${base}/credentials/kubeconfig`); // the scan finds what is there
  expect(files).toContain(tokenPath);
  expect(files.filter((f) => !excluded.includes(f))).toEqual([]);
  // No core dump of the crashed agent: its memory holds every credential.
  expect((await agent.node.exec(["sh", "-c", "ls / /var/lib/gardener-node-agent /var/lib/systemd/coredump 2>/dev/null | grep -i '^core'"])).stdout).toBe("");
});

test("the credential files have the documented modes, the secretRef file the OSC's", async () => {
  const modes: Record<string, string> = {};
  for (const path of [...Object.keys(credentialFiles), secretFilePath]) {
    const r = await agent.node.exec(["stat", "-c", "%a", path]);
    modes[path] = r.code === 0 ? r.stdout.trim() : "absent";
  }
  const documented = Object.fromEntries(Object.entries(credentialFiles).map(([p, m]) => [p, modes[p] === "absent" ? "absent" : m]));
  console.log(`modes: ${JSON.stringify(modes)}`);
  expect(modes).toEqual({ ...documented, [secretFilePath]: "600" });
  expect(modes[`${base}/credentials/kubeconfig`]).toBe("600");
  expect(modes[tokenPath]).toBe("640");
});
