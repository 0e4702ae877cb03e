// The distribution (OCI registry) API over node:http/node:https, one repository at a time, trying the
// endpoints hosts.toml lists in order and falling through on any failure of one endpoint (refused, DNS,
// TLS, timeout, 4xx/5xx, a digest that does not match), as containerd's resolver does; the final error
// lists every endpoint with its reason.
//
// Authentication is anonymous only: a Bearer challenge (WWW-Authenticate: Bearer realm, service, scope)
// is answered with an anonymous token request, which is what public registries (Docker Hub, ghcr.io,
// registry.k8s.io, Artifact Registry for public images) need. Credentials (docker config, containerd's
// registry auth, credential helpers) are not supported: a registry that insists answers 401 and the error
// says so.
import { createHash } from "node:crypto";
import http, { type IncomingHttpHeaders, type IncomingMessage } from "node:http";
import https from "node:https";
import { rootCertificates } from "node:tls";
import type { Logger } from "../../log.ts";
import { EndpointsFailedError, explain, TransferError, type Attempt } from "./errors.ts";
import { endpointUrl, type Capability, type Endpoint } from "./hosts.ts";
import { sha256Digest } from "./reference.ts";
import { monotonicMs } from "../../time.ts";

export type Timeouts = {
  /** From sending a request until the response headers arrived (connect and TLS included). */
  headersMs: number;
  /** The longest pause while a body streams in; a stalled download fails after this. */
  idleMs: number;
};
export const defaultTimeouts: Timeouts = { headersMs: 30_000, idleMs: 60_000 };

export const manifestMediaTypes = {
  ociIndex: "application/vnd.oci.image.index.v1+json",
  ociManifest: "application/vnd.oci.image.manifest.v1+json",
  dockerList: "application/vnd.docker.distribution.manifest.list.v2+json",
  dockerManifest: "application/vnd.docker.distribution.manifest.v2+json",
} as const;
const acceptManifests = Object.values(manifestMediaTypes).join(", ");

/** containerd's limit: a "manifest" larger than this is not one. */
export const maxManifestBytes = 4 << 20;
const maxRedirects = 5;
const userAgent = "trellis (gardener-node-agent compatible)";

/** A non-success HTTP status from an endpoint. */
export class StatusError extends TransferError {
  override name = "StatusError";
  constructor(
    readonly status: number,
    message: string,
  ) {
    super(message);
  }
}

type Response = {
  status: number;
  headers: IncomingHttpHeaders;
  /** The body, failing with a TransferError when it stalls for idleMs or the connection breaks. */
  body: AsyncIterable<Uint8Array>;
  /** Frees the connection when the body is not wanted. */
  discard(): void;
};

type TlsOptions = { ca?: string[]; rejectUnauthorized: boolean; cert?: string[]; key?: string[] };

/**
 * What a request may carry of endpoint `e`'s hosts.toml settings; `own`: it goes to the endpoint's own
 * origin (scheme, host and port). Its headers (which may hold credentials, e.g. an Authorization for a
 * private mirror), client certificates and skip_verify belong to that origin and go nowhere else: not to
 * a redirect target (a blob CDN), nor to a token realm on another host. Stricter than containerd, which
 * follows a redirect with the same Go client (skip_verify and client certificates included, and every
 * header but Authorization and Cookie): a redirect is the other server's choice, and skip_verify there
 * would let anyone on the way answer in its name. The `ca` files still apply, as in containerd: a CA is
 * trust, not a credential, and a private mirror's storage usually shares its PKI; verification stays on.
 */
function settingsFor(e: Endpoint, own: boolean): { headers: Record<string, string[]>; tls: TlsOptions } {
  return {
    headers: own ? e.headers : {},
    tls: {
      rejectUnauthorized: !(own && e.skipVerify),
      // node's `ca` replaces the system roots; containerd adds to them.
      ...(e.ca.length > 0 ? { ca: [...rootCertificates, ...e.ca] } : {}),
      ...(own && e.clients.length > 0 ? { cert: e.clients.map((c) => c.cert), key: e.clients.map((c) => c.key) } : {}),
    },
  };
}

