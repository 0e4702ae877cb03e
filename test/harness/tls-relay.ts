// A TLS-terminating relay in front of the API server, for tracing what an agent sends and receives:
// it serves the API server's own certificate (so the agent's CA still verifies it), offers the same
// ALPN protocols (h2, http/1.1), and forwards each connection upstream with the protocol the agent
// chose and the agent's own client certificate (asked for when the connection opens). In between it
// parses the plaintext, HTTP/1.1 messages or HTTP/2 frames, into exchanges: a request and its
// response, with the bytes of their heads and bodies and how the bodies are encoded. HTTP/2 headers
// are not decoded (HPACK); a benchmark names an exchange from the audit log by its time. A byte-counting
// TCP relay in front of the TLS listener counts the bytes on the wire, TLS records included.
import type { Socket } from "node:net";
import { connect, createServer, type Server, type TLSSocket } from "node:tls";
import { pairSockets, startByteProxy } from "./byte-proxy.ts";

export type BodyEncoding = "json" | "protobuf" | "gzip" | "other" | "none";

export interface Message {
  /** HTTP/1.1: the start line and headers with their CRLFs; HTTP/2: HEADERS and CONTINUATION frames with their 9-byte frame headers. */
  headBytes: number;
  /** HTTP/1.1: the body as sent, chunk framing included; HTTP/2: DATA frames with their frame headers. */
  bodyBytes: number;
  encoding: BodyEncoding;
  /** The kind of the first object in the body (JSON "kind", or the protobuf envelope's TypeMeta). */
  kind?: string;
}

export interface Exchange {
  connection: number;
  protocol: string;
  /** HTTP/2 stream id; 0 for HTTP/1.1. */
  stream: number;
  /** Wall clock (ms since the epoch) when the request's first byte arrived. */
  startMs: number;
  /** HTTP/1.1 only (HTTP/2 sends them HPACK-compressed). */
  method?: string;
  path?: string;
  /** HTTP/1.1 only: each request header's name and its bytes on the wire (name, value, CRLF); values are not kept (they may hold credentials). */
  requestHeaders?: [string, number][];
  /** HTTP/1.1; for HTTP/2 only when the server sent it as an indexed static-table entry (200, 204, 206, 304, 400, 404, 500). */
  status?: number;
  request: Message;
  response: Message;
  /** The response ended (a watch's only when it is closed). */
  done: boolean;
}

export interface ConnectionTrace {
  id: number;
  protocol: string;
  /** Decrypted bytes from the agent / to the agent. */
  plain: { sent: number; received: number };
  /** HTTP/2 bytes outside any request's HEADERS and DATA: the preface, SETTINGS, PING, WINDOW_UPDATE, RST_STREAM, GOAWAY, PRIORITY. */
  control: { sent: number; received: number };
}

export interface TlsRelay {
  /** https://127.0.0.1:<port>, for the agent's kubeconfig. */
  server: string;
  exchanges(): Exchange[];
  connections(): ConnectionTrace[];
  /** TLS bytes on the wire from the agent / to the agent, over all connections. */
  wire(): { sent: number; received: number };
  close(): Promise<void>;
}

export interface TlsRelayOptions {
  /** https://host:port of the API server. */
  target: string;
  caPem: string;
  /** A serving certificate and key the agent trusts for 127.0.0.1 (the API server's own). */
  servingCertPem: string;
  servingKeyPem: string;
  /** The agent's client certificate and key, asked for at each new connection (the agent may not have them yet when the relay starts). */
  clientCredentials(): { certPem: string; keyPem: string };
}

