// `trellis bootstrap` and the agent's certificate renewal, with the compiled binary in real systemd nodes
// against a real kube-apiserver and kube-controller-manager (which signs kube-apiserver-client CSRs with
// the client CA once they are approved; the test is the approver). What a user sees: a CSR with exactly
// gardener-node-agent's subject, signer, usages and lifetime; a 0600 kubeconfig the API server accepts
// as the machine's node-agent user; the agent's unit installed, enabled and running with it; the init
// unit that ran the bootstrap disabled; kubelet's bootstrap kubeconfig; a denied CSR ending the
// bootstrap with the CSR's name and the reason; re-runs that ask for nothing new; and a certificate near
// the end of its life renewed by the running agent, which goes on working with the new one.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { readFileSync, rmSync, writeFileSync } from "node:fs";
import { X509Certificate } from "node:crypto";
import { CoordinationV1Api, CoreV1Api, type V1CertificateSigningRequest } from "@kubernetes/client-node";
import { parse as parseYaml } from "yaml";
import { agentUnitContent } from "../../src/api/agent-unit.ts";
import { readClientCertificate, renderKubeconfig } from "../../src/kube/csr-kubeconfig.ts";
import { agentRules } from "../harness/agent.ts";
import { trellisBinary } from "../harness/binary.ts";
import { createBootstrapToken, csrApi, decideCsr, grantCsrRbac, waitForCsr } from "../harness/bootstrap.ts";
import { issueClientCert } from "../harness/certs.ts";
import { type Cluster, startCluster } from "../harness/cluster.ts";
import { freePort, run, runDir, runOk, waitFor } from "../harness/exec.ts";
import { bootNode, type Node } from "../harness/node.ts";
import { userWithRules } from "../harness/rbac.ts";

const base = "/var/lib/gardener-node-agent";
const bin = "/opt/bin/gardener-node-agent";
const kubeconfigPath = `${base}/credentials/kubeconfig`;
const pendingPath = `${base}/credentials/csr-pending.json`;
const initUnit = "gardener-node-init.service";
const agentUnit = "gardener-node-agent.service";

let cluster: Cluster;
let binary: string;
const nodes: Node[] = [];

beforeAll(async () => {
  [cluster, binary] = await Promise.all([startCluster(), trellisBinary()]);
  await grantCsrRbac(cluster);
}, 300_000);
afterAll(async () => {
  await Promise.all(nodes.map((n) => n.stop()));
  await cluster?.stop();
}, 60_000);

type Prepared = { node: Node; machine: string; user: string; token: { token: string; user: string }; metricsPort: number };

/**
 * A new machine as Gardener's user data leaves it: the binary, the NodeAgentConfiguration (apiServer
 * set, CA at cluster-ca.crt), a bootstrap token of its own, a machine-name file, a registered Node.
 * With `initUnit`, a gardener-node-init.service that runs the bootstrap, enabled.
 */
async function prepareNode(prefix: string, opts: { initUnit?: boolean; token?: boolean; loopDevices?: string[]; config?: string } = {}): Promise<Prepared> {
  const node = await bootNode(prefix, { net: "host", ...(opts.loopDevices ? { loopDevices: opts.loopDevices } : {}) });
  nodes.push(node);
  const machine = `machine-${node.name}`;
  const user = `gardener.cloud:node-agent:machine:${machine}`;
  const secret = `osc-${node.name}`;
  const [healthPort, metricsPort] = [await freePort(), await freePort()];
  await node.install(binary, bin);
  await node.writeFile(
    `${base}/config.yaml`,
    `apiVersion: nodeagent.config.gardener.cloud/v1alpha1
kind: NodeAgentConfiguration
apiServer:
  server: ${cluster.server}
  caFile: ${base}/cluster-ca.crt
server:
  healthProbes: {port: ${healthPort}}
  metrics: {port: ${metricsPort}}
controllers:
  operatingSystemConfig:
    secretName: ${secret}
    kubernetesVersion: 1.35.4
${opts.config ?? ""}`,
    0o600,
  );
  await node.writeFile(`${base}/cluster-ca.crt`, cluster.caPem, 0o640);
  await node.writeFile(`${base}/machine-name`, `${machine}\n`, 0o640);
  const token = await createBootstrapToken(cluster);
  if (opts.token !== false) await node.writeFile(`${base}/credentials/bootstrap-token`, token.token, 0o640);
  await cluster.admin().makeApiClient(CoreV1Api).createNode({ body: { metadata: { name: node.name, labels: { "kubernetes.io/hostname": node.name } } } });
  await userWithRules(cluster, user, agentRules([secret])); // so the agent the bootstrap starts can work
  if (opts.initUnit) {
    // Gardener's init unit runs a script that ends in `exec gardener-node-agent bootstrap --config-dir=…`.
    await node.writeFile(
      `/etc/systemd/system/${initUnit}`,
      `[Unit]
Description=test stand-in for Gardener's node init
[Service]
Type=oneshot
ExecStart=${bin} bootstrap --config-dir=${base}
[Install]
WantedBy=multi-user.target
`,
    );
    await node.execOk(["systemctl", "daemon-reload"]);
    await node.execOk(["systemctl", "enable", initUnit]);
  }
  return { node, machine, user, token, metricsPort };
}

