// A TCP relay in front of the API server that counts the bytes each way, so a benchmark can tell how
// much one agent received: its kubeconfig points here instead of at the API server. TLS passes through
// untouched (the serving certificate names 127.0.0.1, whatever the port), so the counts are the bytes on
// the wire: TLS records, HTTP framing and all.
import { createConnection, createServer, type Server, type Socket } from "node:net";

export interface ByteProxy {
  /** https://127.0.0.1:<port> */
  server: string;
  /** Bytes from the API server to the client, and from the client to the API server, so far. */
  counts(): { received: number; sent: number; connections: number };
  close(): Promise<void>;
}

export async function startByteProxy(target: string): Promise<ByteProxy> {
  const url = new URL(target);
  let received = 0;
  let sent = 0;
  let connections = 0;
  const sockets = new Set<Socket>();
  const srv: Server = createServer((client) => {
    connections++;
    const upstream = createConnection({ host: url.hostname, port: Number(url.port) });
    pairSockets(client, upstream, sockets);
    upstream.on("data", (b: Buffer) => {
      received += b.length;
      client.write(b);
    });
    client.on("data", (b: Buffer) => {
      sent += b.length;
      upstream.write(b);
    });
  });
  await new Promise<void>((resolve, reject) => {
    srv.once("error", reject);
    srv.listen(0, "127.0.0.1", resolve);
  });
  const port = (srv.address() as { port: number }).port;
  return {
    server: `https://127.0.0.1:${port}`,
    counts: () => ({ received, sent, connections }),
    close: () =>
      new Promise<void>((resolve) => {
        for (const s of sockets) s.destroy();
        srv.close(() => resolve());
      }),
  };
}

/** Ties a relayed pair together: an end or a reset on one side ends the other (the client sees its connection close and retries); `open` holds both while they live. */
export function pairSockets(a: Socket, b: Socket, open: Set<Socket>): void {
  for (const s of [a, b]) {
    open.add(s);
    s.on("close", () => open.delete(s));
    s.on("error", () => {
      a.destroy();
      b.destroy();
    });
  }
  a.on("end", () => b.end());
  b.on("end", () => a.end());
}
