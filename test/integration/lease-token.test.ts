// src/controllers/lease.ts and token.ts against a real kube-apiserver, each run as a user holding exactly
// the rules docs/rbac.md lists for it. Lease: the object gardener-node-agent writes (owner, holder,
// duration, a MicroTime renewTime on the wire), renewed with one request per renewal, deleted with its
// Node by kube-controller-manager's garbage collector and not created again while the Node is gone,
// renewing through a kube-apiserver restart, and a hung request abandoned in time. Token: the file
// written 0640 with exactly the token, rewritten only when it differs (Secret changed, file deleted or
// changed on disk), left alone when its Secret has no token or is deleted, and no Secret but the
// configured ones ever asked for.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { chmodSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from "node:fs";
import { createServer, type Socket } from "node:net";
import { CoreV1Api, type V1Lease, type V1Node } from "@kubernetes/client-node";
import { leaseName, startLeaseController } from "../../src/controllers/lease.ts";
import { startNodeSource } from "../../src/controllers/node-source.ts";
import { startTokenController, type TokenController, type TokenSyncConfig } from "../../src/controllers/token.ts";
import type { Controller, NodeSource } from "../../src/controllers/types.ts";
import { createFiles } from "../../src/host/files.ts";
import { type Kube, kubeFromConnection } from "../../src/kube/client.ts";
import { kubeGet } from "../../src/kube/http.ts";
import { createLogger, type Logger } from "../../src/log.ts";
import { createRegistry, type Registry } from "../../src/metrics.ts";
import { type Cluster, startCluster } from "../harness/cluster.ts";
import { runDir, waitFor } from "../harness/exec.ts";
import { auditOf, userWithRules } from "../harness/rbac.ts";
import { memoryStatusBoard, metricSample } from "../harness/observe.ts";
import { testKube } from "../harness/test-kube.ts";

const namespace = "kube-system";

let cluster: Cluster;
let core: CoreV1Api;
let admin: Kube;

beforeAll(async () => {
  // With kube-controller-manager: its garbage collector deletes a Lease with its Node.
  cluster = await startCluster();
  core = cluster.admin().makeApiClient(CoreV1Api);
  admin = kubeFromConnection({ kind: "kubeconfig", path: cluster.adminKubeconfig });
}, 180_000);
afterAll(() => cluster?.stop(), 30_000);

type Logs = { log: Logger; lines: Record<string, unknown>[] };
function logs(): Logs {
  const lines: Record<string, unknown>[] = [];
  return { log: createLogger({ level: "debug", write: (l) => lines.push(JSON.parse(l)) }), lines };
}



const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

