// A kubeconfig read as client-go reads it, for its current context: the cluster (server, CA, TLS
// verification, server name, proxy) and how the user authenticates. Read here rather than by
// client-node's KubeConfig because that class's module loads client-node's whole generated API and
// every auth plugin (~15 MiB of a compiled agent's memory, docs/benchmarks.md); a user that
// authenticates by a plugin (exec, auth-provider) is still handed to it (credentials.ts).
import { Buffer } from "node:buffer";
import { isAbsolute, join } from "node:path";
import { parse as parseYaml } from "yaml";

export type Source = { file: string } | { data: string };

export type KubeconfigCluster = {
  server: string;
  ca?: Source;
  insecure: boolean;
  serverName?: string;
  proxy?: string;
};

export type KubeconfigUser =
  | { kind: "none" }
  | { kind: "plain"; cert?: Source; key?: Source; token?: string; tokenFile?: string; basic?: { username: string; password: string }; impersonate?: string }
  /** exec or auth-provider: client-node's KubeConfig runs the plugin (credentials.ts). */
  | { kind: "plugin"; plugin: "exec" | "auth-provider" };

export type Kubeconfig = { cluster: KubeconfigCluster; user: KubeconfigUser };

export class KubeconfigError extends Error {
  override name = "KubeconfigError";
}

type Named = { name?: unknown; [k: string]: unknown };

/** `dir`: where relative paths in it are relative to (the kubeconfig's directory). `what` names it in errors. */
export function parseKubeconfig(text: string, dir: string, what: string): Kubeconfig {
  const fail = (msg: string): never => {
    throw new KubeconfigError(`${what}: ${msg}`);
  };
  let doc: unknown;
  try {
    doc = parseYaml(text);
  } catch (err) {
    return fail(`not YAML: ${err instanceof Error ? err.message : String(err)}`);
  }
  if (!isRecord(doc)) return fail("not a kubeconfig (expected a mapping)");
  const current = doc["current-context"];
  if (typeof current !== "string" || current === "") return fail("current-context is not set");
  const context = entry(doc.contexts, "contexts", current, "context", fail);
  const clusterName = context.cluster;
  if (typeof clusterName !== "string") return fail(`contexts[${current}].context.cluster is not set`);
  const c = entry(doc.clusters, "clusters", clusterName, "cluster", fail);
  const at = `clusters[${clusterName}].cluster`;
  const server = c.server;
  if (typeof server !== "string" || server === "") return fail(`${at}.server is not set`);
  const insecure = c["insecure-skip-tls-verify"] === true;
  if (server.startsWith("http:") && !insecure) return fail(`${at}.server ${server}: plain HTTP is allowed only with insecure-skip-tls-verify`);
  const ca = source(c, "certificate-authority", at, dir, fail);
  const cluster: KubeconfigCluster = {
    server,
    insecure,
    ...(ca && { ca }),
    ...(typeof c["tls-server-name"] === "string" && c["tls-server-name"] !== "" && { serverName: c["tls-server-name"] }),
    ...(typeof c["proxy-url"] === "string" && c["proxy-url"] !== "" && { proxy: c["proxy-url"] }),
  };
  if (cluster.proxy?.startsWith("socks")) fail(`${at}.proxy-url ${cluster.proxy}: SOCKS proxies are not supported`);
  const userName = context.user;
  if (typeof userName !== "string" || userName === "") return { cluster, user: { kind: "none" } };
  return { cluster, user: user(entry(doc.users, "users", userName, "user", fail), `users[${userName}].user`, dir, fail) };
}

function user(u: Record<string, unknown>, at: string, dir: string, fail: (msg: string) => never): KubeconfigUser {
  if (isRecord(u.exec)) return { kind: "plugin", plugin: "exec" };
  if (isRecord(u["auth-provider"])) return { kind: "plugin", plugin: "auth-provider" };
  const cert = source(u, "client-certificate", at, dir, fail);
  const key = source(u, "client-key", at, dir, fail);
  if ((cert === undefined) !== (key === undefined)) fail(`${at}: a client certificate needs its key and a key its certificate`);
  const token = typeof u.token === "string" && u.token !== "" ? u.token : undefined;
  // client-go's `tokenFile`, client-node's `token-file`; a token given inline wins, as in client-go.
  const file = u.tokenFile ?? u["token-file"];
  const tokenFile = token === undefined && typeof file === "string" && file !== "" ? absolute(file, dir) : undefined;
  const basic = typeof u.username === "string" && u.username !== "" ? { username: u.username, password: typeof u.password === "string" ? u.password : "" } : undefined;
  const impersonate = typeof u.as === "string" && u.as !== "" ? u.as : undefined;
  return { kind: "plain", ...(cert && { cert }), ...(key && { key }), ...(token && { token }), ...(tokenFile && { tokenFile }), ...(basic && { basic }), ...(impersonate && { impersonate }) };
}

/** `<field>-data` (base64 PEM) or `<field>` (a file); the data wins when both are given, as in client-go. */
function source(o: Record<string, unknown>, field: string, at: string, dir: string, fail: (msg: string) => never): Source | undefined {
  const data = o[`${field}-data`];
  if (typeof data === "string" && data !== "") {
    const pem = Buffer.from(data, "base64").toString("utf8");
    if (!pem.includes("-----BEGIN")) fail(`${at}.${field}-data is not base64 of PEM`);
    return { data: pem };
  }
  const file = o[field];
  return typeof file === "string" && file !== "" ? { file: absolute(file, dir) } : undefined;
}

function entry(list: unknown, listName: string, name: string, key: string, fail: (msg: string) => never): Record<string, unknown> {
  const found = (Array.isArray(list) ? list : []).find((e): e is Named => isRecord(e) && e.name === name);
  if (!found) return fail(`${listName} has no entry named ${JSON.stringify(name)}`);
  const body = found[key];
  return isRecord(body) ? body : fail(`${listName}[${name}].${key} is missing`);
}

const absolute = (p: string, dir: string) => (isAbsolute(p) ? p : join(dir, p));

function isRecord(v: unknown): v is Record<string, unknown> {
  return typeof v === "object" && v !== null && !Array.isArray(v);
}
