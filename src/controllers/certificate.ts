// Renews the agent's client certificate, as gardener-node-agent's certificate controller does
// (pkg/nodeagent/controller/certificate): at a random point between 80 % and 88 % of its lifetime
// (0.8 × lifetime, jittered by up to 10 %), a new key and CSR, authenticated with the current
// certificate, for the same machine; once issued, credentials/kubeconfig is replaced atomically.
//
// Then, unlike gardener-node-agent (which ends its process so that systemd starts it with the new
// kubeconfig), the running agent switches to the new certificate in place: client-node reads the
// user's certificate and key for every request (src/kube/credentials.ts: the files read again when they
// change, the TLS settings handed to fetch per request), so replacing the credentials of the one Kube
// every controller shares makes the next request use them. Watches already open keep their
// connection until the server ends them (4–6 min), on a certificate that is valid for days still.
// No restart: no relist of every watch, no gap in the lease, and it works for an agent not run by systemd.
import type { Files } from "../host/files.ts";
import { type Kube, kubeFromConnection } from "../kube/client.ts";
import { CsrError, defaultWaitMs, nodeAgentUserPrefix, pendingRequest, pendingRequestPath, requestClientCertificate } from "../kube/csr.ts";
import { type ClientCertificate, readClientCertificate, renderKubeconfig } from "../kube/csr-kubeconfig.ts";
import { abortableSleep, backoffDelay } from "../time.ts";
import { describeError, type Logger } from "../log.ts";
import type { Registry } from "../metrics.ts";
import type { Controller, StatusBoard } from "./types.ts";

/** When to renew a certificate valid from notBefore to notAfter (ms), for random in [0, 1): 80–88 % of its lifetime. */
export function renewalTime(notBeforeMs: number, notAfterMs: number, random: number): number {
  const lifetime = notAfterMs - notBeforeMs;
  return notBeforeMs + lifetime * 0.8 * (1 + 0.1 * random);
}

export type CertificateControllerDeps = {
  /** The agent's connection: renewed in place (see the header). */
  kube: Kube;
  files: Files;
  log: Logger;
  metrics: Registry;
  status: StatusBoard;
  /** The kubeconfig the agent was started with, holding the certificate to renew. */
  kubeconfigPath: string;
  pendingPath?: string;
  random?: () => number;
  /** Wall clock, ms since the epoch: certificates are dated in it. */
  now?: () => number;
  sleep?: (ms: number, signal: AbortSignal) => Promise<void>;
  /** How long one CSR may wait for approval and issuance (15 min). */
  waitMs?: number;
  pollMs?: number;
  /** After a failed renewal: first retry delay, doubling to maxMs (jittered). */
  retry?: { initialMs: number; maxMs: number };
};

// A timer longer than 2^31-1 ms (24.8 days) fires at once in JS runtimes, and 88 % of a 30-day
// certificate is 26.4 days: sleep in steps, which also follows the wall clock across a suspend.
const maxSleepMs = 3_600_000;

export type CertificateController = Controller & {
  /**
   * A new certificate now, as gardener-node-agent requests one after a certificate authority rotation:
   * the kubeconfig's CA file (rewritten by the OSC) is read again with it. Rejects with why not.
   */
  renewNow(): Promise<void>;
};

