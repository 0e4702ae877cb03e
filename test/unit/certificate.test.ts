// The certificate controller's schedule, without an API server: when it renews (80–88 % of the
// lifetime, gardener-node-agent's jitter), that it waits in steps a JS timer can hold (a 30-day
// certificate renews after more than 2^31-1 ms), what it reports, and which certificates it leaves alone.
// Renewing against a real kube-apiserver is test/e2e/bootstrap.test.ts.
import { describe, expect, test } from "bun:test";
import { renewalTime, startCertificateController } from "../../src/controllers/certificate.ts";
import { createFiles } from "../../src/host/files.ts";
import { kubeFromConnection } from "../../src/kube/client.ts";
import { renderKubeconfig, renderTokenKubeconfig } from "../../src/kube/csr-kubeconfig.ts";
import { createLogger } from "../../src/log.ts";
import { createRegistry } from "../../src/metrics.ts";
import { issueClientCert } from "../harness/certs.ts";
import { runDir, waitFor } from "../harness/exec.ts";
import { memoryStatusBoard, metricSample } from "../harness/observe.ts";

const day = 86_400_000;

describe("renewalTime", () => {
  test.each([
    [0, 0.8],
    [0.5, 0.84],
    [0.999999, 0.88],
  ])("random %d → %d of the lifetime", (random, fraction) => {
    const from = Date.UTC(2026, 0, 1);
    const to = from + 30 * day;
    expect(renewalTime(from, to, random)).toBeCloseTo(from + fraction * 30 * day, -3);
  });

  test("always within 80–88 % of the lifetime, whatever the draw", () => {
    const from = 1_000_000;
    for (let i = 0; i < 10_000; i++) {
      const lifetime = 600_000 + Math.random() * 400 * day;
      const at = renewalTime(from, from + lifetime, Math.random());
      expect(at).toBeGreaterThanOrEqual(from + 0.8 * lifetime);
      expect(at).toBeLessThan(from + 0.88 * lifetime + 1);
    }
  });
});

describe("the controller", () => {
  async function setUp(kubeconfig: string) {
    const files = createFiles(runDir("certificate-unit"));
    const path = "/var/lib/gardener-node-agent/credentials/kubeconfig";
    await files.writeAtomic(path, kubeconfig, 0o600);
    const kube = kubeFromConnection({ kind: "kubeconfig", path: `${files.root}${path}` });
    const status = memoryStatusBoard();
    const metrics = createRegistry();
    const sleeps: number[] = [];
    let woken: () => void = () => {};
    const sleep = (ms: number, signal: AbortSignal) =>
      new Promise<void>((resolve) => {
        sleeps.push(ms);
        woken = resolve;
        signal.addEventListener("abort", () => resolve(), { once: true });
      });
    const controller = startCertificateController({ kube, files, log: createLogger({ write: () => {} }), metrics, status, kubeconfigPath: path, sleep, random: () => 0.5 });
    return { controller, status, metrics, sleeps, wake: () => woken() };
  }

  async function certKubeconfig(cn: string, notBefore: number, notAfter: number) {
    const c = await issueClientCert({ dir: runDir("certificate-unit"), commonName: cn, organizations: ["gardener.cloud:node-agents"], notBefore: new Date(notBefore), notAfter: new Date(notAfter) });
    return renderKubeconfig({ server: "https://127.0.0.1:1", ca: { file: "/ca.crt" }, certPem: c.certPem, keyPem: c.keyPem });
  }

  test("a fresh 30-day certificate: renewal at 84 % (random 0.5), waited for in steps of at most an hour", async () => {
    const notBefore = Math.floor(Date.now() / 1000) * 1000 - 60_000;
    const notAfter = notBefore + 30 * day;
    const { controller, status, metrics, sleeps, wake } = await setUp(await certKubeconfig("gardener.cloud:node-agent:machine:m1", notBefore, notAfter));
    try {
      await waitFor("the first wait", () => sleeps.length > 0);
      const renewAt = notBefore + 0.84 * 30 * day;
      expect(status.of("certificate")).toMatchObject({ ok: true, renewAt: new Date(renewAt).toISOString(), notAfter: new Date(notAfter).toISOString() });
      expect(metricSample(metrics, "trellis_client_certificate_expiration_timestamp_seconds")).toBe(notAfter / 1000);
      expect(sleeps[0]).toBe(3_600_000);
      wake();
      await waitFor("the second wait", () => sleeps.length > 1);
      expect(sleeps[1]).toBeLessThanOrEqual(3_600_000);
    } finally {
      await controller.stop();
    }
  });

  test("a certificate of another user is not renewed (the approver would deny the CSR): reported, left alone", async () => {
    const { controller, status, sleeps } = await setUp(await certKubeconfig("admin", Date.now() - day, Date.now() + day));
    await controller.stop();
    expect(status.of("certificate")).toMatchObject({ ok: true, summary: expect.stringContaining("for admin, not a node agent") });
    expect(sleeps).toEqual([]);
  });

  test("a kubeconfig without a client certificate: nothing to renew", async () => {
    const { controller, status, sleeps } = await setUp(renderTokenKubeconfig({ name: "x", server: "https://127.0.0.1:1", ca: { file: "/ca.crt" }, token: "abc" }));
    await controller.stop();
    expect(status.of("certificate")).toMatchObject({ ok: true, summary: expect.stringContaining("without a client certificate") });
    expect(sleeps).toEqual([]);
  });
});
