// containerd's own API over its unix socket — only the Version call, which is how the health
// controller tells a working containerd from a dead or hung one (gardener-node-agent makes the same
// call through containerd's Go client).
//
// Why a real request: connecting alone proves nothing, because the kernel completes connections on
// the listening socket of a stopped (SIGSTOP) or wedged containerd; only an answer does. Why by hand:
// gRPC is HTTP/2 carrying length-prefixed protobuf, so node:http2 and a few lines replace a gRPC
// library, and spawning `ctr --timeout` would cost a process per check and a binary not every node has.
import { Buffer } from "node:buffer";
import http2 from "node:http2";
import { connect } from "node:net";

export const defaultContainerdSocket = "/run/containerd/containerd.sock";

export type ContainerdVersion = { version: string; revision: string };

const versionMethod = "/containerd.services.version.v1.Version/Version";

/** containerd's version, or an error saying why there was no proper answer within `timeoutMs`. */
export function containerdVersion(socket: string, timeoutMs: number): Promise<ContainerdVersion> {
  return new Promise((resolve, reject) => {
    let settled = false;
    const session = http2.connect("http://containerd", { createConnection: () => connect(socket) });
    const finish = (err: Error | undefined, value?: ContainerdVersion) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      session.destroy();
      if (err) reject(new Error(`containerd Version call on ${socket}: ${err.message}`, { cause: err }));
      else resolve(value as ContainerdVersion);
    };
    const timer = setTimeout(() => finish(new Error(`no answer within ${timeoutMs} ms`)), timeoutMs);
    session.on("error", (err) => finish(err));

    const req = session.request({ ":method": "POST", ":path": versionMethod, "content-type": "application/grpc", te: "trailers" });
    const headers: Record<string, unknown> = {};
    const chunks: Buffer[] = [];
    req.on("response", (h) => Object.assign(headers, h));
    req.on("trailers", (t) => Object.assign(headers, t)); // a failed call may send its status in either
    req.on("data", (chunk: Buffer) => chunks.push(chunk));
    req.on("error", (err) => finish(err));
    req.on("end", () => {
      try {
        finish(undefined, decodeReply(headers, Buffer.concat(chunks)));
      } catch (err) {
        finish(err instanceof Error ? err : new Error(String(err)));
      }
    });
    req.end(Buffer.alloc(5)); // one uncompressed message of length 0: google.protobuf.Empty
  });
}

function decodeReply(headers: Record<string, unknown>, body: Buffer): ContainerdVersion {
  if (String(headers[":status"]) !== "200") throw new Error(`HTTP status ${String(headers[":status"])}`);
  const status = String(headers["grpc-status"] ?? "");
  if (status !== "0") throw new Error(`gRPC status ${status || "missing"}${headers["grpc-message"] ? `: ${String(headers["grpc-message"])}` : ""}`);
  if (body.length < 5 || body[0] !== 0) throw new Error("reply is not one uncompressed gRPC message");
  return decodeVersion(body.subarray(5, 5 + body.readUInt32BE(1)));
}

// VersionResponse { string version = 1; string revision = 2; } — protobuf's wire format, just enough of it.
function decodeVersion(msg: Uint8Array): ContainerdVersion {
  const out: ContainerdVersion = { version: "", revision: "" };
  let i = 0;
  const varint = (): number => {
    let value = 0;
    for (let shift = 0; ; shift += 7) {
      const b = msg[i++];
      if (b === undefined || shift > 49) throw new Error("truncated or oversized varint in the reply");
      value += (b & 0x7f) * 2 ** shift;
      if (b < 0x80) return value;
    }
  };
  while (i < msg.length) {
    const key = varint();
    const wire = key & 7;
    if (wire === 0) varint();
    else if (wire === 2) {
      const len = varint();
      const text = new TextDecoder().decode(msg.subarray(i, i + len));
      i += len;
      if (key >> 3 === 1) out.version = text;
      else if (key >> 3 === 2) out.revision = text;
    } else throw new Error(`unexpected protobuf wire type ${wire} in the reply`);
  }
  return out;
}