const csrsOf = async (user: string) => (await csrApi(cluster).listCertificateSigningRequest()).items.filter((c) => c.spec.username === user);

/** openssl's reading of the PEM request in a CSR object: its subject and the verdict on its signature. */
async function opensslRequest(csr: V1CertificateSigningRequest): Promise<string> {
  const file = `${runDir("bootstrap-e2e")}/${csr.metadata?.name}.pem`;
  writeFileSync(file, Buffer.from(csr.spec.request, "base64"));
  const r = await run(["openssl", "req", "-verify", "-noout", "-subject", "-in", file]);
  return r.stdout + r.stderr;
}

async function unitState(node: Node, unit: string): Promise<Record<string, string>> {
  const out = await node.execOk(["systemctl", "show", "-p", "ActiveState", "-p", "Result", "-p", "UnitFileState", "-p", "MainPID", unit]);
  return Object.fromEntries(out.trim().split("\n").map((l) => [l.slice(0, l.indexOf("=")), l.slice(l.indexOf("=") + 1)]));
}

/** The verbs `user` used on CSRs, from the audit log: docs/rbac.md promises create and get only. */
const csrVerbsOf = (user: string) =>
  new Set(
    readFileSync(cluster.auditLog, "utf8")
      .split("\n")
      .filter((l) => l.includes(`"username":${JSON.stringify(user)}`) && l.includes('"resource":"certificatesigningrequests"'))
      .map((l) => JSON.parse(l).verb as string),
  );

const modeOf = async (node: Node, path: string) => (await node.execOk(["stat", "-c", "%a", path])).trim();
const exists = async (node: Node, path: string) => (await node.exec(["test", "-e", path])).code === 0;

