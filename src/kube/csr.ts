// The node agent's client certificate, requested as gardener-node-agent requests it
// (pkg/nodeagent/certificate.go, pkg/utils/kubernetes/certificatesigningrequest): a new EC P-256 key,
// a CertificateSigningRequest `node-agent-csr-<digest>` for CN gardener.cloud:node-agent:machine:<machine>,
// O gardener.cloud:node-agents, signer kubernetes.io/kube-apiserver-client, usages digital signature,
// key encipherment, client auth, 720 h; then wait until it is issued, denied or failed.
//
// Waiting polls the one CSR by name (GET every 2 s, as gardener-node-agent does) instead of watching:
// Gardener's NodeAgentAuthorizer lets a node agent `create` and `get` CSRs, nothing else, so a watch
// would be refused exactly where the agent renews its certificate.
//
// The key and the request are kept in a pending file (0600) until the certificate is written, so a run
// that is interrupted while waiting (the init unit restarting, the agent stopping) picks up the same
// CSR again instead of leaving one behind per attempt and making the approver start over.
import { Buffer } from "node:buffer";
import { createHash, createPrivateKey, createPublicKey, generateKeyPairSync, X509Certificate } from "node:crypto";
import type { V1CertificateSigningRequest } from "@kubernetes/client-node";
import { formatDuration } from "../api/duration.ts";
import { credentialsDir, paths } from "../api/paths.ts";
import type { Files } from "../host/files.ts";
import type { Logger } from "../log.ts";
import { certificatesV1 } from "./api.ts";
import type { Kube } from "./client.ts";
import { certificateRequest, type Subject } from "./csr-pem.ts";
import { explainKubeError, type KubeError } from "./errors.ts";
import { abortableSleep, monotonicMs } from "../time.ts";

export const nodeAgentsGroup = "gardener.cloud:node-agents";
export const nodeAgentUserPrefix = "gardener.cloud:node-agent:machine:";
export const csrNamePrefix = "node-agent-csr-";
export const signerName = "kubernetes.io/kube-apiserver-client";
export const usages = ["digital signature", "key encipherment", "client auth"] as const;
/** 720 h, what gardener-node-agent asks for. */
export const expirationSeconds = 720 * 3600;
/** How long a request waits for approval and issuance (gardener-node-agent's 15 min). */
export const defaultWaitMs = 15 * 60_000;
/** The key and request of a CSR not yet turned into a kubeconfig (see the header). */
export const pendingRequestPath = `${credentialsDir}/csr-pending.json`;

export const nodeAgentSubject = (machineName: string): Subject => ({ commonName: nodeAgentUserPrefix + machineName, organizations: [nodeAgentsGroup] });

/**
 * gardener-node-agent's CSR name (certificatesigningrequest.ComputeDigestedName): the prefix and the
 * base64url SHA-512/256 of the public key, CN, Os and usages, each base64url-encoded and followed by
 * "|". The same key always yields the same name: that is what lets a resumed request find its CSR.
 */
export function csrObjectName(spkiDer: Uint8Array, subject: Subject): string {
  const hash = createHash("sha512-256");
  const write = (data: Uint8Array | string) => hash.update(Buffer.from(data).toString("base64url")).update("|");
  write(spkiDer);
  write(subject.commonName);
  for (const o of subject.organizations) write(o);
  for (const u of usages) write(u);
  return csrNamePrefix + hash.digest("base64url");
}

/** A key and the CSR for it. keyPem is a credential: written 0600, never logged. */
export type KeyAndRequest = { machineName: string; name: string; keyPem: string; requestPem: string };

export function newKeyAndRequest(machineName: string): KeyAndRequest {
  const { privateKey } = generateKeyPairSync("ec", { namedCurve: "P-256" });
  const subject = nodeAgentSubject(machineName);
  const { pem } = certificateRequest(privateKey, subject);
  const spki = createPublicKey(privateKey).export({ type: "spki", format: "der" });
  // SEC1 ("EC PRIVATE KEY"), as gardener-node-agent writes its key (keyutil.MakeEllipticPrivateKeyPEM).
  const keyPem = privateKey.export({ type: "sec1", format: "pem" }).toString();
  return { machineName, name: csrObjectName(spki, subject), keyPem, requestPem: pem };
}

/**
 * The pending request for `machineName` from `path`, or a new one written there (0600). A pending file
 * for another machine name, or one that cannot be read back, is replaced.
 */