export async function startTlsRelay(opts: TlsRelayOptions): Promise<TlsRelay> {
  const url = new URL(opts.target);
  const exchanges: Exchange[] = [];
  const traces: ConnectionTrace[] = [];
  const wire = { sent: 0, received: 0 };
  const sockets = new Set<Socket>();
  const tlsServer: Server = createServer({ cert: opts.servingCertPem, key: opts.servingKeyPem, ALPNProtocols: ["h2", "http/1.1"] }, (agent: TLSSocket) => {
    const protocol = agent.alpnProtocol || "http/1.1";
    const trace: ConnectionTrace = { id: traces.length + 1, protocol, plain: { sent: 0, received: 0 }, control: { sent: 0, received: 0 } };
    traces.push(trace);
    const { certPem, keyPem } = opts.clientCredentials();
    const upstream = connect({ host: url.hostname, port: Number(url.port), ca: opts.caPem, cert: certPem, key: keyPem, ALPNProtocols: [protocol] });
    const parser = protocol === "h2" ? new H2Parser(trace, exchanges) : new H1Parser(trace, exchanges);
    pairSockets(agent, upstream, sockets);
    agent.on("data", (b: Buffer) => {
      trace.plain.sent += b.length;
      parser.fromAgent(b);
      upstream.write(b);
    });
    upstream.on("data", (b: Buffer) => {
      trace.plain.received += b.length;
      parser.fromServer(b);
      agent.write(b);
    });
  });
  const tlsPort = await new Promise<number>((resolve, reject) => {
    tlsServer.once("error", reject);
    tlsServer.listen(0, "127.0.0.1", () => resolve((tlsServer.address() as { port: number }).port));
  });
  const front = await startByteProxy(`https://127.0.0.1:${tlsPort}`);
  return {
    server: front.server,
    exchanges: () => exchanges,
    connections: () => traces,
    wire: () => {
      const { sent, received } = front.counts();
      return { sent, received };
    },
    close: async () => {
      await front.close();
      for (const s of sockets) s.destroy();
      await new Promise<void>((resolve) => tlsServer.close(() => resolve()));
    },
  };
}

const newMessage = () => ({ headBytes: 0, bodyBytes: 0, encoding: "none" as BodyEncoding, sniff: Buffer.alloc(0) });
type Building = ReturnType<typeof newMessage>;
const SNIFF_BYTES = 512;

function addBody(m: Building, framed: number, data: Buffer): void {
  m.bodyBytes += framed;
  if (m.sniff.length < SNIFF_BYTES && data.length) m.sniff = Buffer.concat([m.sniff, data.subarray(0, SNIFF_BYTES - m.sniff.length)]);
}

function finish(m: Building, contentEncoding?: string): Message {
  const { encoding, kind } = sniff(m.sniff, contentEncoding);
  return { headBytes: m.headBytes, bodyBytes: m.bodyBytes, encoding, ...(kind ? { kind } : {}) };
}

type Open = { exchange: Exchange; request: Building; response: Building; contentEncoding?: string };

/** Publishes the exchange's message summaries as they grow (a watch's response never finishes). */
function publish(o: Open): void {
  o.exchange.request = finish(o.request);
  o.exchange.response = finish(o.response, o.contentEncoding);
}

function openExchange(trace: ConnectionTrace, exchanges: Exchange[], stream: number): Open {
  const exchange: Exchange = { connection: trace.id, protocol: trace.protocol, stream, startMs: Date.now(), request: finish(newMessage()), response: finish(newMessage()), done: false };
  exchanges.push(exchange);
  return { exchange, request: newMessage(), response: newMessage() };
}

// ---------------------------------------------------------------- HTTP/1.1

/** One keep-alive connection: requests and responses alternate (no pipelining from either agent). */
class H1Parser {
  private queue: Open[] = [];
  private readonly req = new H1Stream("request");
  private readonly res = new H1Stream("response");

  constructor(trace: ConnectionTrace, exchanges: Exchange[]) {
    this.req.onHead = (head, bytes) => {
      const o = openExchange(trace, exchanges, 0);
      const [startLine = "", ...fields] = head.split("\r\n").filter((l) => l !== "");
      const [method, path] = startLine.split(" ");
      const requestHeaders = fields.map((l): [string, number] => [l.slice(0, l.indexOf(":")), Buffer.byteLength(l) + 2]);
      Object.assign(o.exchange, { method, path, requestHeaders });
      o.request.headBytes = bytes;
      this.queue.push(o);
    };
    this.req.onBody = (framed, data) => this.withLast((o) => addBody(o.request, framed, data));
    this.req.onEnd = () => this.withLast(publish);
    this.res.onHead = (head, bytes) =>
      this.withFirst((o) => {
        o.exchange.status = Number(head.split(" ")[1]);
        o.contentEncoding = header(head, "content-encoding");
        o.response.headBytes = bytes;
        publish(o);
      });
    this.res.onBody = (framed, data) =>
      this.withFirst((o) => {
        addBody(o.response, framed, data);
        publish(o);
      });
    this.res.onEnd = () => {
      const o = this.queue.shift();
      if (!o) return;
      publish(o);
      o.exchange.done = true;
    };
  }
  fromAgent(b: Buffer): void {
    this.req.feed(b);
  }
  fromServer(b: Buffer): void {
    this.res.feed(b);
  }
  private withLast(f: (o: Open) => void): void {
    const o = this.queue.at(-1);
    if (o) f(o);
  }
  private withFirst(f: (o: Open) => void): void {
    const o = this.queue[0];
    if (o) f(o);
  }
}

