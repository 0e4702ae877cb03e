// What a request to the API server carries: its TLS settings (CA, client certificate) and its
// Authorization header. Files are read again when they change, so a rotated certificate or token is
// used by the next request without a restart; `KubeAuth.replaceWith` switches every holder of a Kube to
// new credentials at once (the certificate controller, after a renewal).
import { Buffer } from "node:buffer";
import { readFileSync, statSync } from "node:fs";
import type { TlsOptions } from "../runtime.ts";
import type { Kubeconfig, KubeconfigCluster, Source } from "./kubeconfig.ts";

export type RequestCredentials = { headers: Record<string, string>; tls: TlsOptions; proxy?: string };

type Authenticator = () => Promise<RequestCredentials>;

export class KubeAuth {
  #current: Authenticator;
  constructor(current: Authenticator) {
    this.#current = current;
  }
  credentials(): Promise<RequestCredentials> {
    return this.#current();
  }
  /** From the next request on, authenticate as `other` does. */
  replaceWith(other: KubeAuth): void {
    this.#current = other.#current;
  }
}

/** `kubeconfigText`/`dir`: the kubeconfig itself, which client-node reads again when a plugin authenticates the user. */
export function kubeAuth(config: Kubeconfig, kubeconfigText: string, dir: string): KubeAuth {
  const { cluster, user } = config;
  if (user.kind === "plugin") return new KubeAuth(pluginAuthenticator(kubeconfigText, dir, cluster));
  const files = new FileCache();
  const read = (s: Source | undefined) => (s === undefined ? undefined : "data" in s ? s.data : files.read(s.file));
  return new KubeAuth(async () => {
    const headers: Record<string, string> = {};
    if (user.kind === "plain") {
      const token = user.token ?? (user.tokenFile && bearerToken(user.tokenFile, files.read(user.tokenFile)));
      if (token) headers.Authorization = `Bearer ${token}`;
      else if (user.basic) headers.Authorization = `Basic ${Buffer.from(`${user.basic.username}:${user.basic.password}`).toString("base64")}`;
      if (user.impersonate) headers["Impersonate-User"] = user.impersonate;
    }
    const cert = user.kind === "plain" ? read(user.cert) : undefined;
    const key = user.kind === "plain" ? read(user.key) : undefined;
    return { headers, tls: tlsOf(cluster, read(cluster.ca), cert, key), ...(cluster.proxy && { proxy: cluster.proxy }) };
  });
}

function tlsOf(cluster: KubeconfigCluster, ca: string | undefined, cert: string | undefined, key: string | undefined): TlsOptions {
  return { rejectUnauthorized: !cluster.insecure, ...(ca && { ca }), ...(cert && { cert }), ...(key && { key }), ...(cluster.serverName && { serverName: cluster.serverName }) };
}

function bearerToken(file: string, text: string): string {
  const token = text.trim();
  if (token === "") throw new Error(`token file ${file} is empty`);
  // A token is sent as an HTTP header: reject what would garble it (a PEM pasted into the wrong file).
  if (/[\s\x00-\x1f\x7f]/.test(token)) throw new Error(`token file ${file} does not hold a bearer token (it contains whitespace or control characters)`);
  return token;
}

/** A file's text, read again only when its modification time or size changed. */
class FileCache {
  readonly #seen = new Map<string, { mtimeMs: number; size: number; text: string }>();
  read(file: string): string {
    const st = statSync(file);
    const hit = this.#seen.get(file);
    if (hit && hit.mtimeMs === st.mtimeMs && hit.size === st.size) return hit.text;
    const text = readFileSync(file, "utf8");
    this.#seen.set(file, { mtimeMs: st.mtimeMs, size: st.size, text });
    return text;
  }
}

/**
 * exec and auth-provider users: client-node's KubeConfig runs the plugin and caches what it returns. It
 * is imported on the first request that needs it, so an agent whose kubeconfig has no plugin (every
 * Gardener node) never loads it.
 */
function pluginAuthenticator(text: string, dir: string, cluster: KubeconfigCluster): Authenticator {
  let loaded: Promise<{ applyToHTTPSOptions(opts: object): Promise<void> }> | undefined;
  return async () => {
    loaded ??= import("@kubernetes/client-node").then(({ KubeConfig }) => {
      const kc = new KubeConfig();
      kc.loadFromString(text);
      kc.makePathsAbsolute(dir);
      return kc;
    });
    const kc = await loaded;
    const opts: { headers?: Record<string, string>; ca?: Buffer | string; cert?: Buffer | string; key?: Buffer | string } = {};
    await kc.applyToHTTPSOptions(opts);
    const pem = (b: Buffer | string | undefined) => (b === undefined ? undefined : b.toString());
    const headers = Object.fromEntries(Object.entries(opts.headers ?? {}).map(([k, v]) => [k, String(v)]));
    return { headers, tls: tlsOf(cluster, pem(opts.ca), pem(opts.cert), pem(opts.key)), ...(cluster.proxy && { proxy: cluster.proxy }) };
  };
}