function abortReason(signal: AbortSignal): Error {
  return signal.reason instanceof Error ? signal.reason : new Error(`aborted: ${String(signal.reason)}`);
}

/** One HTTP exchange with a deadline on the headers and an idle deadline on the body. */
function send(url: URL, o: { method: string; headers: Record<string, string | string[]>; tls: TlsOptions; timeouts: Timeouts; signal?: AbortSignal | undefined }): Promise<Response> {
  return new Promise((resolve, reject) => {
    if (o.signal?.aborted) return reject(abortReason(o.signal));
    const secure = url.protocol === "https:";
    const options = { method: o.method, headers: o.headers, agent: false as const, ...(secure ? o.tls : {}) };
    const req = secure ? https.request(url, options) : http.request(url, options);
    const onAbort = () => req.destroy(abortReason(o.signal as AbortSignal));
    o.signal?.addEventListener("abort", onAbort, { once: true });
    const timer = setTimeout(() => req.destroy(new TransferError(`no response within ${o.timeouts.headersMs} ms`)), o.timeouts.headersMs);
    req.on("error", () => {}); // errors after the first (or after the response) are the body's to report
    req.once("error", (err) => {
      clearTimeout(timer);
      o.signal?.removeEventListener("abort", onAbort);
      reject(o.signal?.aborted ? abortReason(o.signal) : err instanceof TransferError ? err : new TransferError(explain(err), { cause: err }));
    });
    req.once("response", (res: IncomingMessage) => {
      clearTimeout(timer);
      // A body never read (discarded) must not crash the process when its connection breaks; one that is
      // read reports the error through its iterator, which listens itself.
      res.on("error", () => {});
      resolve({
        status: res.statusCode ?? 0,
        headers: res.headers,
        body: timedBody(res, o.timeouts.idleMs, o.signal, () => o.signal?.removeEventListener("abort", onAbort)),
        discard: () => {
          o.signal?.removeEventListener("abort", onAbort);
          res.destroy();
        },
      });
    });
    req.end();
  });
}

// Arms a timer only while waiting for the next chunk: time the consumer spends writing is not a stall.
async function* timedBody(res: IncomingMessage, idleMs: number, signal: AbortSignal | undefined, done: () => void): AsyncGenerator<Uint8Array> {
  const it = res[Symbol.asyncIterator]() as AsyncIterator<Uint8Array>;
  try {
    for (;;) {
      const timer = setTimeout(() => res.destroy(new TransferError(`download stalled: no data for ${idleMs} ms`)), idleMs);
      let next: IteratorResult<Uint8Array>;
      try {
        next = await it.next();
      } catch (err) {
        if (signal?.aborted) throw abortReason(signal);
        throw err instanceof TransferError ? err : new TransferError(`download interrupted: ${explain(err)}`, { cause: err });
      } finally {
        clearTimeout(timer);
      }
      if (next.done) return;
      yield next.value;
    }
  } finally {
    done();
    if (!res.complete) res.destroy();
  }
}

async function readAll(body: AsyncIterable<Uint8Array>, max: number, what: string): Promise<Buffer> {
  const chunks: Uint8Array[] = [];
  let size = 0;
  for await (const chunk of body) {
    size += chunk.length;
    if (size > max) throw new TransferError(`${what} is larger than ${max} bytes`);
    chunks.push(chunk);
  }
  return Buffer.concat(chunks);
}

/** `Bearer realm="…",service="…"` → { scheme: "bearer", params }. */
export function parseChallenge(header: string): { scheme: string; params: Record<string, string> } {
  const space = header.indexOf(" ");
  const scheme = (space < 0 ? header : header.slice(0, space)).toLowerCase();
  const params: Record<string, string> = {};
  const re = /([A-Za-z0-9_-]+)\s*=\s*(?:"((?:[^"\\]|\\.)*)"|([^,\s]*))/g;
  for (const m of (space < 0 ? "" : header.slice(space + 1)).matchAll(re)) {
    params[(m[1] as string).toLowerCase()] = m[2] !== undefined ? m[2].replace(/\\(.)/g, "$1") : (m[3] ?? "");
  }
  return { scheme, params };
}