function header(head: string, name: string): string | undefined {
  return new RegExp(`^${name}:\\s*(.*?)\\s*$`, "im").exec(head)?.[1];
}

/** One direction of an HTTP/1.1 connection, split into messages: head, body (content-length, chunked, or to the end), end. */
class H1Stream {
  onHead: (head: string, bytes: number) => void = () => {};
  onBody: (framed: number, data: Buffer) => void = () => {};
  onEnd: () => void = () => {};
  private buf: Buffer = Buffer.alloc(0);
  private state: { s: "head" } | { s: "length"; left: number } | { s: "chunk-size" } | { s: "chunk-data"; left: number } | { s: "trailer" } | { s: "to-close" } = { s: "head" };

  constructor(private readonly kind: "request" | "response") {}

  feed(b: Buffer): void {
    this.buf = this.buf.length ? Buffer.concat([this.buf, b]) : b;
    while (this.buf.length) {
      const st = this.state;
      if (st.s === "head") {
        const end = this.buf.indexOf("\r\n\r\n");
        if (end < 0) return;
        const head = this.buf.subarray(0, end + 4).toString("latin1");
        this.buf = this.buf.subarray(end + 4);
        this.onHead(head, end + 4);
        this.state = this.bodyAfter(head);
        if (this.state.s === "head") this.onEnd();
      } else if (st.s === "length" || st.s === "chunk-data") {
        const take = Math.min(st.left, this.buf.length);
        // A chunk's trailing CRLF is framing: counted, not sniffed.
        const data = st.s === "chunk-data" ? this.buf.subarray(0, Math.min(take, Math.max(0, st.left - 2))) : this.buf.subarray(0, take);
        this.onBody(take, data);
        this.buf = this.buf.subarray(take);
        st.left -= take;
        if (st.left === 0) {
          this.state = st.s === "length" ? { s: "head" } : { s: "chunk-size" };
          if (this.state.s === "head") this.onEnd();
        }
      } else if (st.s === "chunk-size" || st.s === "trailer") {
        const eol = this.buf.indexOf("\r\n");
        if (eol < 0) return;
        const line = this.buf.subarray(0, eol).toString("latin1");
        this.onBody(eol + 2, Buffer.alloc(0));
        this.buf = this.buf.subarray(eol + 2);
        if (st.s === "trailer") {
          if (line === "") {
            this.state = { s: "head" };
            this.onEnd();
          }
        } else {
          const size = Number.parseInt(line, 16);
          this.state = size === 0 ? { s: "trailer" } : { s: "chunk-data", left: size + 2 };
        }
      } else {
        this.onBody(this.buf.length, this.buf);
        this.buf = Buffer.alloc(0);
      }
    }
  }

  private bodyAfter(head: string): H1Stream["state"] {
    const status = this.kind === "response" ? Number(head.split(" ")[1]) : 0;
    if (status === 204 || status === 304 || (status >= 100 && status < 200)) return { s: "head" };
    if (/chunked/i.test(header(head, "transfer-encoding") ?? "")) return { s: "chunk-size" };
    const length = header(head, "content-length");
    if (length !== undefined) return Number(length) > 0 ? { s: "length", left: Number(length) } : { s: "head" };
    return this.kind === "request" ? { s: "head" } : { s: "to-close" };
  }
}

// ---------------------------------------------------------------- HTTP/2

const PREFACE = 24;
const FRAME = { DATA: 0, HEADERS: 1, RST_STREAM: 3, CONTINUATION: 9 } as const;
const FLAG = { END_STREAM: 0x1, PADDED: 0x8 } as const;
/** HPACK static-table indices of :status values (RFC 7541, appendix A): an indexed field is 0x80 | index. */
const STATIC_STATUS: Record<number, number> = { 0x88: 200, 0x89: 204, 0x8a: 206, 0x8b: 304, 0x8c: 400, 0x8d: 404, 0x8e: 500 };

class H2Parser {
  private readonly streams = new Map<number, Open>();
  private readonly agent = new FrameReader(PREFACE);
  private readonly server = new FrameReader(0);

  constructor(
    private readonly trace: ConnectionTrace,
    private readonly exchanges: Exchange[],
  ) {
    this.trace.control.sent += PREFACE;
  }
  fromAgent(b: Buffer): void {
    for (const f of this.agent.feed(b)) this.frame(f, "agent");
  }
  fromServer(b: Buffer): void {
    for (const f of this.server.feed(b)) this.frame(f, "server");
  }