describe("bootstrap with a bootstrap token", () => {
  let m: Prepared;
  let csrName: string;

  test("a CSR with gardener-node-agent's subject, signer, usages and lifetime; once approved: the kubeconfig, the agent running as the machine's user, the init unit disabled, kubelet's bootstrap kubeconfig", async () => {
    m = await prepareNode("boot", { initUnit: true });
    const { node, machine, user, token } = m;
    await node.execOk(["systemctl", "start", "--no-block", initUnit]);

    const csr = await waitForCsr(cluster, `a CSR from ${token.user}`, (c) => c.spec.username === token.user);
    csrName = csr.metadata?.name as string;
    expect(csrName).toMatch(/^node-agent-csr-[A-Za-z0-9_-]{43}$/);
    expect(csr.spec.signerName).toBe("kubernetes.io/kube-apiserver-client");
    expect([...(csr.spec.usages ?? [])].sort()).toEqual(["client auth", "digital signature", "key encipherment"]);
    expect(csr.spec.expirationSeconds).toBe(2_592_000);
    expect(csr.spec.groups).toContain("system:bootstrappers");
    const request = await opensslRequest(csr);
    expect(request).toContain(`subject=O = gardener.cloud:node-agents, CN = gardener.cloud:node-agent:machine:${machine}`);
    expect(request).toContain("verify OK");
    // Waiting, the bootstrap has written nothing yet and keeps the key pending (0600).
    expect(await exists(node, kubeconfigPath)).toBe(false);
    expect(await modeOf(node, pendingPath)).toBe("600");

    await decideCsr(cluster, csrName, "Approved", "TestApproved", "approved by bootstrap.test.ts");
    // The init unit is a oneshot: it ends inactive with Result=success, and was not stopped halfway.
    await waitFor("the init unit to finish", async () => (await unitState(node, initUnit)).ActiveState === "inactive", 60_000, 200);
    expect(await unitState(node, initUnit)).toMatchObject({ Result: "success", UnitFileState: "disabled" });
    expect((await node.exec(["systemctl", "is-enabled", initUnit])).stdout.trim()).toBe("disabled");

    // The kubeconfig: 0600, the configured server and CA file, a certificate for the requested key.
    expect(await modeOf(node, kubeconfigPath)).toBe("600");
    const text = await node.readFile(kubeconfigPath);
    const cert = readClientCertificate(text);
    expect(cert).toMatchObject({ commonName: user, server: cluster.server, ca: { file: `${base}/cluster-ca.crt` } });
    const lifetimeH = ((cert?.notAfter.getTime() ?? 0) - Date.now()) / 3_600_000;
    expect(lifetimeH).toBeGreaterThan(719);
    expect(lifetimeH).toBeLessThanOrEqual(720);
    expect(new X509Certificate(cert?.certPem as string).checkIssued(new X509Certificate(readFileSync(cluster.clientCaFile)))).toBe(true);
    expect(await exists(node, pendingPath)).toBe(false);
    expect(csrVerbsOf(token.user)).toEqual(new Set(["create", "get"]));
    // The API server sees the machine's node-agent user.
    const me = JSON.parse(await node.execOk([bin, "whoami", "--kubeconfig", kubeconfigPath, "--json"]));
    expect(me.username).toBe(user);
    expect(me.groups).toContain("gardener.cloud:node-agents");

    // The agent's unit: gardener-node-agent's, enabled and running.
    expect(await node.readFile(`/etc/systemd/system/${agentUnit}`)).toBe(agentUnitContent({ configDir: base }));
    expect(await modeOf(node, `/etc/systemd/system/${agentUnit}`)).toBe("644");
    expect((await node.exec(["systemctl", "is-enabled", agentUnit])).stdout.trim()).toBe("enabled");
    await waitFor("the agent ready (its first reconcile finished)", async () => (await unitState(node, agentUnit)).ActiveState === "active", 60_000, 200);

    // kubelet's bootstrap kubeconfig, from the bootstrap token; the token itself stays for the agent to delete.
    expect(await modeOf(node, "/var/lib/kubelet/kubeconfig-bootstrap")).toBe("600");
    expect(parseYaml(await node.readFile("/var/lib/kubelet/kubeconfig-bootstrap"))).toMatchObject({
      "current-context": "kubelet-bootstrap",
      clusters: [{ name: "kubelet-bootstrap", cluster: { server: cluster.server, "certificate-authority": `${base}/cluster-ca.crt` } }],
      users: [{ name: "kubelet-bootstrap", user: { token: token.token } }],
    });
    expect(await node.readFile(`${base}/credentials/bootstrap-token`)).toBe(token.token);

    // The agent runs with the result: its Lease, created as the machine's user.
    const leases = cluster.admin().makeApiClient(CoordinationV1Api);
    await waitFor("the agent's Lease", () => leases.readNamespacedLease({ name: `gardener-node-agent-${node.name}`, namespace: "kube-system" }), 30_000, 200);
    const writers = readFileSync(cluster.auditLog, "utf8")
      .split("\n")
      .filter((l) => l.includes(`"resource":"leases"`) && l.includes(`gardener-node-agent-${node.name}`) && l.includes('"verb":"create"'))
      .map((l) => JSON.parse(l).user.username);
    expect(writers).toContain(user);

    // Its log: one structured line per step.
    const journal = await node.execOk(["journalctl", "-u", initUnit, "-o", "cat", "--no-pager"]);
    const lines = journal.split("\n").filter((l) => l.startsWith("{")).map((l) => JSON.parse(l) as { msg: string; command?: string; key?: string });
    expect(lines.map((l) => l.msg)).toEqual(
      expect.arrayContaining(["bootstrap starting", "created the CertificateSigningRequest", "wrote the agent's kubeconfig", "wrote kubelet's bootstrap kubeconfig", "wrote the agent's unit", "started the agent's unit", "disabled the init unit", "bootstrap finished"]),
    );
    // Credentials never reach the log.
    expect(journal).not.toContain(token.token);
    expect(journal).not.toContain("PRIVATE KEY");
    expect(journal).not.toContain(text.match(/client-key-data: (\S+)/)?.[1] as string);
  }, 180_000);

  test("run again while the agent runs: refused naming the agent's PID, as `trellis apply` is; nothing requested or restarted", async () => {
    const { node, token } = m;
    const before = { kubeconfig: await node.readFile(kubeconfigPath), pid: (await unitState(node, agentUnit)).MainPID };
    const r = await node.exec([bin, "bootstrap", "--config-dir", base]);
    expect(r.code).toBe(1);
    expect(r.stderr).toContain(`trellis bootstrap: another trellis is running on this machine: PID ${before.pid} (trellis run, since `);
    // Refused before the OSC file is even read.
    const apply = await node.exec([bin, "apply", "--osc", "/nonexistent.yaml"]);
    expect(apply.code).toBe(1);
    expect(apply.stderr).toContain(`trellis apply: another trellis is running on this machine: PID ${before.pid} (trellis run, since `);
    expect((await csrsOf(token.user)).map((c) => c.metadata?.name)).toEqual([csrName]);
    expect(await node.readFile(kubeconfigPath)).toBe(before.kubeconfig);
    expect((await unitState(node, agentUnit)).MainPID).toBe(before.pid);
  }, 60_000);

  test("run again with the agent stopped: nothing is requested, the agent started again", async () => {
    const { node, token } = m;
    const kubeconfig = await node.readFile(kubeconfigPath);
    await node.execOk(["systemctl", "stop", agentUnit]);
    const r = await node.exec([bin, "bootstrap", "--config-dir", base]);
    expect(r.code).toBe(0);
    expect(r.stderr).toContain("the agent's kubeconfig is valid; no client certificate is requested");
    expect((await csrsOf(token.user)).map((c) => c.metadata?.name)).toEqual([csrName]);
    expect(await node.readFile(kubeconfigPath)).toBe(kubeconfig);
    await waitFor("the agent ready (its first reconcile finished)", async () => (await unitState(node, agentUnit)).ActiveState === "active", 60_000, 200);
  }, 60_000);

  test("its certificate expired while the agent was stopped: a new CSR, and the agent started with the new kubeconfig", async () => {
    const { node, token, user } = m;
    const expired = await expiredCertificate(user);
    const pid = (await unitState(node, agentUnit)).MainPID;
    await node.execOk(["systemctl", "stop", agentUnit]);
    await node.writeFile(kubeconfigPath, renderKubeconfig({ server: cluster.server, ca: { file: `${base}/cluster-ca.crt` }, certPem: expired.certPem, keyPem: expired.keyPem }), 0o600);
    const bootstrap = node.exec([bin, "bootstrap", `--config-dir=${base}`]);
    const csr = await waitForCsr(cluster, "a second CSR", (c) => c.spec.username === token.user && c.metadata?.name !== csrName);
    await decideCsr(cluster, csr.metadata?.name as string, "Approved", "TestApproved", "expired certificate");
    const r = await bootstrap;
    expect(r.code).toBe(0);
    expect(r.stderr).toContain(`"because":"its client certificate expired at ${new Date(new X509Certificate(expired.certPem).validTo).toISOString()}"`);
    expect(r.stderr).toContain("started the agent's unit");
    const cert = readClientCertificate(await node.readFile(kubeconfigPath));
    expect(cert?.notAfter.getTime()).toBeGreaterThan(Date.now() + 719 * 3_600_000);
    await waitFor("the agent ready (its first reconcile finished)", async () => (await unitState(node, agentUnit)).ActiveState === "active", 60_000, 200);
    expect((await unitState(node, agentUnit)).MainPID).not.toBe(pid);
  }, 120_000);

  test("the agent started with a certificate that expired while the machine was off: it requests a new one with the bootstrap token itself and goes on", async () => {
    const { node, token, user } = m;
    await node.execOk(["systemctl", "stop", agentUnit]);
    const expired = await expiredCertificate(user);
    await node.writeFile(kubeconfigPath, renderKubeconfig({ server: cluster.server, ca: { file: `${base}/cluster-ca.crt` }, certPem: expired.certPem, keyPem: expired.keyPem }), 0o600);
    const earlier = new Set((await csrsOf(token.user)).map((c) => c.metadata?.name));
    await node.execOk(["systemctl", "start", "--no-block", agentUnit]);
    const csr = await waitForCsr(cluster, "a CSR from the agent", (c) => c.spec.username === token.user && !earlier.has(c.metadata?.name));
    await decideCsr(cluster, csr.metadata?.name as string, "Approved", "TestApproved", "expired while off");
    await waitFor("the agent ready (its first reconcile finished)", async () => (await unitState(node, agentUnit)).ActiveState === "active", 60_000, 200);
    const cert = readClientCertificate(await node.readFile(kubeconfigPath));
    expect(cert?.commonName).toBe(user);
    expect(cert?.notAfter.getTime()).toBeGreaterThan(Date.now() + 719 * 3_600_000);
    const journal = await node.execOk(["journalctl", "-u", agentUnit, "-o", "cat", "--no-pager"]);
    expect(journal).toContain(`"msg":"requesting a client certificate with the bootstrap token","kubeconfig":"${kubeconfigPath}","because":"its client certificate expired at ${new Date(new X509Certificate(expired.certPem).validTo).toISOString()}"`);
  }, 120_000);
});