export function startCertificateController(deps: CertificateControllerDeps): CertificateController {
  const log = deps.log.with({ controller: "certificate" });
  // The wall clock: a certificate's validity, and the renewal time taken from it, are wall-clock facts.
  const now = deps.now ?? Date.now;
  const random = deps.random ?? Math.random;
  const sleep = deps.sleep ?? abortableSleep;
  const retry = deps.retry ?? { initialMs: 30_000, maxMs: 10 * 60_000 };
  const pendingPath = deps.pendingPath ?? pendingRequestPath;
  const stopper = new AbortController();
  const expiry = deps.metrics.gauge("trellis_client_certificate_expiration_timestamp_seconds", "notAfter of the agent's client certificate, in seconds since the epoch.");
  const renewals = deps.metrics.counter("trellis_client_certificate_renewals_total", "Renewals of the agent's client certificate, by result.");
  const report = (ok: boolean, summary: string, detail: Record<string, unknown> = {}) => deps.status.set("certificate", { ok, summary, ...detail });
  const iso = (ms: number) => new Date(ms).toISOString();

  /** The certificate in the kubeconfig now, or undefined (reported) when there is nothing to renew. */
  async function current(): Promise<ClientCertificate | undefined> {
    const content = await deps.files.read(deps.kubeconfigPath);
    if (content === undefined) throw new Error(`${deps.kubeconfigPath} is gone`);
    let cert: ClientCertificate | undefined;
    try {
      cert = readClientCertificate(new TextDecoder().decode(content));
    } catch (err) {
      throw new Error(`${deps.kubeconfigPath}: ${describeError(err)}`);
    }
    if (!cert) {
      report(true, "the kubeconfig authenticates without a client certificate: nothing to renew");
      return undefined;
    }
    expiry.set(cert.notAfter.getTime() / 1000);
    if (!cert.commonName.startsWith(nodeAgentUserPrefix)) {
      // The CSR would ask for a user the approver does not expect; whoever made this certificate renews it.
      report(true, `the client certificate is for ${cert.commonName}, not a node agent (${nodeAgentUserPrefix}…): not renewed`, { notAfter: cert.notAfter.toISOString() });
      log.warn("the client certificate is not a node agent's: it is not renewed", { user: cert.commonName, notAfter: cert.notAfter.toISOString() });
      return undefined;
    }
    return cert;
  }

  async function sleepUntil(at: number): Promise<void> {
    for (let left = at - now(); left > 0 && !stopper.signal.aborted; left = at - now()) await sleep(Math.min(left, maxSleepMs), stopper.signal);
  }

  // One renewal at a time: the scheduled one and renewNow share the pending request.
  let renewing: Promise<unknown> = Promise.resolve();
  const renew = (cert: ClientCertificate): Promise<ClientCertificate> => {
    const next = renewing.then(() => renewOnce(cert));
    renewing = next.catch(() => undefined);
    return next;
  };

  async function renewOnce(cert: ClientCertificate): Promise<ClientCertificate> {
    // The same user as now: Gardener's approver denies a renewal whose CN differs from the requester's.
    const machine = cert.commonName.slice(nodeAgentUserPrefix.length);
    const request = await pendingRequest(deps.files, machine, log, pendingPath);
    let certPem: string;
    try {
      certPem = await requestClientCertificate({ kube: deps.kube, request, log, signal: stopper.signal, waitMs: deps.waitMs ?? defaultWaitMs, pollMs: deps.pollMs, now });
    } catch (err) {
      if (err instanceof CsrError && err.reason !== "timeout") await deps.files.remove(pendingPath);
      throw err;
    }
    const text = renderKubeconfig({ server: cert.server, ca: cert.ca, certPem, keyPem: request.keyPem });
    const renewed = readClientCertificate(text) as ClientCertificate;
    await deps.files.writeAtomic(deps.kubeconfigPath, text, 0o600);
    await deps.files.remove(pendingPath);
    useKubeconfig(deps.kube, deps.kubeconfigPath);
    log.info("renewed the client certificate; the agent uses it from now on", { csr: request.name, notAfter: renewed.notAfter.toISOString() });
    return renewed;
  }

  async function run(): Promise<void> {
    let failures = 0;
    /** Per certificate (by its PEM), so a retry does not draw a new, later time. */
    let scheduled: { certPem: string; at: number } | undefined;
    while (!stopper.signal.aborted) {
      let cert: ClientCertificate | undefined;
      try {
        cert = await current();
      } catch (err) {
        const error = describeError(err);
        log.error("cannot read the client certificate; trying again later", { error });
        report(false, `cannot read the client certificate: ${error}`);
        await sleep(retry.maxMs, stopper.signal);
        continue;
      }
      if (!cert) return;
      if (scheduled?.certPem !== cert.certPem) {
        scheduled = { certPem: cert.certPem, at: renewalTime(cert.notBefore.getTime(), cert.notAfter.getTime(), random()) };
        log.info("scheduled the client certificate's renewal", { user: cert.commonName, notAfter: cert.notAfter.toISOString(), renewAt: iso(scheduled.at) });
      }
      if (failures === 0) report(true, `valid until ${cert.notAfter.toISOString()}; renewal at ${iso(scheduled.at)}`, { notAfter: cert.notAfter.toISOString(), renewAt: iso(scheduled.at) });
      await sleepUntil(scheduled.at);
      if (stopper.signal.aborted) return;
      // renewNow may have replaced it meanwhile: schedule the new one instead.
      if ((await current().catch(() => undefined))?.certPem !== cert.certPem) continue;
      try {
        const renewed = await renew(cert);
        failures = 0;
        renewals.inc({ result: "success" });
        expiry.set(renewed.notAfter.getTime() / 1000);
      } catch (err) {
        if (stopper.signal.aborted) return;
        failures++;
        renewals.inc({ result: "failure" });
        const error = describeError(err);
        const valid = now() < cert.notAfter.getTime();
        const delayMs = backoffDelay(failures, retry, random());
        log.error("renewing the client certificate failed; trying again", { error, failuresInARow: failures, notAfter: cert.notAfter.toISOString(), retryInMs: Math.round(delayMs) });
        // Still valid: the agent works, so readiness holds; expired: it cannot even ask any more.
        report(valid, `${valid ? `valid until ${cert.notAfter.toISOString()}` : `EXPIRED at ${cert.notAfter.toISOString()}`}; ${failures} renewal(s) failed: ${error}`, {
          notAfter: cert.notAfter.toISOString(),
          error,
        });
        await sleep(delayMs, stopper.signal);
      }
    }
  }

  const running = run().catch((err: unknown) => {
    log.error("the certificate controller stopped", { error: describeError(err) });
    report(false, `stopped: ${describeError(err)}`);
  });
  return {
    async stop() {
      stopper.abort();
      await running;
    },
    async renewNow() {
      const cert = await current();
      if (!cert) throw new Error(`${deps.kubeconfigPath} holds no node agent's client certificate to renew`);
      const renewed = await renew(cert);
      renewals.inc({ result: "success" });
      expiry.set(renewed.notAfter.getTime() / 1000);
    },
  };
}

/**
 * Makes `kube` authenticate as the kubeconfig at `path` says, from the next request on: its credentials
 * replace those of the shared Kube in one synchronous step, so no request sees half of each.
 */
export function useKubeconfig(kube: Kube, path: string): void {
  const fresh = kubeFromConnection({ kind: "kubeconfig", path });
  if (fresh.server !== kube.server) throw new Error(`${path} names server ${fresh.server}, not ${kube.server}: restart the agent to change servers`);
  kube.auth.replaceWith(fresh.auth);
}
