// The agent's kubeconfig (credentials/kubeconfig) as gardener-node-agent writes it after a CSR
// (nodeagent.RequestAndStoreKubeconfig): one cluster, user and context named "node-agent", the client
// certificate and key embedded, and the CA as the agent was given it — a file path when it came from a
// file (apiServer.caFile or cluster-ca.crt, which the OSC keeps current through a CA rotation), embedded
// data when the kubeconfig being renewed embedded it. And the reverse: the certificate in such a
// kubeconfig, to decide whether it is still good and when to renew it.
import { Buffer } from "node:buffer";
import { createPrivateKey, X509Certificate } from "node:crypto";
import { parse as parseYaml, stringify } from "yaml";

export type CaRef = { file: string } | { data: string };

const contextName = "node-agent";

const caEntry = (ca: CaRef) => ("file" in ca ? { "certificate-authority": ca.file } : { "certificate-authority-data": Buffer.from(ca.data).toString("base64") });

/** `ca` undefined: the server is verified against the system trust store. */
export function renderKubeconfig(o: { server: string; ca: CaRef | undefined; certPem: string; keyPem: string }): string {
  const b64 = (s: string) => Buffer.from(s).toString("base64");
  const cluster = { ...(o.ca === undefined ? {} : caEntry(o.ca)), server: o.server };
  return stringify({
    apiVersion: "v1",
    kind: "Config",
    clusters: [{ name: contextName, cluster }],
    contexts: [{ name: contextName, context: { cluster: contextName, user: contextName } }],
    "current-context": contextName,
    preferences: {},
    users: [{ name: contextName, user: { "client-certificate-data": b64(o.certPem), "client-key-data": b64(o.keyPem) } }],
  });
}

export type ClientCertificate = {
  certPem: string;
  keyPem: string;
  notBefore: Date;
  notAfter: Date;
  /** The subject's CN: the user the API server sees. */
  commonName: string;
  server: string;
  /** How the kubeconfig names the CA (undefined: the system trust store). */
  ca: CaRef | undefined;
};

type Named<T> = { name?: unknown } & T;
type KubeconfigDoc = {
  "current-context"?: unknown;
  contexts?: Named<{ context?: { cluster?: unknown; user?: unknown } }>[];
  clusters?: Named<{ cluster?: Record<string, unknown> }>[];
  users?: Named<{ user?: Record<string, unknown> }>[];
};

/**
 * The client certificate of the current context's user, or undefined when that user authenticates
 * otherwise (a token). Throws when the kubeconfig cannot be read as one (the message says why), or the
 * embedded certificate or key is damaged or they do not belong together.
 */
export function readClientCertificate(text: string): ClientCertificate | undefined {
  let doc: KubeconfigDoc;
  try {
    doc = parseYaml(text) as KubeconfigDoc;
  } catch (err) {
    throw new Error(`not YAML: ${err instanceof Error ? err.message : String(err)}`);
  }
  if (!doc || typeof doc !== "object") throw new Error("not a kubeconfig (no mapping)");
  const current = doc["current-context"];
  if (typeof current !== "string" || current === "") throw new Error("no current-context");
  const context = doc.contexts?.find((c) => c.name === current)?.context;
  if (!context) throw new Error(`current-context ${current} is not among the contexts`);
  const cluster = doc.clusters?.find((c) => c.name === context.cluster)?.cluster;
  if (!cluster) throw new Error(`cluster ${String(context.cluster)} of context ${current} is missing`);
  const user = doc.users?.find((u) => u.name === context.user)?.user;
  if (!user) throw new Error(`user ${String(context.user)} of context ${current} is missing`);
  if (typeof cluster.server !== "string" || cluster.server === "") throw new Error(`cluster ${String(context.cluster)} has no server`);
  const certB64 = user["client-certificate-data"];
  const keyB64 = user["client-key-data"];
  if (typeof certB64 !== "string" && typeof keyB64 !== "string") return undefined;
  if (typeof certB64 !== "string" || typeof keyB64 !== "string") throw new Error("client-certificate-data and client-key-data must come together");
  const certPem = Buffer.from(certB64, "base64").toString("utf8");
  const keyPem = Buffer.from(keyB64, "base64").toString("utf8");
  let cert: X509Certificate;
  try {
    cert = new X509Certificate(certPem);
  } catch (err) {
    throw new Error(`client-certificate-data is not a certificate: ${err instanceof Error ? err.message : String(err)}`);
  }
  let matches: boolean;
  try {
    matches = cert.checkPrivateKey(createPrivateKey(keyPem));
  } catch {
    // The key's own parse error could quote it: say only what is wrong.
    throw new Error("client-key-data is not a private key");
  }
  if (!matches) throw new Error("client-key-data is not the key of client-certificate-data");
  const ca: CaRef | undefined =
    typeof cluster["certificate-authority"] === "string" && cluster["certificate-authority"] !== ""
      ? { file: cluster["certificate-authority"] }
      : typeof cluster["certificate-authority-data"] === "string"
        ? { data: Buffer.from(cluster["certificate-authority-data"], "base64").toString("utf8") }
        : undefined;
  return {
    certPem,
    keyPem,
    notBefore: certDate(cert.validFrom, "notBefore"),
    notAfter: certDate(cert.validTo, "notAfter"),
    commonName: commonNameOf(cert),
    server: cluster.server,
    ca,
  };
}

function certDate(text: string, field: string): Date {
  const ms = Date.parse(text);
  if (Number.isNaN(ms)) throw new Error(`the certificate's ${field} "${text}" cannot be read`);
  return new Date(ms);
}

/** The subject's CN ("" when there is none); X509Certificate.subject is one "TYPE=value" per line. */
export function commonNameOf(cert: X509Certificate): string {
  const line = cert.subject.split("\n").find((l) => l.startsWith("CN="));
  return line ? line.slice(3) : "";
}

/**
 * Why the kubeconfig at hand is no good for the agent (undefined: it is): missing, unreadable, or its
 * client certificate expired. A kubeconfig without a client certificate is taken as it is: its
 * credentials are someone else's to manage. A certificate not valid yet is not a reason: that is the
 * clock's problem (at boot, before time sync), and another certificate would not fix it.
 */
export function kubeconfigProblem(text: string | undefined, nowMs: number): string | undefined {
  if (text === undefined) return "missing";
  let cert: ClientCertificate | undefined;
  try {
    cert = readClientCertificate(text);
  } catch (err) {
    return `unusable: ${err instanceof Error ? err.message : String(err)}`;
  }
  if (!cert) return undefined;
  if (cert.notAfter.getTime() <= nowMs) return `its client certificate expired at ${cert.notAfter.toISOString()}`;
  return undefined;
}

/**
 * A kubeconfig authenticating with a bearer token, as gardener-node-agent writes kubelet's bootstrap
 * kubeconfig (bootstrappers.KubeletBootstrapKubeconfig): cluster, user and context named `name`, the CA
 * by path. It holds the token: write it 0600.
 */
export function renderTokenKubeconfig(o: { name: string; server: string; ca: CaRef; token: string }): string {
  return stringify({
    apiVersion: "v1",
    kind: "Config",
    clusters: [{ name: o.name, cluster: { ...caEntry(o.ca), server: o.server } }],
    contexts: [{ name: o.name, context: { cluster: o.name, user: o.name } }],
    "current-context": o.name,
    preferences: {},
    users: [{ name: o.name, user: { token: o.token } }],
  });
}