describe("lease", () => {
  /** The Lease as kube-apiserver sends it (client-node would decode the times); undefined when there is none. */
  async function rawLease(name: string): Promise<{ text: string; lease: V1Lease & { spec?: { renewTime?: string } } } | undefined> {
    const res = await kubeGet(admin, `/apis/coordination.k8s.io/v1/namespaces/${namespace}/leases/${name}`, {}, AbortSignal.timeout(10_000));
    const text = await res.text();
    if (res.status === 404) return undefined;
    expect(res.status).toBe(200);
    return { text, lease: JSON.parse(text) };
  }
  const renewTimeOf = async (name: string) => (await rawLease(name))?.lease.spec?.renewTime ?? "";

  /** A Node (as kubelet would register it) and a node agent user holding docs/rbac.md's lease and node rules. */
  async function nodeAndAgent(name: string): Promise<{ node: V1Node; kube: Kube; source: NodeSource & Controller }> {
    const node = await core.createNode({ body: { metadata: { name, labels: { "kubernetes.io/hostname": name } } } });
    const leaseRule = { apiGroups: ["coordination.k8s.io"], resources: ["leases"] };
    const { kube } = await userWithRules(cluster, `agent-${name}`, [
      { namespace, rules: [{ ...leaseRule, verbs: ["create"] }, { ...leaseRule, verbs: ["get", "update"], resourceNames: [leaseName(name)] }] },
      { rules: [{ apiGroups: [""], resources: ["nodes"], verbs: ["get", "list", "watch"] }] },
    ]);
    return { node, kube, source: startNodeSource({ kube, hostName: name, log: logs().log }) };
  }

  test("the Lease: owned by the Node, holder, 40 s, a 6-digit renewTime that advances, one update per renewal; deleted with the Node", async () => {
    const name = "lease-node-a";
    const lease = leaseName(name);
    expect(lease).toBe("gardener-node-agent-lease-node-a");
    const { node, kube, source } = await nodeAndAgent(name);
    const metrics = createRegistry();
    const status = memoryStatusBoard();
    const l = logs();
    const controller = startLeaseController({ kube, node: source, log: l.log, metrics, status, intervalMs: 300 });
    try {
      const first = await waitFor("the Lease", () => rawLease(lease), 10_000);
      expect(first.lease.metadata?.ownerReferences).toEqual([{ apiVersion: "v1", kind: "Node", name, uid: node.metadata?.uid as string, controller: true }]);
      expect(first.lease.spec).toEqual({ holderIdentity: lease, leaseDurationSeconds: 40, renewTime: expect.stringMatching(/^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$/) });
      // In the raw JSON: the API server keeps what it was sent, 6 fractional digits.
      expect(first.text).toMatch(/"renewTime":"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z"/);
      const firstRenew = first.lease.spec?.renewTime as string;
      await waitFor("renewTime to advance", async () => (await renewTimeOf(lease)) > firstRenew, 5_000, 50);

      await sleep(1_500);
      const latest = Date.parse(await renewTimeOf(lease));
      expect(metricSample(metrics, "trellis_lease_last_renew_timestamp_seconds")).toBeWithin(latest / 1000 - 1, latest / 1000 + 1);
      expect(metricSample(metrics, "trellis_lease_renew_failures_total")).toBeUndefined(); // no failure yet
      expect(status.of("lease")).toMatchObject({ ok: true, summary: expect.stringMatching(/^renewed at \S+Z, every 0\.3 s \(lease 40 s\)$/), failures: 0 });
      expect(l.lines).toContainEqual(expect.objectContaining({ level: "info", msg: "renewing the Lease", lease: `kube-system/${lease}`, controller: "lease" }));

      // The first renewal looks for the Lease and creates it; every later one is a single update.
      const requests = auditOf(cluster, `agent-${name}`).filter((e) => e.objectRef?.resource === "leases");
      expect(requests.slice(0, 2).map((e) => [e.verb, e.responseStatus?.code])).toEqual([["get", 404], ["create", 201]]);
      const updates = requests.slice(2);
      expect(updates.length).toBeGreaterThanOrEqual(5);
      for (const e of updates) expect([e.verb, e.objectRef?.name, e.responseStatus?.code]).toEqual(["update", lease, 200]);
      // The renewals leave managedFields out of their bodies; the API server kept what it recorded.
      const fields = (await rawLease(lease))?.lease.metadata?.managedFields ?? [];
      expect(fields.map((f) => Object.keys((f.fieldsV1 ?? {}) as object))).toContainEqual(["f:metadata", "f:spec"]);

      // The garbage collector deletes the Lease with its Node, and the controller does not create it again.
      await core.deleteNode({ name });
      const t0 = performance.now();
      await waitFor("the garbage collector to delete the Lease", async () => (await rawLease(lease)) === undefined, 30_000, 100);
      console.log(`lease deleted ${Math.round(performance.now() - t0)} ms after its Node`);
      await waitFor("the controller to notice", () => status.of("lease")?.ok === false, 5_000, 50);
      await sleep(1_500);
      expect(await rawLease(lease)).toBeUndefined();
      expect(status.of("lease")).toMatchObject({ ok: false, summary: "the Node is gone (deleted); not renewing its Lease" });
      expect(l.lines.filter((x) => x.msg === "the Node is gone; not renewing its Lease until it is back")).toHaveLength(1);

      // A Node of that name registered again (a new uid): its Lease comes back, owned by the new Node.
      const again = await core.createNode({ body: { metadata: { name, labels: { "kubernetes.io/hostname": name } } } });
      const back = await waitFor("the Lease to come back", () => rawLease(lease), 10_000, 100);
      expect(back.lease.metadata?.ownerReferences?.map((r) => r.uid)).toEqual([again.metadata?.uid as string]);
      await waitFor("the status to recover", () => status.of("lease")?.ok === true, 5_000, 50);
    } finally {
      await controller.stop();
      await source.stop();
    }
    // Stopped: nothing renews it any more.
    const stoppedAt = await renewTimeOf(lease);
    await sleep(700);
    expect(await renewTimeOf(lease)).toBe(stoppedAt);
  }, 90_000);

  test("renewing goes on through a kube-apiserver restart: the failures are counted, then it renews again", async () => {
    const name = "lease-node-b";
    const lease = leaseName(name);
    const { kube, source } = await nodeAndAgent(name);
    const metrics = createRegistry();
    const status = memoryStatusBoard();
    const l = logs();
    const controller = startLeaseController({ kube, node: source, log: l.log, metrics, status, intervalMs: 300 });
    try {
      await waitFor("the Lease", () => status.of("lease")?.ok === true, 10_000, 50);
      const t0 = performance.now();
      await cluster.restartApiServer();
      const restartedAt = Date.now();
      const failures = metricSample(metrics, "trellis_lease_renew_failures_total") ?? 0;
      console.log(`kube-apiserver restart took ${Math.round(performance.now() - t0)} ms; ${failures} renewals failed meanwhile`);
      expect(failures).toBeGreaterThanOrEqual(3);
      // Still ok: the last renewal is younger than the lease.
      expect(status.of("lease")).toMatchObject({ ok: true });

      await waitFor("a renewal after the restart", async () => Date.parse(await renewTimeOf(lease)) > restartedAt, 10_000, 100);
      await waitFor("the status to say so", () => status.of("lease")?.failures === 0, 5_000, 50);
      expect(status.of("lease")).toMatchObject({ ok: true, summary: expect.stringMatching(/^renewed at /) });
      expect(l.lines).toContainEqual(expect.objectContaining({ level: "warn", msg: "could not renew the Lease; trying again at the next interval" }));
      expect(l.lines).toContainEqual(expect.objectContaining({ level: "info", msg: "renewed the Lease again", failuresBefore: expect.any(Number) }));
      expect(metricSample(metrics, "trellis_lease_last_renew_timestamp_seconds")).toBeGreaterThan(restartedAt / 1000);
    } finally {
      await controller.stop();
      await source.stop();
    }
  }, 90_000);

  test("a request that hangs is abandoned after a quarter of the lease; stop() is prompt even then", async () => {
    // A server that accepts connections and never answers: not even the TLS handshake completes.
    const sockets: Socket[] = [];
    const server = createServer((s) => void sockets.push(s));
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
    const port = (server.address() as { port: number }).port;
    const kube = testKube({ server: `https://127.0.0.1:${port}`, caPem: cluster.caPem, token: "t" });
    const node: V1Node = { metadata: { name: "hung-node", uid: "00000000-0000-0000-0000-000000000001" } };
    const source: NodeSource = { current: () => node, subscribe: () => () => undefined, found: Promise.resolve(node), listed: Promise.resolve() };
    const metrics = createRegistry();
    const status = memoryStatusBoard();
    // 2 s lease: each request is given 0.5 s.
    const controller = startLeaseController({ kube, node: source, log: logs().log, metrics, status, intervalMs: 200, durationSeconds: 2 });
    try {
      const t0 = performance.now();
      await waitFor("three failed renewals", () => (metricSample(metrics, "trellis_lease_renew_failures_total") ?? 0) >= 3, 10_000, 10);
      const elapsed = performance.now() - t0;
      expect(elapsed).toBeGreaterThan(1_400);
      expect(elapsed).toBeLessThan(2_500);
      expect(sockets.length).toBeGreaterThanOrEqual(3); // each attempt really went out
      expect(status.of("lease")).toMatchObject({
        ok: false,
        summary: expect.stringContaining(`never renewed; 3 failure(s) in a row: renewing Lease kube-system/gardener-node-agent-hung-node: no answer from https://127.0.0.1:${port} within 0.5 s`),
      });
      await sleep(100); // a request in flight
    } finally {
      const t1 = performance.now();
      await controller.stop();
      expect(performance.now() - t1).toBeLessThan(200);
      for (const s of sockets) s.destroy();
      server.close();
    }
  }, 20_000);
});

