// Base64 as Go's encoding/base64.StdEncoding decodes it (Gardener's inline `b64` files, Secret data):
// padded standard alphabet, with line breaks ignored and nothing else. Buffer.from(s, "base64") would skip
// any junk character and decode the rest, so a damaged value would still be written to the node.
import { Buffer } from "node:buffer";

const strict = /^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$/;

/** The bytes, or undefined when `text` is not valid padded base64. */
export function decodeBase64(text: string): Uint8Array | undefined {
  const compact = text.replace(/[\r\n]/g, "");
  return strict.test(compact) ? new Uint8Array(Buffer.from(compact, "base64")) : undefined;
}
