// The Lease's MicroTime fields, read and written. client-node 2.0.1 types them as V1MicroTime (a Date),
// but what the agent reads is the server's JSON, so a string (src/kube/api.ts decodes nothing). Writing needs
// V1MicroTime: a plain Date goes out with 3 fractional digits, and kube-apiserver answers 400 to anything
// but exactly 6 ("cannot parse ".123Z" as ".000000"", v1.35).
import { V1MicroTime } from "@kubernetes/client-node/dist/types.js";

/** A MicroTime as read (the server's string, or a Date) in ms since the epoch; undefined when absent or unparsable. */
export function timeOf(t: Date | string | undefined): number | undefined {
  if (t === undefined) return undefined;
  const ms = t instanceof Date ? t.getTime() : Date.parse(t);
  return Number.isFinite(ms) ? ms : undefined;
}

/** MicroTime's wire form, RFC 3339 with 6 fractional digits (JavaScript's clock has milliseconds: the last 3 are 0). */
export function microTime(d: Date): V1MicroTime {
  return new V1MicroTime(d.getTime());
}

/** A time read from the server goes back as it came (the server's string keeps its microseconds). */
export function keepMicroTime(t: Date | string | undefined): V1MicroTime | undefined {
  if (t === undefined || typeof t === "string" || t instanceof V1MicroTime) return t as V1MicroTime | undefined;
  return microTime(t);
}