describe("token", () => {
  const agentSecret = "gardener-node-agent";
  const otherSecret = "other-token";
  const agentPath = "/var/lib/gardener-node-agent/credentials/token";
  const otherPath = "/etc/other/token";
  const syncConfigs: TokenSyncConfig[] = [
    { secretName: agentSecret, path: agentPath },
    { secretName: otherSecret, path: otherPath },
  ];
  const user = "token-agent";
  // Not UTF-8, with a trailing newline: the file must hold exactly these bytes.
  const tokenV1 = Buffer.concat([Buffer.from("v1."), Buffer.from([0, 0xff, 0xfe, 0x80]), Buffer.from("\n")]);
  const tokenV2 = Buffer.from("eyJhbGciOiJSUzI1NiJ9.v2.signature");

  let root: string;
  let metrics: Registry;
  let status: ReturnType<typeof memoryStatusBoard>;
  let l: Logs;
  let controller: TokenController;
  const host = (path: string) => root + path;
  const content = (path: string) => readFileSync(host(path));
  const writesOf = (secret: string) => metricSample(metrics, `trellis_token_writes_total{secret="${secret}"}`) ?? 0;
  /** A write is counted (and logged) once the directory is fsynced, a moment after the file shows: wait for it. */
  async function expectWrites(secret: string, n: number): Promise<void> {
    await waitFor(`${n} write(s) counted`, () => writesOf(secret) >= n, 2_000, 10).catch(() => undefined);
    expect(writesOf(secret)).toBe(n);
  }
  const putToken = (name: string, token: Buffer | undefined, labels?: Record<string, string>) =>
    core.replaceNamespacedSecret({ name, namespace, body: { metadata: { name, labels }, data: token ? { token: token.toString("base64") } : {} } });

  beforeAll(async () => {
    // Exactly docs/rbac.md's secret rule, naming the token secrets.
    const { kube } = await userWithRules(cluster, user, [
      { namespace, rules: [{ apiGroups: [""], resources: ["secrets"], resourceNames: [agentSecret, otherSecret], verbs: ["get", "list", "watch"] }] },
    ]);
    await core.createNamespacedSecret({ namespace, body: { metadata: { name: agentSecret }, data: { token: tokenV1.toString("base64") } } });
    // A Secret with a token that is not configured: it must never be asked for.
    await core.createNamespacedSecret({ namespace, body: { metadata: { name: "unrelated" }, data: { token: Buffer.from("not yours").toString("base64") } } });
    root = runDir("token-root");
    metrics = createRegistry();
    status = memoryStatusBoard();
    l = logs();
    // A short syncPeriod, so that the watches start afresh (a LIST) several times during these tests.
    controller = startTokenController({ kube, files: createFiles(root), log: l.log, metrics, status, syncConfigs, syncPeriodMs: 1_500, checkIntervalMs: 200 });
  }, 30_000);
  afterAll(() => controller?.stop());

  test("the token is written with mode 0640 and exactly the Secret's bytes; a missing Secret is reported", async () => {
    await waitFor("the token file", () => statSync(host(agentPath), { throwIfNoEntry: false }), 10_000, 50);
    expect(content(agentPath)).toEqual(tokenV1);
    expect(statSync(host(agentPath)).mode & 0o7777).toBe(0o640);
    await expectWrites(agentSecret, 1);
    const missing = `${otherPath}: Secret kube-system/${otherSecret} not found`;
    await waitFor("the status to name only the missing Secret", () => status.of("token")?.summary === missing, 5_000, 20);
    expect(status.of("token")?.ok).toBe(false);
    expect(statSync(host(otherPath), { throwIfNoEntry: false })).toBeUndefined();
    expect(l.lines).toContainEqual(expect.objectContaining({ level: "warn", msg: "the token Secret does not exist (yet); its file is left as it is", secret: `kube-system/${otherSecret}` }));
    expect(l.lines).toContainEqual(expect.objectContaining({ level: "info", msg: "wrote the token file", path: agentPath, why: "missing" }));
  });

  test("an unchanged token is not written again: not on a Secret change elsewhere, not on a fresh list, not at the checks", async () => {
    const before = statSync(host(agentPath), { bigint: true });
    const lists = () => auditOf(cluster, user).filter((e) => e.verb === "list" && e.objectRef?.name === agentSecret).length;
    const listsBefore = lists();
    await putToken(agentSecret, tokenV1, { changed: "labels-only" });
    await waitFor("a fresh list of the Secret", () => lists() > listsBefore, 5_000, 100);
    await sleep(500); // a few more checks
    const after = statSync(host(agentPath), { bigint: true });
    expect({ ino: after.ino, mtime: after.mtimeNs, ctime: after.ctimeNs }).toEqual({ ino: before.ino, mtime: before.mtimeNs, ctime: before.ctimeNs });
    expect(writesOf(agentSecret)).toBe(1);
    expect(readdirSync(host("/var/lib/gardener-node-agent/credentials"))).toEqual(["token"]); // no temp files
  });

  test("a changed token is written; a file deleted or changed on disk is written again within the check interval", async () => {
    await putToken(agentSecret, tokenV2);
    await waitFor("the new token", () => content(agentPath).equals(tokenV2), 5_000, 20);
    await expectWrites(agentSecret, 2);

    rmSync(host(agentPath));
    const t0 = performance.now();
    await waitFor("the file to be back", () => statSync(host(agentPath), { throwIfNoEntry: false }), 2_000, 10);
    const restoredMs = performance.now() - t0;
    expect(restoredMs).toBeLessThan(400); // check interval 200 ms
    expect(content(agentPath)).toEqual(tokenV2);
    expect(statSync(host(agentPath)).mode & 0o7777).toBe(0o640);

    writeFileSync(host(agentPath), "tampered");
    await waitFor("the content to be restored", () => content(agentPath).equals(tokenV2), 2_000, 10);
    chmodSync(host(agentPath), 0o644);
    await waitFor("the mode to be restored", () => (statSync(host(agentPath)).mode & 0o7777) === 0o640, 2_000, 10);
    expect(content(agentPath)).toEqual(tokenV2);
    await expectWrites(agentSecret, 5);
    const whys = l.lines.filter((x) => x.msg === "wrote the token file").map((x) => x.why);
    expect(whys).toEqual(["missing", "content differs from the Secret", "missing", "content differs from the Secret", "mode 0644, not 0640"]);
    console.log(`deleted token file restored after ${Math.round(restoredMs)} ms`);
    expect(status.of("token")).toMatchObject({ ok: false }); // the other Secret is still missing
  });

  test("a Secret without data.token is warned about and its file left alone; then a token arrives", async () => {
    await core.createNamespacedSecret({ namespace, body: { metadata: { name: otherSecret }, data: { "not-a-token": "eA==" } } });
    await waitFor("the warning", () => l.lines.some((x) => x.msg === "the token Secret has no data.token; its file is left as it is"), 5_000, 20);
    await sleep(500);
    expect(statSync(host(otherPath), { throwIfNoEntry: false })).toBeUndefined();
    expect(status.of("token")).toMatchObject({ ok: false, summary: `${otherPath}: Secret kube-system/${otherSecret} has no data.token` });

    await putToken(otherSecret, Buffer.from("other"));
    await waitFor("the other token file", () => statSync(host(otherPath), { throwIfNoEntry: false }), 5_000, 20);
    expect(content(otherPath).toString()).toBe("other");
    expect(statSync(host("/etc/other")).mode & 0o7777).toBe(0o755);
    await expectWrites(otherSecret, 1);
    await waitFor("all well", () => status.of("token")?.ok === true, 2_000, 20);
    expect(status.of("token")).toMatchObject({ ok: true, summary: "2 token file(s) match their Secret" });
  });

  test("resync, as after a service-account key rotation: each Secret listed afresh, the files in line, nothing left to report", async () => {
    const lists = () => auditOf(cluster, user).filter((e) => e.verb === "list" && e.objectRef?.name === otherSecret).length;
    const before = lists();
    expect(await controller.resync()).toEqual([]);
    await waitFor("a fresh list of the Secret", () => lists() > before, 5_000, 50);
    expect(content(agentPath)).toEqual(tokenV2);
    expect(content(otherPath).toString()).toBe("other");
  });

  test("a deleted Secret leaves its file as it is", async () => {
    await core.deleteNamespacedSecret({ name: agentSecret, namespace });
    await waitFor("the warning", () => l.lines.some((x) => x.msg === "the token Secret was deleted; its file is left as it is"), 5_000, 20);
    rmSync(host(otherPath)); // a check runs while the agent's Secret is gone
    await waitFor("the other file back", () => statSync(host(otherPath), { throwIfNoEntry: false }), 2_000, 10);
    await sleep(1_600); // and a fresh list
    expect(content(agentPath)).toEqual(tokenV2);
    expect(writesOf(agentSecret)).toBe(5);
    expect(status.of("token")).toMatchObject({ ok: false, summary: `${agentPath}: Secret kube-system/${agentSecret} not found` });
  });

  test("only the configured Secrets were asked for, each by name (field selector), and nothing was refused", async () => {
    const requests = auditOf(cluster, user);
    expect(requests.length).toBeGreaterThan(0);
    const verbs = new Set<string>();
    for (const e of requests) {
      verbs.add(e.verb);
      expect(e.objectRef?.resource).toBe("secrets");
      expect([agentSecret, otherSecret]).toContain(e.objectRef?.name as string);
      expect(e.requestURI).toContain(`fieldSelector=metadata.name%3D${e.objectRef?.name}`);
      expect(e.responseStatus?.code).toBe(200);
    }
    expect([...verbs].sort()).toEqual(["list", "watch"]);
    expect(requests.some((e) => e.requestURI.includes("unrelated"))).toBe(false);
    const t0 = performance.now();
    await controller.stop();
    expect(performance.now() - t0).toBeLessThan(500);
  });
});