export async function pendingRequest(files: Files, machineName: string, log: Logger, path = pendingRequestPath): Promise<KeyAndRequest> {
  const stored = await files.read(path);
  if (stored) {
    const previous = parsePending(new TextDecoder().decode(stored));
    if (previous?.machineName === machineName) {
      log.info("resuming the pending certificate request", { csr: previous.name, pending: path });
      return previous;
    }
    log.warn("replacing a pending certificate request that does not fit", { pending: path, machineName });
  }
  const fresh = newKeyAndRequest(machineName);
  await files.writeAtomic(path, JSON.stringify(fresh), 0o600);
  return fresh;
}

function parsePending(text: string): KeyAndRequest | undefined {
  try {
    const p = JSON.parse(text) as Partial<KeyAndRequest>;
    if (typeof p.machineName !== "string" || typeof p.keyPem !== "string" || typeof p.requestPem !== "string") return undefined;
    const key = createPrivateKey(p.keyPem);
    const subject = nodeAgentSubject(p.machineName);
    return { machineName: p.machineName, keyPem: p.keyPem, requestPem: p.requestPem, name: csrObjectName(createPublicKey(key).export({ type: "spki", format: "der" }), subject) };
  } catch {
    return undefined;
  }
}

/** The machine name: the first line of gardener-node-agent's machine-name file, else the host name. */
export async function machineName(files: Files, hostName: string): Promise<string> {
  const content = await files.read(paths.machineName);
  const first = content ? new TextDecoder().decode(content).split("\n")[0]?.trim() : "";
  return first || hostName;
}

export type CsrFailure = "denied" | "failed" | "timeout" | "deleted" | "conflict" | "bad-certificate";

/** A CSR that did not end in a usable certificate; the message names the CSR and, when there is one, the condition's reason and message. */
export class CsrError extends Error {
  override name = "CsrError";
  constructor(
    message: string,
    readonly csrName: string,
    readonly reason: CsrFailure,
    readonly condition?: { reason?: string; message?: string },
  ) {
    super(message);
  }
}

const firstPollMs = 250;

export type RequestOptions = {
  /** Authenticated as whoever asks: the bootstrap token, or the certificate being renewed. */
  kube: Kube;
  request: KeyAndRequest;
  log: Logger;
  waitMs?: number;
  pollMs?: number;
  /** Aborts the request and the wait (the agent stopping) at once, a request in flight too; it then rejects with the signal's reason. */
  signal?: AbortSignal;
  now?: () => number;
  sleep?: (ms: number, signal: AbortSignal) => Promise<void>;
};

/**
 * Creates the CSR (or finds the one this request created before) and returns the issued certificate
 * (PEM) once it is there. Throws CsrError when it is denied, failed, deleted, or not issued in time, and
 * KubeError when the API server refuses or cannot be reached for good.
 */