/** A client certificate of `user` whose life ended an hour ago. */
function expiredCertificate(user: string) {
  return issueClientCert({
    dir: runDir("bootstrap-e2e"),
    commonName: user,
    organizations: ["gardener.cloud:node-agents"],
    notBefore: new Date(Date.now() - 2 * 3_600_000),
    notAfter: new Date(Date.now() - 3_600_000),
    ca: { certFile: cluster.clientCaFile, keyFile: cluster.clientCaKeyFile },
  });
}

describe("an expired certificate and no bootstrap token", () => {
  test("the agent ends with an error (journald priority err) that says what an operator must do, and requests nothing", async () => {
    const { node, user, token } = await prepareNode("expired", { token: false });
    const expired = await expiredCertificate(user);
    await node.writeFile(kubeconfigPath, renderKubeconfig({ server: cluster.server, ca: { file: `${base}/cluster-ca.crt` }, certPem: expired.certPem, keyPem: expired.keyPem }), 0o600);
    await node.writeFile(`/etc/systemd/system/${agentUnit}`, agentUnitContent({ configDir: base }));
    await node.execOk(["systemctl", "daemon-reload"]);
    await node.execOk(["systemctl", "start", "--no-block", agentUnit]);
    const said = await waitFor(
      "the agent's error",
      async () => {
        const out = await node.execOk(["journalctl", "-u", agentUnit, "-p", "err", "-o", "cat", "--no-pager"]);
        return out.includes("trellis run: ") ? out : undefined;
      },
      30_000,
      200,
    );
    expect(said).toContain(
      `trellis run: ${kubeconfigPath} is its client certificate expired at ${new Date(new X509Certificate(expired.certPem).validTo).toISOString()}, and there is no bootstrap token ${base}/credentials/bootstrap-token to request a client certificate with. ` +
        `An operator must either write a bootstrap token (<token-id>.<token-secret> of a bootstrap-token Secret in kube-system, allowed to create CSRs) to ${base}/credentials/bootstrap-token, ` +
        `or replace ${kubeconfigPath} with a kubeconfig holding a valid client certificate; then restart ${agentUnit}`,
    );
    expect(await csrsOf(token.user)).toEqual([]);
    // The process ended (its watchdog timer does not keep it alive), and systemd tries again.
    await waitFor("the agent restarted by systemd", async () => Number((await node.execOk(["systemctl", "show", "-P", "NRestarts", agentUnit])).trim()) >= 1, 30_000, 200);
    await node.execOk(["systemctl", "stop", agentUnit]);
  }, 60_000);
});

