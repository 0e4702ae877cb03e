// Builds a client-node KubeConfig from a Connection, with TLS verified unless the kubeconfig itself
// says insecure-skip-tls-verify. Token files are re-read when they change, so a rotated token is
// picked up without a restart (client-node reads `token-file` once and ignores client-go's `tokenFile`).
import { Buffer } from "node:buffer";
import { readFileSync, statSync } from "node:fs";
import { dirname, isAbsolute, join } from "node:path";
import { type Cluster, type Configuration, createConfiguration, KubeConfig, Observable, ServerConfiguration, type User } from "@kubernetes/client-node";
import { parse as parseYaml } from "yaml";
import { version } from "../version.ts";
import type { Connection } from "./connection.ts";
import { type RateLimit, type Throttle, throttle } from "./rate-limit.ts";

export type Kube = {
  config: KubeConfig;
  server: string;
  /** Where the trusted CA comes from, for error messages: a file, "the kubeconfig", or "the system trust store". */
  caSource: string;
  /** True when the kubeconfig disabled TLS verification. */
  insecure: boolean;
  /** Awaited before every request (apiClient's and kubeGet's): the client-side rate limit; none when absent. */
  throttle?: Throttle;
};

/** `limit`: the agent configuration's clientConnection qps and burst; without it, requests are not limited. */
export function kubeFromConnection(conn: Connection, limit?: RateLimit): Kube {
  const config = conn.kind === "kubeconfig" ? fromKubeconfigFile(conn.path) : fromTokenFile(conn);
  const cluster = config.getCurrentCluster();
  if (!cluster) throw new Error(`${describe(conn)}: no current cluster (check current-context)`);
  const limited = limit && throttle(limit);
  return { config, server: cluster.server, caSource: caSource(cluster, conn), insecure: cluster.skipTLSVerify, ...(limited ? { throttle: limited } : {}) };
}

function describe(conn: Connection): string {
  return conn.kind === "kubeconfig" ? `kubeconfig ${conn.path}` : `API server ${conn.server}`;
}

function caSource(cluster: Cluster, conn: Connection): string {
  if (cluster.caFile) return cluster.caFile;
  if (cluster.caData) return conn.kind === "kubeconfig" ? `the certificate-authority-data of ${conn.path}` : "the configured CA";
  return "the system trust store";
}

function fromTokenFile(conn: Extract<Connection, { kind: "token-file" }>): KubeConfig {
  const kc = new KubeConfig();
  kc.loadFromOptions({
    clusters: [{ name: "default", server: conn.server, ...("file" in conn.ca ? { caFile: conn.ca.file } : { caData: Buffer.from(conn.ca.data).toString("base64") }), skipTLSVerify: false }],
    users: [{ name: "trellis" }],
    contexts: [{ name: "default", cluster: "default", user: "trellis" }],
    currentContext: "default",
  });
  kc.addAuthenticator(tokenFileAuthenticator(new Map([["trellis", conn.tokenFile]])));
  return kc;
}

function fromKubeconfigFile(path: string): KubeConfig {
  const text = readFileSync(path, "utf8");
  const kc = new KubeConfig();
  kc.loadFromString(text);
  kc.makePathsAbsolute(dirname(path));
  const tokenFiles = tokenFilesOf(text, dirname(path));
  if (tokenFiles.size === 0) return kc;
  // Rebuild without the once-read token, so the authenticator below supplies a fresh one.
  const users: User[] = kc.users.map((u) => (tokenFiles.has(u.name) ? { ...u, token: undefined } : u));
  const rebuilt = new KubeConfig();
  rebuilt.loadFromOptions({ clusters: kc.clusters, users, contexts: kc.contexts, currentContext: kc.currentContext });
  rebuilt.addAuthenticator(tokenFileAuthenticator(tokenFiles));
  return rebuilt;
}

/** user name → token file, from `tokenFile` (client-go) or `token-file` (client-node). */
function tokenFilesOf(text: string, dir: string): Map<string, string> {
  const doc = parseYaml(text) as { users?: { name?: unknown; user?: Record<string, unknown> }[] } | null;
  const out = new Map<string, string>();
  for (const entry of doc?.users ?? []) {
    const file = entry.user?.tokenFile ?? entry.user?.["token-file"];
    if (typeof entry.name === "string" && typeof file === "string" && !entry.user?.token) {
      out.set(entry.name, isAbsolute(file) ? file : join(dir, file));
    }
  }
  return out;
}

function tokenFileAuthenticator(files: Map<string, string>) {
  const cache = new Map<string, { mtimeMs: number; size: number; token: string }>();
  const read = (file: string): string => {
    const st = statSync(file);
    const hit = cache.get(file);
    if (hit && hit.mtimeMs === st.mtimeMs && hit.size === st.size) return hit.token;
    const token = readFileSync(file, "utf8").trim();
    if (token === "") throw new Error(`token file ${file} is empty`);
    // A token is sent as an HTTP header: reject what would garble it (a PEM pasted into the wrong file).
    if (/[\s\x00-\x1f\x7f]/.test(token)) throw new Error(`token file ${file} does not hold a bearer token (it contains whitespace or control characters)`);
    cache.set(file, { mtimeMs: st.mtimeMs, size: st.size, token });
    return token;
  };
  return {
    isAuthProvider: (user: User) => files.has(user.name),
    applyAuthentication: async (user: User, opts: { headers?: Record<string, string> }) => {
      const file = files.get(user.name) as string;
      opts.headers ??= {};
      opts.headers.Authorization = `Bearer ${read(file)}`;
    },
  };
}

/** No API request may take longer than this: client-node sets no timeout, and a hung connection would stall its caller for good. */
export const requestTimeoutMs = 30_000;

/**
 * A client-node API client for `kube` whose every request is aborted after `timeoutMs`, or at once when
 * `signal` aborts (the agent stopping: a request in flight must not keep the process alive), and says
 * it comes from trellis (User-Agent). Use this instead of KubeConfig.makeApiClient.
 */
export function apiClient<T>(kube: Kube, Api: new (config: Configuration) => T, opts: { timeoutMs?: number; signal?: AbortSignal } = {}): T {
  const timeoutMs = opts.timeoutMs ?? requestTimeoutMs;
  const config = createConfiguration({
    baseServer: new ServerConfiguration(kube.server, {}),
    authMethods: { default: kube.config },
    middleware: [
      {
        pre: (ctx) => {
          // The timeout counts the wait for the rate limit too, as client-go's request context does.
          const signal = opts.signal ? AbortSignal.any([AbortSignal.timeout(timeoutMs), opts.signal]) : AbortSignal.timeout(timeoutMs);
          ctx.setSignal(signal);
          ctx.setHeaderParam("User-Agent", `trellis/${version}`);
          return new Observable((kube.throttle?.(signal) ?? Promise.resolve()).then(() => ctx));
        },
        post: (res) => new Observable(Promise.resolve(res)),
      },
    ],
  });
  return new Api(config);
}
