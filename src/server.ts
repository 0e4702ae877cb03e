// The agent's two HTTP servers, on the ports of gardener-node-agent's configuration: health probes
// (/healthz, /readyz) and Prometheus metrics (/metrics). They bind 127.0.0.1 unless the configuration
// names an address: Gardener's default is every interface, but nothing here is meant for the network
// unless an operator says so. node:http, so the module runs under Deno too.
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { describeError, type Logger } from "./log.ts";
import type { Registry } from "./metrics.ts";

export type Listen = { bindAddress: string; port: number };
export type Readiness = { ok: boolean; reasons: string[] };

export type ServersOptions = {
  health: Listen;
  metrics: Listen;
  registry: Registry;
  /** Asked on every /readyz: 503 with the reasons while it is not ok. */
  ready: () => Readiness;
  log: Logger;
};

export type Servers = {
  /** The ports actually bound (port 0 in the options picks a free one). */
  ports: { health: number; metrics: number };
  /** Closes both servers, open keep-alive connections included. */
  stop(): Promise<void>;
};

export const defaultBindAddress = "127.0.0.1";
export const metricsContentType = "text/plain; version=0.0.4; charset=utf-8";

type Handler = (path: string) => { status: number; body: string; contentType?: string };

export async function startServers(opts: ServersOptions): Promise<Servers> {
  const log = opts.log.with({ component: "server" });
  registerProcessMetrics(opts.registry);

  const health = await listen("health probes", opts.health, log, (path) => {
    // Answering at all is the proof of life: a blocked event loop answers nothing, and the probe times out.
    if (path === "/healthz") return { status: 200, body: "ok\n" };
    if (path !== "/readyz") return notFound;
    const r = readiness(opts.ready);
    return r.ok ? { status: 200, body: "ok\n" } : { status: 503, body: `${(r.reasons.length ? r.reasons : ["not ready"]).join("\n")}\n` };
  });
  let metrics: Server;
  try {
    metrics = await listen("metrics", opts.metrics, log, (path) => {
      if (path !== "/metrics") return notFound;
      return { status: 200, body: opts.registry.render(), contentType: metricsContentType };
    });
  } catch (err) {
    await close(health);
    throw err;
  }
  return {
    ports: { health: portOf(health), metrics: portOf(metrics) },
    stop: async () => {
      await Promise.all([close(health), close(metrics)]);
    },
  };
}

const notFound = { status: 404, body: "not found\n" };

function readiness(ready: () => Readiness): Readiness {
  try {
    return ready();
  } catch (err) {
    return { ok: false, reasons: [`the readiness check failed: ${describeError(err)}`] };
  }
}

function listen(name: string, at: Listen, log: Logger, handle: Handler): Promise<Server> {
  const host = at.bindAddress || defaultBindAddress;
  const server = createServer((req, res) => respond(req, res, handle, log));
  return new Promise((resolve, reject) => {
    const failed = (err: Error) => {
      // Bun's message does not name the errno ("Failed to start server. Is port 2751 in use?"): add it.
      const code = (err as { code?: unknown }).code;
      const reason = typeof code === "string" && !err.message.includes(code) ? `${err.message} (${code})` : err.message;
      reject(new Error(`${name} server: cannot listen on ${hostPort(host, at.port)}: ${reason}`, { cause: err }));
    };
    server.once("error", failed);
    server.listen(at.port, host, () => {
      server.off("error", failed);
      server.on("error", (err) => log.error(`${name} server failed`, { error: err }));
      log.info(`serving ${name}`, { address: `http://${hostPort(host, portOf(server))}` });
      resolve(server);
    });
  });
}

function respond(req: IncomingMessage, res: ServerResponse, handle: Handler, log: Logger): void {
  let out: ReturnType<Handler>;
  if (req.method !== "GET" && req.method !== "HEAD") {
    out = { status: 405, body: "only GET and HEAD\n" };
    res.setHeader("Allow", "GET, HEAD");
  } else {
    try {
      out = handle(new URL(req.url ?? "/", "http://localhost").pathname);
    } catch (err) {
      log.error("answering a request failed", { path: req.url, error: err });
      out = { status: 500, body: `${describeError(err)}\n` };
    }
  }
  res.writeHead(out.status, { "Content-Type": out.contentType ?? "text/plain; charset=utf-8", "Cache-Control": "no-store" });
  res.end(req.method === "HEAD" ? undefined : out.body);
}

// What Prometheus' Go client reports for every process, under the same names, so existing dashboards work.
function registerProcessMetrics(registry: Registry): void {
  const startSeconds = Date.now() / 1000 - process.uptime();
  registry.collect("process_resident_memory_bytes", "Resident memory size in bytes.", () => process.memoryUsage().rss);
  // Where the resident memory goes (the JavaScript heap, and buffers outside it), under prom-client's names.
  registry.collect("nodejs_heap_size_used_bytes", "JavaScript heap in use, in bytes.", () => process.memoryUsage().heapUsed);
  registry.collect("nodejs_heap_size_total_bytes", "JavaScript heap reserved, in bytes.", () => process.memoryUsage().heapTotal);
  registry.collect("nodejs_external_memory_bytes", "Memory of objects outside the JavaScript heap (buffers), in bytes.", () => process.memoryUsage().external);
  registry.collect("process_start_time_seconds", "Start time of the process since unix epoch in seconds.", () => startSeconds);
  registry.collect(
    "process_cpu_seconds_total",
    "Total user and system CPU time spent in seconds.",
    () => {
      const { user, system } = process.cpuUsage();
      return (user + system) / 1e6;
    },
    "counter",
  );
}

function close(server: Server): Promise<void> {
  return new Promise((resolve, reject) => {
    server.close((err) => (err ? reject(err) : resolve()));
    server.closeAllConnections(); // a scraper's keep-alive connection would hold close() open
  });
}

function portOf(server: Server): number {
  return (server.address() as AddressInfo).port;
}

const hostPort = (host: string, port: number) => (host.includes(":") ? `[${host}]:${port}` : `${host}:${port}`);