describe("a CSR that is not approved", () => {
  test("denied: the bootstrap fails naming the CSR and the reason; no kubeconfig, no agent unit", async () => {
    const { node, token, machine } = await prepareNode("deny");
    const bootstrap = node.exec([bin, "bootstrap", `--config-dir=${base}`, "--wait=2m"]);
    const csr = await waitForCsr(cluster, `a CSR from ${token.user}`, (c) => c.spec.username === token.user);
    const name = csr.metadata?.name as string;
    await decideCsr(cluster, name, "Denied", "MachineUnknown", `no machine ${machine} in this cluster`);
    const r = await bootstrap;
    expect(r.code).toBe(1);
    expect(r.stderr).toContain(`CertificateSigningRequest ${name} was denied: reason MachineUnknown, message "no machine ${machine} in this cluster"`);
    expect(r.stderr).toContain("bootstrap step a. the agent's client certificate");
    expect(await exists(node, kubeconfigPath)).toBe(false);
    // The key of a denied request is useless: the next run starts over with a new one.
    expect(await exists(node, pendingPath)).toBe(false);
    expect(await exists(node, `/etc/systemd/system/${agentUnit}`)).toBe(false);
  }, 120_000);

  test("not approved in time: fails, and the next run waits for the same CSR instead of making another", async () => {
    const { node, token, user } = await prepareNode("late");
    const first = await node.exec([bin, "bootstrap", `--config-dir=${base}`, "--wait=3s"]);
    expect(first.code).toBe(1);
    const [csr] = await csrsOf(token.user);
    const name = csr?.metadata?.name as string;
    expect(first.stderr).toContain(`CertificateSigningRequest ${name} was not approved within 3s`);
    expect(await exists(node, pendingPath)).toBe(true);

    const second = node.exec([bin, "bootstrap", `--config-dir=${base}`, "--wait=1m"]);
    await decideCsr(cluster, name, "Approved", "TestApproved", "late approval");
    const r = await second;
    expect(r.stderr).toContain("the CertificateSigningRequest exists already (a resumed request)");
    expect(r.code).toBe(0);
    expect((await csrsOf(token.user)).map((c) => c.metadata?.name)).toEqual([name]);
    expect(readClientCertificate(await node.readFile(kubeconfigPath))?.commonName).toBe(user);
  }, 120_000);

  test("no bootstrap token and no kubeconfig: a clear failure before anything is asked", async () => {
    const { node } = await prepareNode("notok", { token: false });
    const r = await node.exec([bin, "bootstrap", `--config-dir=${base}`]);
    expect(r.code).toBe(1);
    expect(r.stderr).toContain(`${kubeconfigPath} is missing, and there is no bootstrap token ${base}/credentials/bootstrap-token to request a client certificate with`);
  }, 60_000);
});

