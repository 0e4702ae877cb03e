// A TCP relay from the host's end of the node bridge (10.233.0.1 on trbr0) to a server on 127.0.0.1.
// A node with net "bridge" has its own network namespace, where 127.0.0.1 is its own loopback: the API
// server, the registry and the rest of the test's servers listen on the host's loopback only, so the node
// reaches them through this relay. Bytes pass through untouched (TLS included: the API server's serving
// certificate names 10.233.0.1 when the cluster was started with it in `servingIps`).
//
// 10.233.0.1 exists only while a bridge node runs (boot.sh creates trbr0 with the first one, stop.sh
// deletes it with the last): start the relay after booting the node and close it before stopping it.
import { createConnection, createServer, type Socket } from "node:net";
import { pairSockets } from "./byte-proxy.ts";

export const bridgeHostIp = "10.233.0.1";

export interface BridgeRelay {
  /** "10.233.0.1:<port>": where bridge nodes connect. */
  address: string;
  close(): Promise<void>;
}

/** Relays 10.233.0.1:<free port> to 127.0.0.1:`targetPort`. */
export async function startBridgeRelay(targetPort: number): Promise<BridgeRelay> {
  const sockets = new Set<Socket>();
  const srv = createServer((client) => {
    const upstream = createConnection({ host: "127.0.0.1", port: targetPort });
    pairSockets(client, upstream, sockets);
    client.pipe(upstream);
    upstream.pipe(client);
  });
  await new Promise<void>((resolve, reject) => {
    srv.once("error", (err: NodeJS.ErrnoException) =>
      reject(err.code === "EADDRNOTAVAIL" ? new Error(`${bridgeHostIp} is not up: boot a node with net "bridge" first`) : err),
    );
    srv.listen(0, bridgeHostIp, resolve);
  });
  const port = (srv.address() as { port: number }).port;
  return {
    address: `${bridgeHostIp}:${port}`,
    close: () =>
      new Promise<void>((resolve) => {
        for (const s of sockets) s.destroy();
        srv.close(() => resolve());
      }),
  };
}