type Challenge = { realm: string; service?: string };

/** Anonymous bearer tokens, shared by all clients of a store; keyed by realm, service and scope. */
export class TokenCache {
  private readonly tokens = new Map<string, { token: string; expires: number }>();
  /** The challenge each origin last sent, so later requests carry a token without a 401 round trip first. */
  readonly challenges = new Map<string, Challenge>();

  // Token lifetimes are durations: measured on the monotonic clock.
  get(key: string, now = monotonicMs()): string | undefined {
    const t = this.tokens.get(key);
    return t && t.expires > now ? t.token : undefined;
  }
  set(key: string, token: string, lifetimeSeconds: number, now = monotonicMs()): void {
    // A little early, so a token does not expire between check and use.
    this.tokens.set(key, { token, expires: now + Math.max(lifetimeSeconds - 10, 1) * 1000 });
  }
}

export type ManifestBytes = { bytes: Buffer; mediaType: string | undefined; digest: string; endpoint: string };

export class RegistryClient {
  /** Endpoints that failed on the way to one that answered, for one summary line per extraction. */
  readonly fellThrough: Attempt[] = [];

  constructor(
    private readonly o: {
      registry: string;
      repository: string;
      endpoints: Endpoint[];
      tokens: TokenCache;
      timeouts: Timeouts;
      log: Logger;
      signal?: AbortSignal | undefined;
    },
  ) {}

  /**
   * The digest `tag` points at, by HEAD on the endpoints that may resolve. When the HEAD is refused (405)
   * or names no digest, a GET: the digest is then the hash of the bytes, which are returned with it.
   */
  resolveTag(tag: string): Promise<{ digest: string; endpoint: string; manifest?: ManifestBytes }> {
    return this.tryEach(`resolving tag ${tag}`, "resolve", async (e) => {
      let res = await this.request(e, "HEAD", `/manifests/${encodeURIComponent(tag)}`, { accept: acceptManifests });
      res.discard();
      const header = res.headers["docker-content-digest"];
      if (res.status === 200 && typeof header === "string" && sha256Digest.test(header)) return { digest: header, endpoint: endpointUrl(e) };
      if (res.status !== 200 && res.status !== 405) throw await statusError(res, `manifest ${tag}`);
      // HEAD not implemented, or no usable digest header: the digest is the hash of the manifest itself.
      res = await this.request(e, "GET", `/manifests/${encodeURIComponent(tag)}`, { accept: acceptManifests });
      if (res.status !== 200) throw await statusError(res, `manifest ${tag}`);
      const bytes = await readAll(res.body, maxManifestBytes, `manifest ${tag}`);
      const digest = `sha256:${createHash("sha256").update(bytes).digest("hex")}`;
      return { digest, endpoint: endpointUrl(e), manifest: { bytes, mediaType: contentType(res), digest, endpoint: endpointUrl(e) } };
    });
  }

  /** The manifest (or index) with this digest, verified: sha256 of the bytes received. */
  fetchManifest(digest: string): Promise<ManifestBytes> {
    return this.tryEach(`fetching manifest ${digest}`, "pull", async (e) => {
      const res = await this.request(e, "GET", `/manifests/${digest}`, { accept: acceptManifests });
      if (res.status !== 200) throw await statusError(res, `manifest ${digest}`);
      const bytes = await readAll(res.body, maxManifestBytes, `manifest ${digest}`);
      verifyDigest(digest, bytes);
      return { bytes, mediaType: contentType(res), digest, endpoint: endpointUrl(e) };
    });
  }

  /** A small blob (an image config) read whole and verified. */
  fetchSmallBlob(digest: string, maxBytes: number, what: string): Promise<Buffer> {
    return this.fetchBlob(digest, what, async (body) => {
      const bytes = await readAll(body, maxBytes, what);
      verifyDigest(digest, bytes);
      return bytes;
    });
  }