export async function requestClientCertificate(opts: RequestOptions): Promise<string> {
  const { kube, request, log } = opts;
  const waitMs = opts.waitMs ?? defaultWaitMs;
  const pollMs = opts.pollMs ?? 2_000;
  const now = opts.now ?? Date.now;
  const sleep = opts.sleep ?? abortableSleep;
  const signal = opts.signal ?? new AbortController().signal;
  let polls = 0;
  const api = certificatesV1(kube, { signal });
  const name = request.name;
  const requestB64 = Buffer.from(request.requestPem).toString("base64");
  const ctx = (what: string) => ({ server: kube.server, caSource: kube.caSource, what });
  const fields = { csr: name, signerName, commonName: nodeAgentSubject(request.machineName).commonName };

  let uid: string | undefined;
  try {
    const created = await api.createCertificateSigningRequest({
      body: {
        apiVersion: "certificates.k8s.io/v1",
        kind: "CertificateSigningRequest",
        metadata: { name },
        spec: { request: requestB64, signerName, usages: [...usages], expirationSeconds },
      },
    });
    uid = created.metadata?.uid;
    log.info("created the CertificateSigningRequest", fields);
  } catch (err) {
    if (signal.aborted) throw signal.reason;
    const e = explainKubeError(err, ctx(`creating CertificateSigningRequest ${name}`));
    if (e.reason !== "conflict") throw e;
    log.info("the CertificateSigningRequest exists already (a resumed request)", fields);
  }

  // How long to wait is a duration (monotonic); the certificate's validity is a wall-clock fact.
  const startedWaiting = monotonicMs();
  let approvedSeen = false;
  let waitingLogged = false;
  for (;;) {
    if (signal.aborted) throw signal.reason;
    let csr: V1CertificateSigningRequest | undefined;
    try {
      csr = await api.readCertificateSigningRequest({ name });
    } catch (err) {
      if (signal.aborted) throw signal.reason;
      const e = explainKubeError(err, ctx(`reading CertificateSigningRequest ${name}`));
      if (e.reason === "not-found") throw new CsrError(`CertificateSigningRequest ${name} was deleted before a certificate was issued`, name, "deleted");
      // The server restarting or a blip on the way: keep waiting until the deadline.
      if (!transient(e)) throw e;
      log.debug("could not read the CertificateSigningRequest; trying again", { csr: name, error: e.message });
    }
    if (csr) {
      if (uid === undefined) {
        // Found after a 409: it must be this very request, or the key would not match its certificate.
        if (csr.spec?.request !== requestB64) {
          throw new CsrError(`CertificateSigningRequest ${name} exists already with another request in it`, name, "conflict");
        }
        uid = csr.metadata?.uid;
      } else if (csr.metadata?.uid !== uid) {
        throw new CsrError(`CertificateSigningRequest ${name} was deleted and created again by someone else`, name, "deleted");
      }
      const outcome = examine(csr, name);
      if (outcome.certificate) return checkCertificate(outcome.certificate, request, name, now());
      if (outcome.approved && !approvedSeen) {
        approvedSeen = true;
        log.info("the CertificateSigningRequest was approved; waiting for the certificate", { csr: name });
      } else if (!outcome.approved && !waitingLogged) {
        waitingLogged = true;
        log.info("waiting for the CertificateSigningRequest to be approved", { csr: name, waitSeconds: Math.round(waitMs / 1000) });
      }
    }
    const left = waitMs - (monotonicMs() - startedWaiting);
    if (left <= 0) {
      const why = approvedSeen
        ? `was approved but no certificate was issued within ${formatDuration(waitMs)} (is a controller signing ${signerName}, e.g. kube-controller-manager's csrsigning?)`
        : `was not approved within ${formatDuration(waitMs)}`;
      throw new CsrError(`CertificateSigningRequest ${name} ${why}`, name, "timeout");
    }
    // An automatic approver answers within a second: ask again soon at first, then every pollMs.
    await sleep(Math.min(firstPollMs * 2 ** polls++, pollMs, left), signal);
  }
}

function transient(e: KubeError): boolean {
  return e.reason === "unreachable" || (e.reason === "http" && (e.status === 429 || (e.status ?? 0) >= 500));
}

/** The certificate, or whether the CSR is approved yet; throws CsrError for Denied and Failed. */
function examine(csr: V1CertificateSigningRequest, name: string): { certificate?: string; approved: boolean } {
  let approved = false;
  for (const c of csr.status?.conditions ?? []) {
    if (c.type === "Denied" || c.type === "Failed") {
      const what = c.type === "Denied" ? "was denied" : "failed";
      const detail = [c.reason && `reason ${c.reason}`, c.message && `message ${JSON.stringify(c.message)}`].filter(Boolean).join(", ");
      throw new CsrError(`CertificateSigningRequest ${name} ${what}${detail ? `: ${detail}` : " (no reason given)"}`, name, c.type === "Denied" ? "denied" : "failed", {
        ...(c.reason ? { reason: c.reason } : {}),
        ...(c.message ? { message: c.message } : {}),
      });
    }
    if (c.type === "Approved" && c.status !== "False") approved = true;
  }
  const cert = csr.status?.certificate;
  return cert ? { certificate: Buffer.from(cert, "base64").toString("utf8"), approved } : { approved };
}

/** The issued PEM, after checking that it is a certificate for this key that is valid now. */
function checkCertificate(pem: string, request: KeyAndRequest, name: string, nowMs: number): string {
  let cert: X509Certificate;
  try {
    cert = new X509Certificate(pem);
  } catch (err) {
    throw new CsrError(`CertificateSigningRequest ${name}: the issued certificate cannot be read (${err instanceof Error ? err.message : String(err)})`, name, "bad-certificate");
  }
  if (!cert.checkPrivateKey(createPrivateKey(request.keyPem))) {
    throw new CsrError(`CertificateSigningRequest ${name}: the issued certificate is not for this request's key`, name, "bad-certificate");
  }
  if (Date.parse(cert.validTo) <= nowMs) {
    throw new CsrError(`CertificateSigningRequest ${name}: the issued certificate expired already (${cert.validTo})`, name, "bad-certificate");
  }
  return pem.endsWith("\n") ? pem : `${pem}\n`;
}