describe("the agent started with only a bootstrap token (gardener-node-agent's own flow)", () => {
  /** The agent's JSON lines of process `pid`. */
  async function agentSaid(node: Node, pid: string): Promise<{ msg: string; reason?: string; while?: string }[]> {
    const out = await node.execOk(["journalctl", "-u", agentUnit, "-o", "cat", "--no-pager", `_PID=${pid}`]);
    return out.split("\n").filter((l) => l.startsWith("{")).map((l) => JSON.parse(l));
  }
  const waitingPid = (node: Node) =>
    waitFor("the agent waiting for its CSR", async () => {
      const pid = (await unitState(node, agentUnit)).MainPID as string;
      return pid !== "0" && (await agentSaid(node, pid)).some((l) => l.msg === "waiting for the CertificateSigningRequest to be approved") ? pid : undefined;
    }, 60_000, 100);

  test("it requests its certificate and waits; SIGTERM ends the wait at once, the pending request intact; the next start waits for the same CSR; a denied one is replaced by a new CSR; approved, the agent runs as the machine's user", async () => {
    const { node, token, user } = await prepareNode("sigcsr");
    await node.writeFile(`/etc/systemd/system/${agentUnit}`, agentUnitContent({ configDir: base, restartSec: 1 }));
    await node.execOk(["systemctl", "daemon-reload"]);
    await node.execOk(["systemctl", "start", "--no-block", agentUnit]);
    const csr = await waitForCsr(cluster, `a CSR from ${token.user}`, (c) => c.spec.username === token.user);
    const name = csr.metadata?.name as string;
    const pid = await waitingPid(node);
    const pending = await node.readFile(pendingPath);

    const started = performance.now();
    await node.execOk(["systemctl", "stop", agentUnit]);
    const seconds = (performance.now() - started) / 1000;
    console.log(`[bootstrap] stop while the agent waits for its CSR: ${seconds.toFixed(2)} s`);
    expect(seconds).toBeLessThan(2);
    // It ended by itself after a graceful stop, not by systemd's SIGKILL or its own signal.
    expect(await unitState(node, agentUnit)).toMatchObject({ Result: "success", ActiveState: "inactive" });
    expect((await node.execOk(["systemctl", "show", "-P", "ExecMainStatus", agentUnit])).trim()).toBe("0");
    await waitFor("its stop logged", async () => (await agentSaid(node, pid)).some((l) => l.msg === "trellis stopping" && l.while === "waiting for its client certificate"), 10_000, 100);
    // Nothing half-written: the same request, 0600, no kubeconfig, no temp file beside them.
    expect(await node.readFile(pendingPath)).toBe(pending);
    expect(await modeOf(node, pendingPath)).toBe("600");
    expect(await exists(node, kubeconfigPath)).toBe(false);
    expect((await node.execOk(["ls", "-A", `${base}/credentials`])).trim().split("\n").sort()).toEqual(["bootstrap-token", "csr-pending.json"]);

    // Started again: the same CSR, no second one.
    await node.execOk(["systemctl", "start", "--no-block", agentUnit]);
    const again = await waitingPid(node);
    expect((await agentSaid(node, again)).map((l) => l.msg)).toEqual(expect.arrayContaining(["resuming the pending certificate request", "the CertificateSigningRequest exists already (a resumed request)"]));
    expect((await csrsOf(token.user)).map((c) => c.metadata?.name)).toEqual([name]);

    // Denied: the agent fails, its request goes, and systemd's next start asks anew.
    await decideCsr(cluster, name, "Denied", "TestDenied", "denied by bootstrap.test.ts");
    const second = await waitForCsr(cluster, "a new CSR after the denial", (c) => c.spec.username === token.user && c.metadata?.name !== name);
    expect(await node.execOk(["journalctl", "-u", agentUnit, "-o", "cat", "--no-pager", `_PID=${again}`])).toContain(`trellis run: CertificateSigningRequest ${name} was denied: reason TestDenied`);
    await decideCsr(cluster, second.metadata?.name as string, "Approved", "TestApproved", "approved by bootstrap.test.ts");
    await waitFor("the agent ready (its first reconcile finished)", async () => (await unitState(node, agentUnit)).ActiveState === "active", 60_000, 200);
    expect(readClientCertificate(await node.readFile(kubeconfigPath))?.commonName).toBe(user);
    expect(await exists(node, pendingPath)).toBe(false);
    // It runs as itself: its Lease written as the machine's user; the bootstrap token only ever asked for CSRs.
    const leases = cluster.admin().makeApiClient(CoordinationV1Api);
    await waitFor("the agent's Lease", () => leases.readNamespacedLease({ name: `gardener-node-agent-${node.name}`, namespace: "kube-system" }), 30_000, 200);
    const audit = readFileSync(cluster.auditLog, "utf8").split("\n").filter((l) => l.startsWith("{")).map((l) => JSON.parse(l) as { verb: string; user: { username: string }; objectRef?: { resource?: string; name?: string } });
    const leaseWriters = audit.filter((e) => e.objectRef?.resource === "leases" && e.objectRef.name === `gardener-node-agent-${node.name}` && e.verb !== "get").map((e) => e.user.username);
    expect(new Set(leaseWriters)).toEqual(new Set([user]));
    expect(new Set(audit.filter((e) => e.user.username === token.user).map((e) => e.objectRef?.resource))).toEqual(new Set(["certificatesigningrequests"]));
    await node.execOk(["systemctl", "stop", agentUnit]);
  }, 180_000);
});

