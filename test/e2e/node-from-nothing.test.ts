// From a bare machine to a configured node, with nothing but real components: a systemd node with
// containerd whose only way to the images is a mirror (the upstream name does not resolve), a real
// registry, a real kube-apiserver whose kube-controller-manager signs the agent's CSR once the test
// approves it. install.sh pulls the trellis image through the mirror, bootstrap gets the certificate
// and starts the agent, and the agent applies the OSC: the kubelet stand-in runs, an image file is
// extracted, containerd is configured. Then what a user sees over the node's life: an image tag that
// moves, a corrupted and a missing image (old file kept), a containerd change restarting containerd
// exactly once (and no change restarting nothing), a self-update to a new trellis version restarting
// the agent last, and a new binary that cannot read the node's configuration refused.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { readdirSync, readFileSync, writeFileSync } from "node:fs";
import { nodeEvents, putOscSecret, waitApplied } from "../harness/agent.ts";
import { agentBase as base, agentBinary as bin, type BareNode, bareNode, type BareOscOptions, bareOsc, installAndApprove, pushImage, pushTrellis, startBareWorld, stopBareWorld, upstream } from "../harness/bare-node.ts";
import { repoRoot, trellisBinary } from "../harness/binary.ts";
import { decideCsr, waitForCsr } from "../harness/bootstrap.ts";
import type { Cluster } from "../harness/cluster.ts";
import { runOk, waitFor } from "../harness/exec.ts";
import type { Registry } from "../harness/registry.ts";

const secretName = "gardener-node-agent-pool-e2e";

let cluster: Cluster;
let registry: Registry;
let agent: BareNode;
const osc = (o: Omit<BareOscOptions, "mirror"> = {}) => bareOsc({ mirror: registry.host, ...o });
const tool = (text: string) => ({ "usr/bin/tool": { content: `#!/bin/sh\necho ${text}\n`, mode: 0o755 } });

const sh = (cmd: string) => agent.node.execOk(["sh", "-c", cmd]);
const show = async (unit: string, prop: string) => (await agent.node.execOk(["systemctl", "show", "-P", prop, unit])).trim();
const runTool = async () => (await agent.node.execOk(["/opt/bin/tool"])).trim();
const containerdStarts = async () => Number((await sh("journalctl -b -o cat -u containerd.service | grep -c '^Started containerd' || true")).trim());

async function applied(yaml: string): Promise<string> {
  const checksum = await putOscSecret(cluster, secretName, yaml);
  await waitApplied(agent, checksum, 90_000);
  return checksum;
}

async function warningAbout(text: string, since: number): Promise<string> {
  return waitFor(
    `a Warning event containing "${text}"`,
    async () => (await nodeEvents(agent)).filter((e) => e.type === "Warning" && (e.lastTimestamp?.getTime?.() ?? Date.parse(String(e.lastTimestamp))) >= since - 1000).find((e) => e.message?.includes(text))?.message,
    60_000,
    200,
  );
}

beforeAll(async () => {
  ({ cluster, registry } = await startBareWorld(tool("tool v1")));
}, 300_000);

afterAll(() => stopBareWorld({ agent, registry, cluster }), 60_000);

