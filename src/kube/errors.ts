// Turns the failures of talking to the API server into one sentence an operator can act on.
import { ApiException } from "@kubernetes/client-node/dist/gen/apis/exception.js";

export class KubeError extends Error {
  override name = "KubeError";
  constructor(
    message: string,
    readonly reason: "tls-untrusted" | "tls-hostname" | "unreachable" | "unauthorized" | "forbidden" | "not-found" | "conflict" | "gone" | "http" | "other",
    readonly status?: number,
    options?: { cause?: unknown; retryAfterMs?: number },
  ) {
    super(message, options);
    this.retryAfterMs = options?.retryAfterMs;
  }
  /** When the API server asked for the retry (a Status's details.retryAfterSeconds, as with its 429s). */
  readonly retryAfterMs: number | undefined;
}

// TLS verification failures as Bun's and Node's TLS stacks report them.
const untrusted = new Set([
  "DEPTH_ZERO_SELF_SIGNED_CERT",
  "SELF_SIGNED_CERT_IN_CHAIN",
  "UNABLE_TO_VERIFY_LEAF_SIGNATURE",
  "UNABLE_TO_GET_ISSUER_CERT",
  "UNABLE_TO_GET_ISSUER_CERT_LOCALLY",
  "CERT_SIGNATURE_FAILURE",
  "CERT_UNTRUSTED",
]);
const unreachable = new Set(["ECONNREFUSED", "ECONNRESET", "EHOSTUNREACH", "ENETUNREACH", "ETIMEDOUT", "ENOTFOUND", "EAI_AGAIN", "ConnectionRefused", "ConnectionClosed"]);

export type RequestContext = { server: string; caSource: string; what: string };

export function explainKubeError(err: unknown, ctx: RequestContext): KubeError {
  if (err instanceof KubeError) return err;
  // No cause: an ApiException's message is a dump of the status and body summarised here, and a
  // logged cause chain would repeat it.
  if (err instanceof ApiException) return fromStatus(err.code, err.body, ctx);
  if (err instanceof Error && (err.name === "TimeoutError" || err.name === "AbortError")) {
    return new KubeError(`${ctx.what}: no answer from ${ctx.server} in time (${err.name})`, "unreachable", undefined, { cause: err });
  }
  const code = errorCode(err);
  if (code !== undefined && untrusted.has(code)) {
    return new KubeError(
      `${ctx.what}: refusing ${ctx.server}: its TLS certificate is not signed by the CA in ${ctx.caSource} (${code})`,
      "tls-untrusted",
      undefined,
      { cause: err },
    );
  }
  if (code === "ERR_TLS_CERT_ALTNAME_INVALID") {
    return new KubeError(`${ctx.what}: refusing ${ctx.server}: its TLS certificate is not valid for that host name (${code})`, "tls-hostname", undefined, { cause: err });
  }
  if (code !== undefined && unreachable.has(code)) {
    return new KubeError(`${ctx.what}: cannot reach ${ctx.server} (${code})`, "unreachable", undefined, { cause: err });
  }
  const msg = err instanceof Error ? err.message : String(err);
  return new KubeError(`${ctx.what}: ${msg}`, "other", undefined, { cause: err });
}

/** For a promise's .catch(): throws the failure explained as `what` went wrong (`api` is e.g. a Kube). */
export function rethrow(api: Omit<RequestContext, "what">, what: string): (err: unknown) => never {
  return (err) => {
    throw explainKubeError(err, { server: api.server, caSource: api.caSource, what });
  };
}

function fromStatus(status: number, body: unknown, ctx: RequestContext): KubeError {
  const detail = statusMessage(body);
  const suffix = detail ? `: ${detail}` : "";
  switch (status) {
    case 401:
      return new KubeError(`${ctx.what}: ${ctx.server} did not accept trellis's credentials (401 Unauthorized)${suffix}`, "unauthorized", status);
    case 403:
      return new KubeError(`${ctx.what}: forbidden (403)${suffix}`, "forbidden", status);
    case 404:
      return new KubeError(`${ctx.what}: not found (404)${suffix}`, "not-found", status);
    case 409:
      return new KubeError(`${ctx.what}: conflict (409)${suffix}`, "conflict", status);
    case 410:
      return new KubeError(`${ctx.what}: gone (410)${suffix}`, "gone", status);
    default:
      return new KubeError(`${ctx.what}: HTTP ${status}${suffix}`, "http", status, { retryAfterMs: retryAfterMs(body) });
  }
}

function statusMessage(body: unknown): string | undefined {
  const parsed = typeof body === "string" ? safeJson(body) : body;
  if (parsed && typeof parsed === "object" && "message" in parsed && typeof parsed.message === "string") return parsed.message;
  return typeof body === "string" && body !== "" ? body.slice(0, 300) : undefined;
}

/** A Status's details.retryAfterSeconds in ms, where the API server names one (1 to 600 s are believed). */
function retryAfterMs(body: unknown): number | undefined {
  const parsed = typeof body === "string" ? safeJson(body) : body;
  const details = parsed && typeof parsed === "object" && "details" in parsed ? parsed.details : undefined;
  const seconds = details && typeof details === "object" && "retryAfterSeconds" in details ? details.retryAfterSeconds : undefined;
  return typeof seconds === "number" && Number.isInteger(seconds) && seconds >= 1 && seconds <= 600 ? seconds * 1000 : undefined;
}

function safeJson(s: string): unknown {
  try {
    return JSON.parse(s);
  } catch {
    return undefined;
  }
}

function errorCode(err: unknown): string | undefined {
  for (let e: unknown = err; e && typeof e === "object"; e = (e as { cause?: unknown }).cause) {
    const code = (e as { code?: unknown }).code;
    if (typeof code === "string") return code;
  }
  return undefined;
}
