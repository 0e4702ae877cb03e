// A PKCS#10 certificate signing request (RFC 2986), built by hand in DER: node:crypto makes keys and
// signatures but no CSRs, and a dependency for ~100 lines of ASN.1 would be the largest in the binary.
// Only what a client-certificate request needs: a subject of CN and O attributes, an EC P-256 key,
// no attributes or extensions (the signer takes usages and lifetime from the CSR object's spec),
// signed with ecdsa-with-SHA256.
import { Buffer } from "node:buffer";
import { createPublicKey, type KeyObject, sign } from "node:crypto";

// ---------------------------------------------------------------- DER (X.690), the few types needed

/** The length octets: short form below 128, long form (0x80 | count, big-endian) above. */
function derLength(n: number): Uint8Array {
  if (n < 0x80) return Uint8Array.of(n);
  const bytes: number[] = [];
  for (let v = n; v > 0; v = Math.floor(v / 256)) bytes.unshift(v & 0xff);
  return Uint8Array.of(0x80 | bytes.length, ...bytes);
}

/** One TLV: tag, length, content. */
export function tlv(tag: number, ...content: Uint8Array[]): Uint8Array {
  const body = Buffer.concat(content);
  return Buffer.concat([Uint8Array.of(tag), derLength(body.length), body]);
}

export const sequence = (...items: Uint8Array[]) => tlv(0x30, ...items);
export const set = (...items: Uint8Array[]) => tlv(0x31, ...items);
export const utf8String = (s: string) => tlv(0x0c, Buffer.from(s, "utf8"));
/** [n] IMPLICIT/EXPLICIT constructed context tag. */
export const context = (n: number, ...items: Uint8Array[]) => tlv(0xa0 | n, ...items);

/** A non-negative INTEGER from its big-endian magnitude (a leading 0x00 keeps a high bit from meaning "negative"). */
export function integer(magnitude: Uint8Array | number): Uint8Array {
  let bytes = typeof magnitude === "number" ? bigEndian(magnitude) : magnitude;
  let start = 0;
  while (start < bytes.length - 1 && bytes[start] === 0) start++;
  bytes = bytes.subarray(start);
  if (bytes.length === 0) bytes = Uint8Array.of(0);
  return tlv(0x02, (bytes[0] as number) & 0x80 ? Buffer.concat([Uint8Array.of(0), bytes]) : bytes);
}

function bigEndian(n: number): Uint8Array {
  if (!Number.isSafeInteger(n) || n < 0) throw new RangeError(`not a non-negative integer: ${n}`);
  const bytes: number[] = [];
  for (let v = n; v > 0; v = Math.floor(v / 256)) bytes.unshift(v & 0xff);
  return Uint8Array.from(bytes.length ? bytes : [0]);
}

/** A BIT STRING of whole bytes (0 unused bits). */
export const bitString = (bytes: Uint8Array) => tlv(0x03, Uint8Array.of(0), bytes);

/** An OBJECT IDENTIFIER from dotted notation. */
export function oid(dotted: string): Uint8Array {
  const arcs = dotted.split(".").map((a) => {
    if (!/^\d+$/.test(a)) throw new RangeError(`bad OID ${dotted}`);
    return Number(a);
  });
  const [first, second, ...rest] = arcs;
  if (first === undefined || second === undefined || first > 2) throw new RangeError(`bad OID ${dotted}`);
  const out: number[] = [];
  for (const arc of [first * 40 + second, ...rest]) {
    // base 128, most significant group first, continuation bit on all but the last
    const groups: number[] = [arc & 0x7f];
    for (let v = Math.floor(arc / 128); v > 0; v = Math.floor(v / 128)) groups.unshift((v & 0x7f) | 0x80);
    out.push(...groups);
  }
  return tlv(0x06, Uint8Array.from(out));
}

// ---------------------------------------------------------------- the request

export const oids = {
  commonName: "2.5.4.3",
  organization: "2.5.4.10",
  ecdsaWithSha256: "1.2.840.10045.4.3.2",
} as const;

export type Subject = { commonName: string; organizations: string[] };

/**
 * The subject as a Name: one RDN per value, organizations before the common name (the order Go's
 * pkix.Name uses, so the request reads like gardener-node-agent's).
 */
export function name(subject: Subject): Uint8Array {
  const rdn = (type: string, value: string) => set(sequence(oid(type), utf8String(value)));
  return sequence(...subject.organizations.map((o) => rdn(oids.organization, o)), rdn(oids.commonName, subject.commonName));
}

/** The DER and PEM of a CSR for `subject`, signed by `privateKey` (EC P-256). */
export function certificateRequest(privateKey: KeyObject, subject: Subject): { der: Uint8Array; pem: string } {
  if (privateKey.type !== "private" || privateKey.asymmetricKeyType !== "ec" || privateKey.asymmetricKeyDetails?.namedCurve !== "prime256v1") {
    throw new Error("a certificate request needs an EC P-256 private key");
  }
  if (subject.commonName === "") throw new Error("a certificate request needs a common name");
  const spki = createPublicKey(privateKey).export({ type: "spki", format: "der" });
  const info = sequence(
    integer(0), // version 1
    name(subject),
    spki,
    context(0), // attributes: none
  );
  // dsaEncoding "der": the ECDSA-Sig-Value SEQUENCE { r, s } the signature field carries.
  const signature = sign("sha256", info, { key: privateKey, dsaEncoding: "der" });
  const der = sequence(info, sequence(oid(oids.ecdsaWithSha256)), bitString(signature));
  return { der, pem: pemBlock("CERTIFICATE REQUEST", der) };
}

/** RFC 7468 text: base64 in lines of 64. */
export function pemBlock(label: string, der: Uint8Array): string {
  const b64 = Buffer.from(der).toString("base64");
  const lines = b64.match(/.{1,64}/g) ?? [];
  return `-----BEGIN ${label}-----\n${lines.join("\n")}\n-----END ${label}-----\n`;
}
