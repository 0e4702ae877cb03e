import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { chmodSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { stringify } from "yaml";
import { coreV1 } from "../../src/kube/api.ts";
import { kubeFromConnection } from "../../src/kube/client.ts";
import { parseKubeconfig } from "../../src/kube/kubeconfig.ts";
import { repoRoot } from "../harness/binary.ts";

const b64 = (s: string) => Buffer.from(s).toString("base64");
const pem = (what: string) => `-----BEGIN ${what}-----\nMIIB\n-----END ${what}-----\n`;
const kubeconfig = (cluster: Record<string, unknown>, user: Record<string, unknown> | null = {}) =>
  stringify({
    apiVersion: "v1",
    kind: "Config",
    clusters: [{ name: "c", cluster }],
    ...(user && { users: [{ name: "u", user }] }),
    contexts: [{ name: "x", context: { cluster: "c", ...(user && { user: "u" }) } }],
    "current-context": "x",
  });

describe("a kubeconfig is read for its current context", () => {
  test("cluster: server, CA (data before file; files relative to the kubeconfig), TLS settings, proxy", () => {
    const k = parseKubeconfig(
      kubeconfig({ server: "https://api:6443", "certificate-authority": "ca.crt", "tls-server-name": "kubernetes", "proxy-url": "http://proxy:3128" }),
      "/etc/k",
      "kubeconfig /etc/k/config",
    );
    expect(k.cluster).toEqual({ server: "https://api:6443", insecure: false, ca: { file: "/etc/k/ca.crt" }, serverName: "kubernetes", proxy: "http://proxy:3128" });
    const data = parseKubeconfig(kubeconfig({ server: "https://api", "certificate-authority": "/ca.crt", "certificate-authority-data": b64(pem("CERTIFICATE")) }), "/", "k");
    expect(data.cluster.ca).toEqual({ data: pem("CERTIFICATE") });
  });

  test("user: client certificate and key, token before token file (tokenFile or token-file), basic auth, impersonation", () => {
    const user = (u: Record<string, unknown>) => parseKubeconfig(kubeconfig({ server: "https://api" }, u), "/etc/k", "k").user;
    expect(user({ "client-certificate": "c.crt", "client-key-data": b64(pem("PRIVATE KEY")) })).toEqual({ kind: "plain", cert: { file: "/etc/k/c.crt" }, key: { data: pem("PRIVATE KEY") } });
    expect(user({ token: "t", tokenFile: "/tok" })).toEqual({ kind: "plain", token: "t" });
    expect(user({ tokenFile: "tok" })).toEqual({ kind: "plain", tokenFile: "/etc/k/tok" });
    expect(user({ "token-file": "/tok" })).toEqual({ kind: "plain", tokenFile: "/tok" });
    expect(user({ username: "admin", password: "pw", as: "someone" })).toEqual({ kind: "plain", basic: { username: "admin", password: "pw" }, impersonate: "someone" });
    expect(user({ exec: { command: "x" } })).toEqual({ kind: "plugin", plugin: "exec" });
    expect(user({ "auth-provider": { name: "oidc" } })).toEqual({ kind: "plugin", plugin: "auth-provider" });
    expect(parseKubeconfig(kubeconfig({ server: "https://api" }, null), "/", "k").user).toEqual({ kind: "none" });
  });

  test.each([
    ["no current context", "current-context: ''\n", "k: current-context is not set"],
    ["a context that is not there", stringify({ "current-context": "y", contexts: [] }), 'k: contexts has no entry named "y"'],
    ["no server", kubeconfig({}), "k: clusters[c].cluster.server is not set"],
    ["plain HTTP without insecure-skip-tls-verify", kubeconfig({ server: "http://api" }), "plain HTTP is allowed only with insecure-skip-tls-verify"],
    ["CA data that is not base64 PEM", kubeconfig({ server: "https://api", "certificate-authority-data": "bm90IGEgcGVt" }), "k: clusters[c].cluster.certificate-authority-data is not base64 of PEM"],
    ["a certificate without its key", kubeconfig({ server: "https://api" }, { "client-certificate": "/c" }), "a client certificate needs its key"],
    ["a SOCKS proxy", kubeconfig({ server: "https://api", "proxy-url": "socks5://p:1080" }), "SOCKS proxies are not supported"],
    ["not YAML", "a: [", "k: not YAML"],
  ])("refused with the field named: %s", (_, text, message) => {
    expect(() => parseKubeconfig(text, "/", "k")).toThrow(message);
  });
});

describe("what requests carry", () => {
  let dir: string;
  let server: ReturnType<typeof Bun.serve>;
  const seen: Record<string, string | null>[] = [];
  beforeAll(() => {
    dir = mkdtempSync("/tmp/trellis-kubeconfig-");
    server = Bun.serve({
      port: 0,
      hostname: "127.0.0.1",
      fetch(req) {
        seen.push({ authorization: req.headers.get("authorization"), impersonate: req.headers.get("impersonate-user"), agent: req.headers.get("user-agent") });
        return Response.json({ kind: "Node", apiVersion: "v1", metadata: { name: "n" } });
      },
    });
  });
  afterAll(() => {
    server.stop(true);
    rmSync(dir, { recursive: true, force: true });
  });
  const url = () => `http://127.0.0.1:${server.port}`;
  const last = () => seen[seen.length - 1];

  test("a token file is read again when it changes: the next request carries the new token", async () => {
    writeFileSync(`${dir}/token`, "one\n");
    writeFileSync(`${dir}/config`, kubeconfig({ server: url(), "insecure-skip-tls-verify": true }, { tokenFile: "token", as: "someone" }));
    const core = coreV1(kubeFromConnection({ kind: "kubeconfig", path: `${dir}/config` }));
    await core.readNode({ name: "n" });
    expect(last()).toMatchObject({ authorization: "Bearer one", impersonate: "someone" });
    expect(last()?.agent).toStartWith("trellis/");
    writeFileSync(`${dir}/token`, "second-token\n");
    await core.readNode({ name: "n" });
    expect(last()?.authorization).toBe("Bearer second-token");
  });

  test("an exec plugin's token, through client-node's KubeConfig (loaded only for it)", async () => {
    const plugin = `${dir}/plugin.sh`;
    writeFileSync(plugin, `#!/bin/sh\necho '{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential","status":{"token":"from-exec"}}'\n`);
    chmodSync(plugin, 0o755);
    writeFileSync(`${dir}/exec-config`, kubeconfig({ server: url(), "insecure-skip-tls-verify": true }, { exec: { apiVersion: "client.authentication.k8s.io/v1", command: plugin, interactiveMode: "Never" } }));
    await coreV1(kubeFromConnection({ kind: "kubeconfig", path: `${dir}/exec-config` })).readNode({ name: "n" });
    expect(last()?.authorization).toBe("Bearer from-exec");
  });
});

test("src/ takes only types from client-node's package root: a value from it would load the whole generated API (~15 MiB of the agent's memory)", () => {
  const files = (d: string): string[] => readdirSync(d).flatMap((f) => (statSync(join(d, f)).isDirectory() ? files(join(d, f)) : f.endsWith(".ts") ? [join(d, f)] : []));
  const offenders = files(`${repoRoot}/src`).filter((f) => /^import (?!type )[^;]*from "@kubernetes\/client-node";/m.test(readFileSync(f, "utf8")));
  expect(offenders).toEqual([]);
});