describe("renewal by the running agent", () => {
  test("a certificate past 80 % of its life is renewed through a CSR made with it; the agent goes on, without a restart, with the new one", async () => {
    const { node, user, metricsPort } = await prepareNode("renew", { token: false });
    // 65 minutes of life, 60 of them gone (92 %): due at once, 5 minutes left to do it in. The marker
    // group tells the old certificate's requests from the new one's in the audit log.
    const marker = "trellis-e2e:old-certificate";
    const old = await issueClientCert({
      dir: runDir("bootstrap-e2e"),
      commonName: user,
      organizations: ["gardener.cloud:node-agents", marker],
      notBefore: new Date(Date.now() - 60 * 60_000),
      notAfter: new Date(Date.now() + 5 * 60_000),
      ca: { certFile: cluster.clientCaFile, keyFile: cluster.clientCaKeyFile },
    });
    await node.writeFile(kubeconfigPath, renderKubeconfig({ server: cluster.server, ca: { file: `${base}/cluster-ca.crt` }, certPem: old.certPem, keyPem: old.keyPem }), 0o600);
    await node.writeFile(`/etc/systemd/system/${agentUnit}`, agentUnitContent({ configDir: base }));
    await node.execOk(["systemctl", "daemon-reload"]);
    await node.execOk(["systemctl", "start", agentUnit]);
    const pid = (await unitState(node, agentUnit)).MainPID;

    // The renewal CSR is made with the current certificate: its user and groups.
    const csr = await waitForCsr(cluster, `a renewal CSR from ${user}`, (c) => c.spec.username === user);
    expect(csr.spec.groups).toContain(marker);
    expect(csr.spec.signerName).toBe("kubernetes.io/kube-apiserver-client");
    expect(csr.spec.expirationSeconds).toBe(2_592_000);
    expect(await opensslRequest(csr)).toContain(`subject=O = gardener.cloud:node-agents, CN = ${user}`);
    await decideCsr(cluster, csr.metadata?.name as string, "Approved", "TestApproved", "renewal");

    const renewed = await waitFor(
      "the kubeconfig to hold a new certificate",
      async () => {
        const c = readClientCertificate(await node.readFile(kubeconfigPath));
        return c && c.certPem !== old.certPem ? c : undefined;
      },
      30_000,
      100,
    );
    const swappedAt = Date.now();
    expect(renewed).toMatchObject({ commonName: user, server: cluster.server, ca: { file: `${base}/cluster-ca.crt` } });
    expect(renewed.notAfter.getTime() - Date.now()).toBeGreaterThan(719 * 3_600_000);
    expect(await modeOf(node, kubeconfigPath)).toBe("600");
    expect(await exists(node, pendingPath)).toBe(false);
    expect(csrVerbsOf(user)).toEqual(new Set(["create", "get"]));

    // The agent goes on, in the same process, with the new certificate: its next Lease renewals carry
    // the new certificate's groups (no marker). Renewals come every 10 s.
    const leaseUpdates = () =>
      readFileSync(cluster.auditLog, "utf8")
        .split("\n")
        .filter((l) => l.includes(`"username":${JSON.stringify(user)}`) && l.includes('"verb":"update"') && l.includes(`gardener-node-agent-${node.name}`))
        .map((l) => JSON.parse(l) as { stageTimestamp: string; user: { groups?: string[] }; responseStatus?: { code?: number } });
    await waitFor(
      "a Lease renewal with the new certificate",
      () => leaseUpdates().some((e) => Date.parse(e.stageTimestamp) > swappedAt && !e.user.groups?.includes(marker) && e.responseStatus?.code === 200),
      30_000,
      500,
    );
    const after = leaseUpdates().filter((e) => Date.parse(e.stageTimestamp) > swappedAt + 1_000);
    expect(after.filter((e) => e.user.groups?.includes(marker))).toEqual([]);
    expect((await unitState(node, agentUnit)).MainPID).toBe(pid);

    // /metrics tells the new expiry; the old certificate is still valid, so nothing else happened meanwhile.
    const metrics = await (await fetch(`http://127.0.0.1:${metricsPort}/metrics`)).text();
    expect(metrics).toContain(`trellis_client_certificate_expiration_timestamp_seconds ${renewed.notAfter.getTime() / 1000}`);
    expect(metrics).toContain('trellis_client_certificate_renewals_total{result="success"} 1');
    // …and so does `trellis status`.
    await waitFor(
      "trellis status to show the new certificate",
      async () => (await node.exec([bin, "status"])).stdout.includes(`valid until ${renewed.notAfter.toISOString()}`),
      15_000,
      500,
    );
  }, 180_000);
});

