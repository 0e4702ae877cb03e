import { describe, expect, test } from "bun:test";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { createServer, type Socket } from "node:net";
import { ApiException } from "@kubernetes/client-node";
import { paths } from "../../src/api/paths.ts";
import { connectionFor } from "../../src/kube/connection.ts";
import { coreV1 } from "../../src/kube/api.ts";
import { kubeFromConnection } from "../../src/kube/client.ts";
import { explainKubeError } from "../../src/kube/errors.ts";
import { runOk } from "../harness/exec.ts";

const config = (kubeconfig = "", server = "https://api:443", caFile = "") => ({
  clientConnection: { kubeconfig, qps: 50, burst: 100, acceptContentTypes: "", contentType: "" },
  apiServer: { server, caFile },
});
const only = (...present: string[]) => (p: string) => present.includes(p);

describe("which credentials the agent uses (gardener-node-agent's precedence)", () => {
  test("KUBECONFIG beats everything", () => {
    expect(connectionFor(config("/cfg"), { KUBECONFIG: "/env" }, only(paths.kubeconfig))).toEqual({ kind: "kubeconfig", path: "/env" });
  });
  test("clientConnection.kubeconfig next", () => {
    expect(connectionFor(config("/cfg"), {}, only(paths.kubeconfig))).toEqual({ kind: "kubeconfig", path: "/cfg" });
  });
  test("then the kubeconfig the bootstrap wrote", () => {
    expect(connectionFor(config(), {}, only(paths.kubeconfig, paths.bootstrapToken))).toEqual({ kind: "kubeconfig", path: paths.kubeconfig });
  });
  test("then the bootstrap token with the cluster CA", () => {
    expect(connectionFor(config(), {}, only(paths.bootstrapToken))).toEqual({
      kind: "token-file",
      server: "https://api:443",
      ca: { file: paths.clusterCa },
      tokenFile: paths.bootstrapToken,
    });
    expect(connectionFor(config("", "https://api:443", "/ca.crt"), {}, only(paths.bootstrapToken))).toMatchObject({ ca: { file: "/ca.crt" } });
  });
  test("no credentials at all is an error naming both files", () => {
    expect(() => connectionFor(config(), {}, only())).toThrow(`neither the kubeconfig ${paths.kubeconfig} nor the bootstrap token ${paths.bootstrapToken}`);
  });
  test("bootstrapping needs apiServer.server", () => {
    expect(() => connectionFor(config("", ""), {}, only(paths.bootstrapToken))).toThrow("apiServer.server");
  });
});

describe("API errors are explained", () => {
  const ctx = { server: "https://127.0.0.1:6443", caSource: "/etc/ca.crt", what: "reading the server version" };
  const withCode = (code: string) => Object.assign(new TypeError("fetch failed"), { code });
  test.each(["DEPTH_ZERO_SELF_SIGNED_CERT", "SELF_SIGNED_CERT_IN_CHAIN", "UNABLE_TO_VERIFY_LEAF_SIGNATURE", "UNABLE_TO_GET_ISSUER_CERT_LOCALLY"])(
    "%s → the certificate is not signed by the configured CA",
    (code) => {
      const e = explainKubeError(withCode(code), ctx);
      expect(e.reason).toBe("tls-untrusted");
      expect(e.message).toBe(`reading the server version: refusing https://127.0.0.1:6443: its TLS certificate is not signed by the CA in /etc/ca.crt (${code})`);
    },
  );
  test("a nested cause's code is found", () => {
    expect(explainKubeError(new Error("outer", { cause: withCode("ECONNREFUSED") }), ctx).reason).toBe("unreachable");
  });
  test("host name mismatch", () => expect(explainKubeError(withCode("ERR_TLS_CERT_ALTNAME_INVALID"), ctx).reason).toBe("tls-hostname"));
  test.each([
    [401, "unauthorized"],
    [403, "forbidden"],
    [404, "not-found"],
    [409, "conflict"],
    [410, "gone"],
    [500, "http"],
  ] as const)("HTTP %d → %s, with the server's message", (code, reason) => {
    const e = explainKubeError(new ApiException(code, "x", JSON.stringify({ message: "the reason" }), {}), ctx);
    expect(e.reason).toBe(reason);
    expect(e.status).toBe(code);
    expect(e.message).toContain(": the reason");
  });
});

test("a request that timed out is reported as no answer in time", () => {
  const e = explainKubeError(Object.assign(new Error("The operation timed out."), { name: "TimeoutError" }), { server: "https://api", caSource: "x", what: "reading Node n" });
  expect(e.reason).toBe("unreachable");
  expect(e.message).toBe("reading Node n: no answer from https://api in time (TimeoutError)");
});

test("a server that accepts but never answers cannot stall a caller: the request is aborted in time", async () => {
  const sockets: Socket[] = [];
  const silent = createServer((s) => void sockets.push(s));
  await new Promise<void>((resolve) => silent.listen(0, "127.0.0.1", resolve));
  const port = (silent.address() as { port: number }).port;
  const dir = mkdtempSync("/tmp/trellis-silent-");
  writeFileSync(`${dir}/token`, "abc");
  await runOk(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", `${dir}/ca.key`, "-out", `${dir}/ca.crt`, "-days", "1", "-subj", "/CN=silent-test-ca"]);
  try {
    const kube = kubeFromConnection({ kind: "token-file", server: `https://127.0.0.1:${port}`, ca: { file: `${dir}/ca.crt` }, tokenFile: `${dir}/token` });
    const t0 = performance.now();
    const err = await coreV1(kube, { timeoutMs: 300 }).readNode({ name: "n" }).then(() => undefined, (e: unknown) => e);
    expect(performance.now() - t0).toBeLessThan(5_000);
    const explained = explainKubeError(err, { server: kube.server, caSource: "x", what: "reading Node n" });
    expect(explained.message).toContain("no answer");
    expect(explained.reason).toBe("unreachable");
    // The agent stopping ends a request in flight at once, long before its timeout.
    const stop = new AbortController();
    const t1 = performance.now();
    const pending = coreV1(kube, { signal: stop.signal }).readNode({ name: "n" }).then(() => undefined, (e: unknown) => e);
    setTimeout(() => stop.abort(new Error("stopping")), 100);
    expect(await pending).toBeDefined();
    expect(performance.now() - t1).toBeLessThan(2_000);
  } finally {
    for (const s of sockets) s.destroy();
    silent.close();
    rmSync(dir, { recursive: true, force: true });
  }
});