  /**
   * Streams the blob into `consume`, endpoint after endpoint until one succeeds. `consume` verifies the
   * digest itself (while streaming) and throws TransferError when this copy is bad, so the next is tried.
   */
  fetchBlob<T>(digest: string, what: string, consume: (body: AsyncIterable<Uint8Array>, endpoint: string) => Promise<T>): Promise<T> {
    return this.tryEach(`fetching ${what}`, "pull", async (e) => {
      const res = await this.request(e, "GET", `/blobs/${digest}`, {});
      if (res.status !== 200) throw await statusError(res, `blob ${digest}`);
      try {
        return await consume(res.body, endpointUrl(e));
      } finally {
        res.discard();
      }
    });
  }

  private async tryEach<T>(what: string, capability: Capability, attempt: (e: Endpoint) => Promise<T>): Promise<T> {
    const attempts: Attempt[] = [];
    for (const e of this.o.endpoints) {
      if (!e.capabilities.has(capability)) continue;
      if (this.o.signal?.aborted) throw abortReason(this.o.signal);
      const started = monotonicMs();
      try {
        const result = await attempt(e);
        this.fellThrough.push(...attempts);
        return result;
      } catch (err) {
        if (this.o.signal?.aborted) throw abortReason(this.o.signal);
        // Only a bad answer or connection is worth another endpoint; a local failure (disk full) is not.
        if (!(err instanceof TransferError)) throw err;
        const reason = explain(err);
        attempts.push({ endpoint: endpointUrl(e), reason, ...(err instanceof StatusError ? { status: err.status } : {}) });
        this.o.log.debug("registry endpoint failed", { what, endpoint: endpointUrl(e), reason, ms: Math.round(monotonicMs() - started) });
      }
    }
    throw new EndpointsFailedError(what, attempts);
  }

  /**
   * A request to `endpoint` for this repository, answering a Bearer challenge once and following redirects.
   * Once a redirect leaves the endpoint's origin, the rest of the chain carries none of its credentials
   * (the bearer token, hosts.toml's headers and client certificates) and no skip_verify, even if a later
   * hop comes back: where it leads is then the other server's choice.
   */
  private async request(e: Endpoint, method: string, suffix: string, extra: Record<string, string>): Promise<Response> {
    // containerd sends `?ns=<registry>` to mirrors, so one mirror can serve several upstream registries.
    let url = new URL(`${e.origin}${e.path}/${this.o.repository}${suffix}${e.mirror ? `?ns=${encodeURIComponent(this.o.registry)}` : ""}`);
    let left = false;
    let token = await this.tokenFor(e, undefined);
    let challenged = false;
    for (let hop = 0; ; ) {
      const own = settingsFor(e, !left);
      const headers: Record<string, string | string[]> = { "user-agent": userAgent, ...own.headers, ...extra };
      if (token !== undefined && !left) headers.authorization = `Bearer ${token}`;
      const started = monotonicMs();
      const res = await send(url, { method, headers, tls: own.tls, timeouts: this.o.timeouts, signal: this.o.signal }).catch((err: unknown) => {
        throw hop > 0 && err instanceof TransferError ? new TransferError(`redirected to ${url.origin}${url.pathname}: ${explain(err)}`, { cause: err }) : err;
      });
      this.o.log.debug("registry request", { method, url: url.href, status: res.status, ms: Math.round(monotonicMs() - started) });
      if (res.status === 401 && !challenged && !left) {
        res.discard();
        challenged = true;
        const header = res.headers["www-authenticate"];
        const challenge = typeof header === "string" ? parseChallenge(header) : undefined;
        if (challenge?.scheme !== "bearer" || !challenge.params.realm) {
          throw new StatusError(401, `unauthorized${challenge ? ` (${challenge.scheme} authentication)` : ""}; trellis pulls anonymously and has no registry credentials`);
        }
        this.o.tokens.challenges.set(e.origin, {
          realm: challenge.params.realm,
          ...(challenge.params.service !== undefined ? { service: challenge.params.service } : {}),
        });
        token = await this.tokenFor(e, this.o.tokens.challenges.get(e.origin));
        continue;
      }
      if (res.status === 401) {
        res.discard();
        throw new StatusError(401, "unauthorized even with an anonymous token; trellis has no registry credentials (pull access denied, or the repository does not exist)");
      }
      if ([301, 302, 303, 307, 308].includes(res.status) && typeof res.headers.location === "string") {
        res.discard();
        if (++hop > maxRedirects) throw new TransferError(`more than ${maxRedirects} redirects`);
        url = new URL(res.headers.location, url);
        left ||= url.origin !== e.origin;
        continue;
      }
      return res;
    }
  }