describe("a bare machine becomes a node", () => {
  test("install.sh through a mirror → bootstrap → CSR approved → agent running → OSC applied", async () => {
    agent = await bareNode(cluster, registry, "bare", secretName);
    const checksum = await putOscSecret(cluster, secretName, osc());
    const { startedMs } = await installAndApprove(cluster, registry, agent, "v1");
    await waitApplied(agent, checksum, 120_000);
    console.log(`install.sh start → first OSC applied: ${((performance.now() - startedMs) / 1000).toFixed(2)} s`);

    // The OSC's agent unit differs from the one bootstrap wrote: the agent restarts itself, last.
    await waitFor("the agent active", async () => ((await show("gardener-node-agent.service", "ActiveState")) === "active" ? true : undefined), 30_000, 100);
    expect(await show("gardener-node-init.service", "UnitFileState")).toBe("disabled");
    expect(await show("kubelet.service", "ActiveState")).toBe("active");
    expect(await runTool()).toBe("tool v1");
    // bootstrap took the binary install.sh had verified and installed into the agent's image cache (hashing
    // it): the agent's first apply did not pull and unpack its own image again.
    const journal = await sh("journalctl -o cat -u gardener-node-init.service -u gardener-node-agent.service");
    expect(journal).toContain('"msg":"took a file already on the node into the image cache"');
    expect(journal.split("\n").filter((l) => l.includes('"msg":"extracted a file from an image"') && l.includes("/trellis/agent:"))).toEqual([]);
    expect(journal.split("\n").filter((l) => l.includes('"msg":"extracted a file from an image"') && l.includes("/tools/tool:"))).toHaveLength(1);
    expect((await sh(`stat -c %a ${base}/credentials/kubeconfig`)).trim()).toBe("600");
    const config = await agent.node.readFile("/etc/containerd/config.toml");
    expect(config).toContain('config_path = "/etc/containerd/certs.d"');
    expect(config).toContain(`${upstream}/pause:3.10`);
    expect(await agent.node.readFile(`/etc/containerd/certs.d/${upstream}/hosts.toml`)).toContain(`[host."http://${registry.host}"]`);
    // The bootstrap token stays until kubelet (here a stand-in) holds its own credentials, then goes.
    expect((await agent.node.exec(["test", "-e", `${base}/credentials/bootstrap-token`])).code).toBe(0);
    await agent.node.writeFile("/var/lib/kubelet/kubeconfig-real", "apiVersion: v1\nkind: Config\n", 0o600);
    await waitFor("the bootstrap token removed", async () => (await agent.node.exec(["test", "-e", `${base}/credentials/bootstrap-token`])).code !== 0, 30_000, 200);
  }, 300_000);

  test("an image file follows its tag when the tag moves (found by the periodic re-check)", async () => {
    await pushImage(registry, "tools/tool", "v1", tool("tool v1 rebuilt"));
    await waitFor("the moved tag's file on the node", async () => ((await runTool()) === "tool v1 rebuilt" ? true : undefined), 90_000, 500);
  }, 120_000);

  test("a corrupted image (digest mismatch) and a missing image are reported; the old file stays", async () => {
    await pushImage(registry, "tools/tool", "bad", tool("tampered"));
    // Damage every layer blob of that image in the registry's own storage: it now serves bytes that do not match their digest.
    const manifest = JSON.parse(await runOk(["skopeo", "inspect", "--raw", "--tls-verify=false", `docker://${registry.host}/tools/tool:bad`]));
    for (const layer of manifest.layers as { digest: string }[]) {
      const hex = layer.digest.slice("sha256:".length);
      const data = `${registry.dataDir}/docker/registry/v2/blobs/sha256/${hex.slice(0, 2)}/${hex}/data`;
      const bytes = readFileSync(data);
      bytes[bytes.length - 1] = (bytes[bytes.length - 1] as number) ^ 0xff;
      writeFileSync(data, bytes);
    }
    let since = Date.now();
    await putOscSecret(cluster, secretName, osc({ toolTag: "bad" }));
    const mismatch = await warningAbout("tools/tool:bad", since);
    expect(mismatch).toContain("spec.files[1] (/opt/bin/tool).content.imageRef");
    expect(mismatch).toMatch(/digest|sha256/);
    expect((await runTool())).toBe("tool v1 rebuilt");

    since = Date.now();
    await putOscSecret(cluster, secretName, osc({ toolTag: "missing" }));
    const missing = await warningAbout("tools/tool:missing", since);
    expect(missing).toContain("spec.files[1] (/opt/bin/tool).content.imageRef");
    expect((await runTool())).toBe("tool v1 rebuilt");
  }, 180_000);

  test("a containerd change restarts containerd exactly once; a change elsewhere restarts nothing of containerd", async () => {
    await applied(osc());
    const before = await containerdStarts();
    const pid = await show("containerd.service", "MainPID");
    await applied(osc({ sandboxImage: `${upstream}/pause:3.11` }));
    expect(await agent.node.readFile("/etc/containerd/config.toml")).toContain(`${upstream}/pause:3.11`);
    expect(await containerdStarts()).toBe(before + 1);
    expect(await show("containerd.service", "MainPID")).not.toBe(pid);

    const pid2 = await show("containerd.service", "MainPID");
    await applied(osc({ sandboxImage: `${upstream}/pause:3.11`, extraFile: "unrelated\n" }));
    expect(await containerdStarts()).toBe(before + 1);
    expect(await show("containerd.service", "MainPID")).toBe(pid2);
  }, 180_000);

  test("a self-update to a new trellis version restarts the agent last, and it comes back on that version", async () => {
    const v2 = `${repoRoot}/dist/trellis-e2e-v2`;
    await runOk(["bun", "run", "build", "--", "--version", "0.2.0", "--outfile", "dist/trellis-e2e-v2"], { cwd: repoRoot, timeoutMs: 300_000 });
    await pushTrellis(registry, "v2", v2, "0.2.0");
    await pushImage(registry, "tools/tool", "v2", tool("tool v2"));
    const agentPid = await show("gardener-node-agent.service", "MainPID");
    // Also a new tool, which restarts the kubelet stand-in in the same apply: it must go first.
    await applied(osc({ agentTag: "v2", toolTag: "v2", sandboxImage: `${upstream}/pause:3.11`, extraFile: "unrelated\n" }));
    await waitFor("the agent on 0.2.0", async () => ((await agent.node.execOk([bin, "version"])).includes("0.2.0") ? true : undefined), 30_000, 200);
    await waitFor("the new agent process", async () => ((await show("gardener-node-agent.service", "MainPID")) !== agentPid && (await show("gardener-node-agent.service", "ActiveState")) === "active" ? true : undefined), 60_000, 200);
    const kubeletStarted = Number(await show("kubelet.service", "ExecMainStartTimestampMonotonic"));
    const agentStarted = Number(await show("gardener-node-agent.service", "ExecMainStartTimestampMonotonic"));
    expect(agentStarted).toBeGreaterThan(kubeletStarted);
    expect((await runTool())).toBe("tool v2");
    expect(await show("gardener-node-agent.service", "NRestarts")).toBe("0");
  }, 420_000);

  test("a binary that is not the one install.sh recorded is not taken into the image cache: the agent's first apply pulls its image", async () => {
    const other = await bareNode(cluster, registry, "bare-rec", `${secretName}-rec`);
    try {
      const checksum = await putOscSecret(cluster, `${secretName}-rec`, osc());
      // The binary in place (as install.sh leaves it), and a record that says it is something else.
      await other.node.install(await trellisBinary(), bin, 0o755);
      const digest = (await runOk(["skopeo", "inspect", "--tls-verify=false", "--format", "{{.Digest}}", `docker://${registry.host}/trellis/agent:v1`])).trim();
      await other.node.writeFile(`${base}/init-installed`, `${digest.slice(7)} ${"0".repeat(64)} sha256:${"1".repeat(64)}\n`, 0o644);
      const boot = other.node.exec([bin, "bootstrap", "--config-dir", base], { timeoutMs: 120_000 });
      const csr = await waitForCsr(cluster, `the CSR of ${other.name}`, (c) => c.spec.username === other.bootstrapUser);
      await decideCsr(cluster, csr.metadata?.name as string, "Approved", "E2E", "approved by the test");
      expect((await boot).code).toBe(0);
      await waitApplied(other, checksum, 120_000);
      // bootstrap ran in the foreground here (its lines in its output), the agent in its unit.
      const journal = (await boot).stdout + (await boot).stderr + (await other.node.execOk(["journalctl", "-o", "cat", "-u", "gardener-node-agent.service"]));
      expect(journal).toContain('"msg":"the binary is not the one install.sh recorded: not taken into the image cache"');
      expect(journal).not.toContain('"msg":"took a file already on the node into the image cache"');
      expect(journal.split("\n").filter((l) => l.includes('"msg":"extracted a file from an image"') && l.includes("/trellis/agent:"))).toHaveLength(1);
    } finally {
      await other.stop();
    }
  }, 180_000);

  test("a new binary that cannot read the node's configuration is refused; the agent keeps running", async () => {
    await pushImage(registry, "trellis/agent", "broken", { "gardener-node-agent": { content: '#!/bin/sh\necho "config format v9 expected" >&2\nexit 1\n', mode: 0o755 } });
    const agentPid = await show("gardener-node-agent.service", "MainPID");
    const since = Date.now();
    await putOscSecret(cluster, secretName, osc({ agentTag: "broken", toolTag: "v2", sandboxImage: `${upstream}/pause:3.11`, extraFile: "unrelated\n" }));
    const refused = await warningAbout("cannot start with this node's configuration", since);
    expect(refused).toContain("config format v9 expected");
    expect((await agent.node.execOk([bin, "version"])).trim()).toContain("0.2.0");
    expect(await show("gardener-node-agent.service", "MainPID")).toBe(agentPid);
    expect(readdirSync(`${agent.node.root}${base}/tmp`).filter((n) => n.startsWith("self-update"))).toEqual([]);
  }, 120_000);
});
