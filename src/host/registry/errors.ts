// The registry client's errors. Two kinds matter for control flow: a TransferError is about one copy of
// the data or one connection (another endpoint may do better, so the client tries the next one); a
// ContentError is about data that verified against its digest (every endpoint would serve the same, so
// trying on is pointless). Everything reaches the caller as an ImageError naming image and path.

export class ImageError extends Error {
  override name = "ImageError";
  constructor(
    readonly image: string,
    readonly filePathInImage: string,
    /** What failed, without the image/path prefix of `message`. */
    readonly reason: string,
    options?: { cause?: unknown },
  ) {
    super(`image ${image}, file ${filePathInImage}: ${reason}`, options);
  }
}

/** This endpoint's answer or connection was bad (wrong digest, cut off, timed out): try the next. */
export class TransferError extends Error {
  override name = "TransferError";
}

/** Verified data that cannot be used (not a tar, corrupt tar, file too large, …): stop. */
export class ContentError extends Error {
  override name = "ContentError";
}

/** One endpoint's failure, as listed in an EndpointsFailedError. */
export type Attempt = { endpoint: string; reason: string; status?: number };

/** Every endpoint was tried and failed; `attempts` says where and why, in order. */
export class EndpointsFailedError extends Error {
  override name = "EndpointsFailedError";
  constructor(
    readonly what: string,
    readonly attempts: Attempt[],
  ) {
    const list = attempts.map((a) => `${a.endpoint}: ${a.reason}`).join("; ");
    const notFound = attempts.length > 0 && attempts.every((a) => a.status === 404);
    super(
      attempts.length === 0
        ? `${what}: no endpoint is configured for this (check capabilities in hosts.toml)`
        : `${what}${notFound ? ": not found" : " failed"} on every endpoint tried (${list})`,
    );
  }
}

const reasons: Record<string, string> = {
  ECONNREFUSED: "connection refused",
  ENOTFOUND: "host name does not resolve",
  EAI_AGAIN: "host name lookup failed temporarily",
  ECONNRESET: "connection reset",
  EPIPE: "connection closed",
  ETIMEDOUT: "timed out",
  EHOSTUNREACH: "host unreachable",
  ENETUNREACH: "network unreachable",
  DEPTH_ZERO_SELF_SIGNED_CERT: "TLS certificate not trusted (self-signed)",
  SELF_SIGNED_CERT_IN_CHAIN: "TLS certificate not trusted (self-signed CA in chain)",
  UNABLE_TO_VERIFY_LEAF_SIGNATURE: "TLS certificate not trusted (unknown issuer)",
  UNABLE_TO_GET_ISSUER_CERT_LOCALLY: "TLS certificate not trusted (unknown issuer)",
  CERT_HAS_EXPIRED: "TLS certificate expired",
  ERR_TLS_CERT_ALTNAME_INVALID: "TLS certificate does not name this host",
};

/** A short explanation of a network or other error, e.g. "connection refused (ECONNREFUSED)". */
export function explain(err: unknown): string {
  const code = (err as { code?: unknown } | null)?.code;
  const message = err instanceof Error ? err.message : String(err);
  if (typeof code === "string" && reasons[code]) return message.includes(code) ? `${reasons[code]}: ${message}` : `${reasons[code]} (${code})`;
  return message;
}
