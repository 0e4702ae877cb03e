// How the tracing relay (test/harness/tls-relay.ts) tells a body's encoding and kind from its first bytes.
import { expect, test } from "bun:test";
import { sniff } from "../harness/tls-relay.ts";

/** "k8s\0" + runtime.Unknown{typeMeta: {apiVersion, kind}}, as the API server writes protobuf. */
function envelope(apiVersion: string, kind: string): Buffer {
  const field = (n: number, b: Buffer) => Buffer.concat([Buffer.from([(n << 3) | 2, b.length]), b]);
  return Buffer.concat([Buffer.from("k8s\0", "latin1"), field(1, Buffer.concat([field(1, Buffer.from(apiVersion)), field(2, Buffer.from(kind))]))]);
}

test("JSON, with the first kind; gzip by header or magic; nothing; anything else", () => {
  expect(sniff(Buffer.from('  {"kind":"Lease","apiVersion":"coordination.k8s.io/v1"}'))).toEqual({ encoding: "json", kind: "Lease" });
  expect(sniff(Buffer.from('{"type":"ADDED","object":{"kind":"Secret"}}'))).toEqual({ encoding: "json", kind: "Secret" });
  expect(sniff(Buffer.from([0x1f, 0x8b, 8, 0]))).toEqual({ encoding: "gzip" });
  expect(sniff(Buffer.from("{}"), "gzip")).toEqual({ encoding: "gzip" });
  expect(sniff(Buffer.alloc(0))).toEqual({ encoding: "none" });
  expect(sniff(Buffer.from("plain text"))).toEqual({ encoding: "other" });
});

test("protobuf: an object's envelope, and a watch event (length prefix, raw WatchEvent around the envelope)", () => {
  expect(sniff(envelope("coordination.k8s.io/v1", "Lease"))).toEqual({ encoding: "protobuf", kind: "Lease" });
  const object = envelope("v1", "Secret");
  const event = Buffer.concat([Buffer.from([0x0a, 5]), Buffer.from("ADDED"), Buffer.from([0x12, object.length]), object]);
  const length = Buffer.alloc(4);
  length.writeUInt32BE(event.length);
  expect(sniff(Buffer.concat([length, event]))).toEqual({ encoding: "protobuf", kind: "Secret" });
  // Cut off inside the kind: still protobuf, kind unknown.
  expect(sniff(envelope("v1", "ConfigMap").subarray(0, 12))).toEqual({ encoding: "protobuf" });
});