/** A loop device over a sparse file of `size` bytes, attached on the host for one node; detached by afterAll. */
async function loopDevice(size: number): Promise<string> {
  const file = `${runDir("bootstrap-e2e")}/disk-${size}.img`;
  await runOk(["truncate", "-s", String(size), file]);
  const dev = (await runOk(["losetup", "--find", "--show", file])).trim();
  loops.push({ dev, file });
  return dev;
}
const loops: { dev: string; file: string }[] = [];
afterAll(async () => {
  // After the nodes (whose mount namespaces held the mounts) are gone: registered after their afterAll.
  for (const l of loops) {
    await run(["losetup", "-d", l.dev]);
    rmSync(l.file, { force: true });
  }
}, 60_000);

describe("bootstrap.kubeletDataVolumeSize (gardener-node-agent's kubelet data volume)", () => {
  // Sizes no disk of this machine has (lsblk in a node lists the host's disks; only the node's loop device exists in its /dev).
  const size = 64 * 1024 * 1024 + 7 * 4096;

  test("the empty disk of that size is formatted ext4 KUBEDEV, /var/lib/kubelet moved onto it and mounted; run again, nothing happens", async () => {
    const loop = await loopDevice(size);
    const m = await prepareNode("kdv", { initUnit: true, loopDevices: [loop], config: `bootstrap:\n  kubeletDataVolumeSize: ${size}\n` });
    const { node, token } = m;
    await node.writeFile("/var/lib/kubelet/from-before", "kept\n");
    await node.execOk(["systemctl", "start", "--no-block", initUnit]);
    const csr = await waitForCsr(cluster, `a CSR from ${token.user}`, (c) => c.spec.username === token.user);
    await decideCsr(cluster, csr.metadata?.name as string, "Approved", "TestApproved", "approved by bootstrap.test.ts");
    await waitFor("the init unit to finish", async () => (await unitState(node, initUnit)).ActiveState === "inactive", 60_000, 200);
    expect(await unitState(node, initUnit)).toMatchObject({ Result: "success" });

    const [source, fstype, options] = (await node.execOk(["findmnt", "-n", "-o", "SOURCE,FSTYPE,OPTIONS", "/var/lib/kubelet"])).trim().split(/\s+/);
    expect({ source, fstype }).toEqual({ source: loop, fstype: "ext4" });
    expect((await node.execOk(["blkid", "-s", "LABEL", "-o", "value", loop])).trim()).toBe("KUBEDEV");
    // Gardener's project quotas where the kernel mounts them (this machine's kernel lacks CONFIG_QFMT_V2: formatted without).
    const features = (await node.execOk(["tune2fs", "-l", loop])).match(/^Filesystem features:.*$/m)?.[0] ?? "";
    expect({ options: options?.includes("prjquota"), errors: options?.includes("errors=remount-ro") }).toEqual({ options: features.includes("project"), errors: true });
    // What was there before moved onto the volume, and what the bootstrap wrote afterwards is on it too.
    expect(await node.readFile("/var/lib/kubelet/from-before")).toBe("kept\n");
    expect(await exists(node, "/var/lib/kubelet/kubeconfig-bootstrap")).toBe(true);
    expect(await node.exec(["ls", "/var/lib/gardener-node-agent/tmp"]).then((r) => r.stdout.trim())).toBe("");

    // A second bootstrap is refused while the agent it started holds the state directory (one trellis at a time).
    await node.execOk(["systemctl", "stop", agentUnit]);
    const again = await node.exec([bin, "bootstrap", `--config-dir=${base}`]);
    expect(again.code).toBe(0);
    expect(again.stderr).toContain(`${loop} is labelled KUBEDEV already: nothing to do`);
    expect(await node.readFile("/var/lib/kubelet/from-before")).toBe("kept\n");
  }, 180_000);

  test("no empty disk of that size: a clear failure naming the field, and a disk with a filesystem is left as it was", async () => {
    const other = size + 4096;
    const loop = await loopDevice(other);
    await runOk(["mkfs.ext4", "-q", "-L", "KEEPME", loop]);
    const { node } = await prepareNode("kdvbad", { loopDevices: [loop], config: `bootstrap:\n  kubeletDataVolumeSize: ${other}\n` });
    const r = await node.exec([bin, "bootstrap", `--config-dir=${base}`]);
    expect(r.code).toBe(1);
    expect(r.stderr).toContain(`bootstrap step 0. the kubelet data volume`);
    // lsblk in the node sees no filesystem (no udev there); the disk itself shows one, and is not formatted.
    expect(r.stderr).toContain(`no empty, unpartitioned disk of ${other} bytes (bootstrap.kubeletDataVolumeSize) to format for /var/lib/kubelet; of that size: ${loop} (ext4)`);
    expect((await runOk(["blkid", "-s", "LABEL", "-o", "value", loop])).trim()).toBe("KEEPME");
    expect((await node.exec(["findmnt", "/var/lib/kubelet"])).code).toBe(1);
  }, 120_000);
});