  private async tokenFor(e: Endpoint, fresh: Challenge | undefined): Promise<string | undefined> {
    const challenge = fresh ?? this.o.tokens.challenges.get(e.origin);
    if (!challenge) return undefined;
    // Our own scope rather than the challenge's: a challenge to an earlier request may name another action.
    const scope = `repository:${this.o.repository}:pull`;
    const key = `${challenge.realm}\n${challenge.service ?? ""}\n${scope}`;
    const cached = this.o.tokens.get(key);
    if (cached !== undefined) return cached;

    let url: URL;
    try {
      url = new URL(challenge.realm);
    } catch {
      throw new TransferError(`token realm ${JSON.stringify(challenge.realm)} is not a URL`);
    }
    if (url.protocol !== "https:" && url.protocol !== "http:") throw new TransferError(`token realm ${challenge.realm} is not http(s)`);
    if (challenge.service !== undefined) url.searchParams.set("service", challenge.service);
    url.searchParams.set("scope", scope);
    const own = settingsFor(e, url.origin === e.origin);
    const res = await send(url, { method: "GET", headers: { "user-agent": userAgent, ...own.headers }, tls: own.tls, timeouts: this.o.timeouts, signal: this.o.signal });
    if (res.status !== 200) throw await statusError(res, `anonymous token from ${url.origin}${url.pathname}`);
    const body = await readAll(res.body, 1 << 20, "token response");
    let parsed: { token?: unknown; access_token?: unknown; expires_in?: unknown };
    try {
      parsed = JSON.parse(body.toString("utf8")) as typeof parsed;
    } catch {
      throw new TransferError(`token response from ${url.origin}${url.pathname} is not JSON`);
    }
    const token = typeof parsed.token === "string" ? parsed.token : typeof parsed.access_token === "string" ? parsed.access_token : undefined;
    if (!token) throw new TransferError(`token response from ${url.origin}${url.pathname} holds no token`);
    this.o.tokens.set(key, token, typeof parsed.expires_in === "number" && parsed.expires_in > 0 ? parsed.expires_in : 60);
    return token;
  }
}

function contentType(res: Response): string | undefined {
  const t = res.headers["content-type"];
  return typeof t === "string" ? (t.split(";")[0] as string).trim() : undefined;
}

export function verifyDigest(expected: string, bytes: Uint8Array): void {
  const got = `sha256:${createHash("sha256").update(bytes).digest("hex")}`;
  if (got !== expected) throw new TransferError(`digest mismatch: expected ${expected}, got ${got}`);
}

/** A StatusError saying what the registry said (its JSON error body, if any). */
async function statusError(res: Response, what: string): Promise<StatusError> {
  let detail = "";
  try {
    const body = (await readAll(res.body, 16 << 10, "error body")).toString("utf8");
    const parsed = JSON.parse(body) as { errors?: { code?: unknown; message?: unknown }[] };
    const first = parsed.errors?.[0];
    if (first) detail = `: ${[first.code, first.message].filter((x) => typeof x === "string").join(" ")}`;
  } catch {
    // The error body is only a detail: an empty, HTML or cut-off one still leaves the status to report.
  } finally {
    res.discard();
  }
  const known: Record<number, string> = { 404: "not found", 403: "forbidden", 429: "too many requests", 500: "server error", 502: "bad gateway", 503: "unavailable", 504: "gateway timeout" };
  return new StatusError(res.status, `${what}: HTTP ${res.status}${known[res.status] ? ` ${known[res.status]}` : ""}${detail}`);
}
