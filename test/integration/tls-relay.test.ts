// The tracing relay benchmarks put between an agent and the real API server (test/harness/tls-relay.ts):
// HTTP/1.1 and HTTP/2 (curl), JSON and protobuf bodies, a watch that stays open, and the bytes on the wire.
import { afterAll, beforeAll, expect, test } from "bun:test";
import { readFileSync } from "node:fs";
import { CoreV1Api } from "@kubernetes/client-node";
import { type Cluster, startCluster } from "../harness/cluster.ts";
import { runOk, waitFor } from "../harness/exec.ts";
import { startTlsRelay, type TlsRelay } from "../harness/tls-relay.ts";

let cluster: Cluster;
let relay: TlsRelay;
let user: { certFile: string; keyFile: string };

beforeAll(async () => {
  cluster = await startCluster({ controllerManager: false });
  user = await cluster.clientCertUser("relay-admin", ["system:masters"]);
  relay = await startTlsRelay({
    target: cluster.server,
    caPem: cluster.caPem,
    servingCertPem: readFileSync(cluster.serving.certFile, "utf8"),
    servingKeyPem: readFileSync(cluster.serving.keyFile, "utf8"),
    // The agent side presents no certificate; upstream, the relay uses the user's.
    clientCredentials: () => ({ certPem: readFileSync(user.certFile, "utf8"), keyPem: readFileSync(user.keyFile, "utf8") }),
  });
}, 120_000);
afterAll(async () => {
  await relay?.close();
  await cluster?.stop();
}, 30_000);

const curl = (protocol: "--http1.1" | "--http2", path: string, extra: string[] = []) =>
  runOk(["curl", "-sS", "--fail", protocol, "--cacert", cluster.caFile, ...extra, `${relay.server}${path}`]);

test("HTTP/1.1: method, path, status, JSON kinds and the bytes of heads and bodies", async () => {
  const body = JSON.stringify({ apiVersion: "v1", kind: "ConfigMap", metadata: { name: "traced" }, data: { a: "b" } });
  const out = await curl("--http1.1", "/api/v1/namespaces/default/configmaps", ["-X", "POST", "-H", "Content-Type: application/json", "--data-binary", body]);
  const [x] = relay.exchanges().filter((e) => e.path === "/api/v1/namespaces/default/configmaps");
  expect(x).toMatchObject({ protocol: "http/1.1", method: "POST", status: 201, done: true });
  expect(x?.request).toMatchObject({ bodyBytes: body.length, encoding: "json", kind: "ConfigMap" });
  expect(x?.response).toMatchObject({ bodyBytes: out.length, encoding: "json", kind: "ConfigMap" });
  expect(x?.request.headBytes).toBeWithin(100, 400);
  // Header names and sizes, as sent: "Content-Type: application/json\r\n" is 32 bytes.
  expect(x?.requestHeaders).toContainEqual(["Content-Type", 32]);
  expect((x?.requestHeaders ?? []).reduce((n, [, b]) => n + b, 0)).toBe((x?.request.headBytes ?? 0) - `POST ${x?.path} HTTP/1.1\r\n`.length - 2);
});

test("HTTP/2: the protocol the agent chose goes upstream; status, protobuf and JSON bodies, frames counted", async () => {
  const before = relay.exchanges().length;
  await curl("--http2", "/api/v1/namespaces", ["-H", "Accept: application/vnd.kubernetes.protobuf", "-o", "/dev/null"]);
  await curl("--http2", "/api/v1/namespaces/default/configmaps/traced");
  const [proto, json] = relay.exchanges().slice(before);
  expect(proto).toMatchObject({ protocol: "h2", stream: 1, status: 200, done: true, response: { encoding: "protobuf", kind: "NamespaceList" } });
  expect(json).toMatchObject({ protocol: "h2", stream: 1, status: 200, done: true, request: { bodyBytes: 0, encoding: "none" }, response: { encoding: "json", kind: "ConfigMap" } });
  const h2 = relay.connections().filter((c) => c.protocol === "h2");
  expect(h2).toHaveLength(2);
  for (const c of h2) expect(c.control.sent).toBeGreaterThanOrEqual(24); // the preface at least
});

test("a watch is an exchange that grows while it stays open; the wire carries more than the plaintext (TLS)", async () => {
  const core = cluster.admin().makeApiClient(CoreV1Api);
  const watch = Bun.spawn(["curl", "-sSN", "--http1.1", "--cacert", cluster.caFile, `${relay.server}/api/v1/namespaces/default/configmaps?watch=1&fieldSelector=metadata.name%3Dtraced`], { stdout: "pipe" });
  const x = await waitFor("the watch", () => relay.exchanges().find((e) => e.path?.includes("watch=1")));
  await waitFor("the ADDED event", () => x.response.bodyBytes > 0 && x);
  const first = x.response.bodyBytes;
  await core.replaceNamespacedConfigMap({ name: "traced", namespace: "default", body: { metadata: { name: "traced" }, data: { a: "c" } } });
  await waitFor("the MODIFIED event", () => x.response.bodyBytes > first);
  expect(x).toMatchObject({ status: 200, done: false, response: { encoding: "json", kind: "ConfigMap" } });
  watch.kill();
  await watch.exited;
  const plain = relay.connections().reduce((s, c) => s + c.plain.received, 0);
  expect(relay.wire().received).toBeGreaterThan(plain);
});
