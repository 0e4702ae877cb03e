// The connection to the API server every controller shares (a Kube), and the one way requests are
// made: kubeFetch, and kubeJson for the JSON requests of api.ts. TLS is verified unless the kubeconfig
// itself says insecure-skip-tls-verify; every request waits for the client-side rate limit, says it
// comes from trellis, and (kubeJson) gives up after a timeout. client-node contributes its error type
// and its types; its generated API is not loaded (docs/benchmarks.md, "What dominates RSS").
import { readFileSync } from "node:fs";
import { dirname } from "node:path";
import { ApiException } from "@kubernetes/client-node/dist/gen/apis/exception.js";
import { fetchWithTls, type TlsOptions } from "../runtime.ts";
import { version } from "../version.ts";
import type { Connection } from "./connection.ts";
import { KubeAuth, kubeAuth } from "./credentials.ts";
import { type KubeconfigCluster, parseKubeconfig } from "./kubeconfig.ts";
import { type RateLimit, type Throttle, throttle } from "./rate-limit.ts";

/** How a request reaches the server: fetchWithTls, or in the model-based test an in-memory API server. */
export type Transport = (url: string, init: RequestInit, tls: TlsOptions, proxy?: string) => Promise<Response>;

export type Kube = {
  server: string;
  /** Where the trusted CA comes from, for error messages: a file, "the kubeconfig", or "the system trust store". */
  caSource: string;
  /** True when the kubeconfig disabled TLS verification. */
  insecure: boolean;
  auth: KubeAuth;
  /** Awaited before every request: the client-side rate limit; none when absent. */
  throttle?: Throttle;
  transport?: Transport;
};

/** `limit`: the agent configuration's clientConnection qps and burst; without it, requests are not limited. */
export function kubeFromConnection(conn: Connection, limit?: RateLimit): Kube {
  const limited = limit && throttle(limit);
  const kube = conn.kind === "kubeconfig" ? fromKubeconfigFile(conn.path) : fromTokenFile(conn);
  return { ...kube, ...(limited ? { throttle: limited } : {}) };
}

function fromTokenFile(conn: Extract<Connection, { kind: "token-file" }>): Kube {
  const cluster: KubeconfigCluster = { server: conn.server, insecure: false, ca: conn.ca };
  const auth = kubeAuth({ cluster, user: { kind: "plain", tokenFile: conn.tokenFile } }, "", "/");
  return { server: conn.server, caSource: "file" in conn.ca ? conn.ca.file : "the configured CA", insecure: false, auth };
}

function fromKubeconfigFile(path: string): Kube {
  return kubeFromKubeconfig(readFileSync(path, "utf8"), dirname(path), `kubeconfig ${path}`);
}

/** A Kube from a kubeconfig's text; `dir`: what its relative paths are relative to; `what` names it in errors. */
export function kubeFromKubeconfig(text: string, dir: string, what: string): Kube {
  const config = parseKubeconfig(text, dir, what);
  const ca = config.cluster.ca;
  const caSource = ca === undefined ? "the system trust store" : "file" in ca ? ca.file : `the certificate-authority-data of ${what}`;
  return { server: config.cluster.server, caSource, insecure: config.cluster.insecure, auth: kubeAuth(config, text, dir) };
}

/** No API request may take longer than this: a hung connection would stall its caller for good. */
export const requestTimeoutMs = 30_000;

export type KubeRequest = {
  method: "GET" | "POST" | "PUT" | "PATCH" | "DELETE";
  /** The path under the server, e.g. /api/v1/nodes/n. */
  path: string;
  query?: Record<string, string | undefined>;
  /** Sent as JSON. */
  body?: unknown;
  /** The body's media type when not application/json (the patch types). */
  contentType?: string;
  /** Aborts the request (the agent stopping: a request in flight must not keep the process alive). */
  signal?: AbortSignal;
};

/** One request as it is answered, whatever its status; the caller reads the body (a watch streams it). */
export async function kubeFetch(kube: Kube, req: KubeRequest & { signal: AbortSignal }): Promise<Response> {
  const url = new URL(kube.server.replace(/\/+$/, "") + req.path);
  for (const [k, v] of Object.entries(req.query ?? {})) if (v !== undefined) url.searchParams.set(k, v);
  await kube.throttle?.(req.signal);
  const creds = await kube.auth.credentials();
  const headers: Record<string, string> = { ...creds.headers, Accept: "application/json", "User-Agent": `trellis/${version}` };
  if (req.body !== undefined) headers["Content-Type"] = req.contentType ?? "application/json";
  const init: RequestInit = { method: req.method, headers, signal: req.signal, ...(req.body !== undefined && { body: JSON.stringify(req.body) }) };
  return (kube.transport ?? fetchWithTls)(url.toString(), init, creds.tls, creds.proxy);
}

/**
 * A JSON request: resolves to the answer's object; a status other than 2xx rejects with client-node's
 * ApiException (code and body), which errors.ts explains. Gives up after `timeoutMs` (the wait for the
 * rate limit counts, as in client-go's request context).
 */
export async function kubeJson<T>(kube: Kube, req: KubeRequest, timeoutMs = requestTimeoutMs): Promise<T> {
  const timeout = AbortSignal.timeout(timeoutMs);
  const signal = req.signal ? AbortSignal.any([timeout, req.signal]) : timeout;
  const res = await kubeFetch(kube, { ...req, signal });
  const text = await res.text();
  if (res.status < 200 || res.status > 299) {
    throw new ApiException(res.status, `${req.method} ${req.path}: HTTP ${res.status}`, text, Object.fromEntries(res.headers.entries()));
  }
  return (text === "" ? undefined : JSON.parse(text)) as T;
}