  private frame(f: Frame, from: "agent" | "server"): void {
    const size = 9 + f.payload.length;
    const isStreamFrame = f.stream !== 0 && (f.type === FRAME.DATA || f.type === FRAME.HEADERS || f.type === FRAME.CONTINUATION);
    if (!isStreamFrame) {
      this.trace.control[from === "agent" ? "sent" : "received"] += size;
      if (f.type === FRAME.RST_STREAM) this.end(f.stream);
      return;
    }
    let o = this.streams.get(f.stream);
    if (!o) {
      if (from === "server") return; // a stream the relay never saw opened
      o = openExchange(this.trace, this.exchanges, f.stream);
      this.streams.set(f.stream, o);
    }
    const m = from === "agent" ? o.request : o.response;
    if (f.type === FRAME.DATA) {
      const pad = f.flags & FLAG.PADDED ? (f.payload[0] ?? 0) + 1 : 0;
      addBody(m, size, f.payload.subarray(pad ? 1 : 0, f.payload.length - (pad ? pad - 1 : 0)));
    } else {
      if (from === "server" && f.type === FRAME.HEADERS && m.headBytes === 0) o.exchange.status = STATIC_STATUS[f.payload[0] ?? 0];
      m.headBytes += size;
    }
    publish(o);
    if (from === "server" && f.flags & FLAG.END_STREAM && f.type !== FRAME.CONTINUATION) this.end(f.stream);
  }

  private end(stream: number): void {
    const o = this.streams.get(stream);
    if (!o) return;
    publish(o);
    o.exchange.done = true;
    this.streams.delete(stream);
  }
}

type Frame = { type: number; flags: number; stream: number; payload: Buffer };

class FrameReader {
  private buf: Buffer = Buffer.alloc(0);
  constructor(private skip: number) {}
  *feed(b: Buffer): Generator<Frame> {
    this.buf = this.buf.length ? Buffer.concat([this.buf, b]) : b;
    if (this.skip) {
      const n = Math.min(this.skip, this.buf.length);
      this.buf = this.buf.subarray(n);
      this.skip -= n;
    }
    while (this.buf.length >= 9) {
      const length = this.buf.readUIntBE(0, 3);
      if (this.buf.length < 9 + length) return;
      yield { type: this.buf[3] as number, flags: this.buf[4] as number, stream: this.buf.readUInt32BE(5) & 0x7fffffff, payload: this.buf.subarray(9, 9 + length) };
      this.buf = this.buf.subarray(9 + length);
    }
  }
}

// ---------------------------------------------------------------- bodies

const K8S_PROTOBUF_MAGIC = Buffer.from([0x6b, 0x38, 0x73, 0x00]); // "k8s\0"

/**
 * What a body's first bytes say about it: JSON, gzip, or Kubernetes' protobuf envelope ("k8s\0" and
 * a runtime.Unknown); a protobuf watch stream frames each event with a 4-byte length and a raw
 * WatchEvent{type, object} whose object is such an envelope, so the magic is looked for near the start.
 */
export function sniff(first: Buffer, contentEncoding?: string): { encoding: BodyEncoding; kind?: string } {
  if (first.length === 0) return { encoding: "none" };
  if (contentEncoding === "gzip" || (first[0] === 0x1f && first[1] === 0x8b)) return { encoding: "gzip" };
  const magic = first.subarray(0, 32).indexOf(K8S_PROTOBUF_MAGIC);
  if (magic >= 0) return { encoding: "protobuf", kind: protobufKind(first.subarray(magic + 4)) };
  const text = first.toString("utf8").trimStart();
  if (text.startsWith("{")) return { encoding: "json", kind: /"kind"\s*:\s*"([^"]*)"/.exec(text)?.[1] };
  return { encoding: "other" };
}

/** runtime.Unknown{typeMeta: TypeMeta{apiVersion: 1, kind: 2}: 1}: field 1 (LEN) holding fields 1 and 2 (LEN). */
function protobufKind(b: Buffer): string | undefined {
  let at = 0;
  const varint = () => {
    let v = 0;
    for (let shift = 0; at < b.length && shift < 35; shift += 7) {
      const byte = b[at++] as number;
      v |= (byte & 0x7f) << shift;
      if (!(byte & 0x80)) return v;
    }
    return -1;
  };
  if (b[at++] !== 0x0a || varint() < 0) return undefined;
  if (b[at++] !== 0x0a) return undefined;
  const apiVersionLength = varint();
  at += apiVersionLength;
  if (apiVersionLength < 0 || b[at++] !== 0x12) return undefined;
  const kindLength = varint();
  return kindLength < 0 || at + kindLength > b.length ? undefined : b.subarray(at, at + kindLength).toString("utf8");
}
