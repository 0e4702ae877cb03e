// src/server.ts in process, over loopback: the health probes, readiness with its reasons, /metrics as
// strictly valid Prometheus text (checked by the parser below, not by eye), the process metrics, the
// default bind address, and a clean start-up failure when a port is taken.
import { afterEach, describe, expect, test } from "bun:test";
import { readFileSync } from "node:fs";
import { createServer } from "node:net";
import { createLogger } from "../../src/log.ts";
import { createRegistry, type Registry } from "../../src/metrics.ts";
import { metricsContentType, type Readiness, type Servers, startServers } from "../../src/server.ts";

const log = createLogger({ write: () => {} });
let running: Servers | undefined;
afterEach(async () => {
  await running?.stop();
  running = undefined;
});

async function start(opts: { ready?: () => Readiness; registry?: Registry; healthAddress?: string } = {}) {
  const registry = opts.registry ?? createRegistry();
  running = await startServers({
    health: { bindAddress: opts.healthAddress ?? "", port: 0 },
    metrics: { bindAddress: "", port: 0 },
    registry,
    ready: opts.ready ?? (() => ({ ok: true, reasons: [] })),
    log,
  });
  const { health, metrics } = running.ports;
  const host = opts.healthAddress || "127.0.0.1";
  return { registry, health: `http://${host}:${health}`, metrics: `http://127.0.0.1:${metrics}` };
}

describe("health probes", () => {
  test("/healthz answers ok; /readyz follows ready(): 503 with one reason per line", async () => {
    let readiness: Readiness = { ok: true, reasons: [] };
    const { health } = await start({ ready: () => readiness });
    const healthz = await fetch(`${health}/healthz`);
    expect([healthz.status, await healthz.text()]).toEqual([200, "ok\n"]);
    expect(healthz.headers.get("content-type")).toBe("text/plain; charset=utf-8");
    const ready = await fetch(`${health}/readyz`);
    expect([ready.status, await ready.text()]).toEqual([200, "ok\n"]);

    readiness = { ok: false, reasons: ["osc: the OSC Secret has not been seen yet", "lease: renewing failed: forbidden (403)"] };
    const unready = await fetch(`${health}/readyz`);
    expect(unready.status).toBe(503);
    expect(await unready.text()).toBe("osc: the OSC Secret has not been seen yet\nlease: renewing failed: forbidden (403)\n");
    // Liveness does not depend on readiness.
    expect((await fetch(`${health}/healthz`)).status).toBe(200);
  });

  test("a readiness check that throws is 503 with its error; other paths 404, other methods 405, HEAD has no body", async () => {
    const { health } = await start({
      ready: () => {
        throw new Error("board unavailable");
      },
    });
    const r = await fetch(`${health}/readyz`);
    expect([r.status, await r.text()]).toEqual([503, "the readiness check failed: board unavailable\n"]);
    expect((await fetch(`${health}/metrics`)).status).toBe(404);
    expect((await fetch(`${health}/healthz/x`)).status).toBe(404);
    const post = await fetch(`${health}/healthz`, { method: "POST" });
    expect([post.status, post.headers.get("allow")]).toEqual([405, "GET, HEAD"]);
    const head = await fetch(`${health}/healthz`, { method: "HEAD" });
    expect([head.status, await head.text()]).toEqual([200, ""]);
    expect((await fetch(`${health}/healthz?verbose=1`)).status).toBe(200);
  });

  test("bound to 127.0.0.1 by default, to the configured address otherwise", async () => {
    await start();
    const listening = listeners();
    expect(listening.get(running?.ports.health as number)).toBe("127.0.0.1");
    expect(listening.get(running?.ports.metrics as number)).toBe("127.0.0.1");
    await running?.stop();
    // Any 127/8 address is loopback on Linux: a distinct one proves the option is used.
    const { health } = await start({ healthAddress: "127.0.0.2" });
    expect(listeners().get(running?.ports.health as number)).toBe("127.0.0.2");
    expect((await fetch(`${health}/healthz`)).status).toBe(200);
  });
});

describe("metrics", () => {
  test("/metrics is valid Prometheus text 0.0.4 with the registry's metrics and the process metrics", async () => {
    const registry = createRegistry();
    const applies = registry.counter("trellis_osc_applies_total", "OSC applies by result.");
    const units = registry.gauge("trellis_unhealthy_units", "Units that are not healthy.");
    const duration = registry.histogram("trellis_apply_duration_seconds", "How long an apply took.", [0.1, 1, 10]);
    applies.inc({ result: "applied" });
    applies.inc({ result: "failed" }, 2);
    units.set(0);
    units.set(3, { unit: 'odd"name\\with\nnewline' });
    for (const v of [0.05, 0.5, 0.5, 5, 50]) duration.observe(v, { checksum: "abc" });
    duration.observe(0.2, { checksum: "def" });
    const { metrics } = await start({ registry });

    const r = await fetch(`${metrics}/metrics`);
    expect(r.status).toBe(200);
    expect(r.headers.get("content-type")).toBe(metricsContentType);
    const families = parsePrometheus(await r.text());

    expect(families.get("trellis_osc_applies_total")?.type).toBe("counter");
    expect(sample(families, "trellis_osc_applies_total", { result: "failed" })).toBe(2);
    expect(sample(families, "trellis_unhealthy_units", { unit: 'odd"name\\with\nnewline' })).toBe(3);
    expect(sample(families, "trellis_apply_duration_seconds_bucket", { checksum: "abc", le: "1" })).toBe(3);
    expect(sample(families, "trellis_apply_duration_seconds_count", { checksum: "abc" })).toBe(5);
    expect(sample(families, "trellis_apply_duration_seconds_sum", { checksum: "abc" })).toBeCloseTo(56.05);

    expect(families.get("process_cpu_seconds_total")?.type).toBe("counter");
    expect(families.get("process_resident_memory_bytes")?.type).toBe("gauge");
    const rss = sample(families, "process_resident_memory_bytes", {});
    expect(rss).toBeGreaterThan(10 * 2 ** 20);
    expect(rss).toBeLessThan(4 * 2 ** 30);
    const startTime = sample(families, "process_start_time_seconds", {});
    expect(Math.abs(startTime - (Date.now() / 1000 - process.uptime()))).toBeLessThan(2);
    const cpu = sample(families, "process_cpu_seconds_total", {});
    expect(cpu).toBeGreaterThan(0);

    // The CPU counter follows the process' total and never goes down.
    const deadline = Date.now() + 50;
    while (Date.now() < deadline); // burn some CPU
    const again = parsePrometheus(await (await fetch(`${metrics}/metrics`)).text());
    const cpu2 = sample(again, "process_cpu_seconds_total", {});
    expect(cpu2).toBeGreaterThan(cpu);
    const { user, system } = process.cpuUsage();
    expect(cpu2).toBeLessThanOrEqual((user + system) / 1e6);
  });

  test("only /metrics is served on the metrics port", async () => {
    const { metrics } = await start();
    expect((await fetch(`${metrics}/healthz`)).status).toBe(404);
    expect((await fetch(`${metrics}/metrics`, { method: "PUT" })).status).toBe(405);
  });
});

test("a taken port fails start-up with the address in the error, and the other server is closed again", async () => {
  const blocker = createServer();
  await new Promise<void>((resolve) => blocker.listen(0, "127.0.0.1", resolve));
  const taken = (blocker.address() as { port: number }).port;
  const healthPort = await new Promise<number>((resolve) => {
    const probe = createServer().listen(0, "127.0.0.1", () => {
      const port = (probe.address() as { port: number }).port;
      probe.close(() => resolve(port));
    });
  });
  try {
    const err = await startServers({
      health: { bindAddress: "", port: healthPort },
      metrics: { bindAddress: "", port: taken },
      registry: createRegistry(),
      ready: () => ({ ok: true, reasons: [] }),
      log,
    }).then(
      () => undefined,
      (e: unknown) => e,
    );
    expect(err).toBeInstanceOf(Error);
    expect((err as Error).message).toStartWith(`metrics server: cannot listen on 127.0.0.1:${taken}: `);
    expect((err as Error).message).toContain("EADDRINUSE");
    expect(listeners().has(healthPort)).toBe(false);
  } finally {
    blocker.close();
  }
});

test("stop() closes both servers promptly even with a keep-alive connection open", async () => {
  const { health, metrics } = await start();
  await fetch(`${health}/healthz`, { keepalive: true });
  await fetch(`${metrics}/metrics`, { keepalive: true });
  const t = performance.now();
  await running?.stop();
  running = undefined;
  expect(performance.now() - t).toBeLessThan(1000);
  expect(await fetch(`${health}/healthz`).then(() => "answered", () => "refused")).toBe("refused");
});

/** Listening IPv4 TCP sockets of this machine: port → local address (from /proc/net/tcp). */
function listeners(): Map<number, string> {
  const out = new Map<number, string>();
  for (const line of readFileSync("/proc/net/tcp", "utf8").split("\n").slice(1)) {
    const [, local, , state] = line.trim().split(/\s+/);
    if (!local || state !== "0A") continue; // 0A: LISTEN
    const [hexAddr = "", hexPort = ""] = local.split(":");
    const bytes = (hexAddr.match(/../g) ?? []).map((b) => Number.parseInt(b, 16)).reverse(); // little endian
    out.set(Number.parseInt(hexPort, 16), bytes.join("."));
  }
  return out;
}

// ---------------------------------------------------------------- a strict Prometheus text parser

type Family = { name: string; help: string; type: string; samples: { name: string; labels: Record<string, string>; value: number }[] };

const metricName = /^[a-zA-Z_:][a-zA-Z0-9_:]*$/;
const labelPair = /^([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\\n]|\\\\|\\"|\\n)*)"(,|$)/;

/**
 * Parses the text format 0.0.4 and throws on anything Prometheus would reject or that is sloppy: every
 * line a comment or a `name{labels} value` sample, HELP then TYPE once per family and before its
 * samples, a family's samples together, histogram buckets ascending in `le`, cumulative, ending in
 * +Inf equal to _count, with _sum and _count present. Ends with exactly one newline.
 */
function parsePrometheus(text: string): Map<string, Family> {
  if (!text.endsWith("\n") || text.endsWith("\n\n")) throw new Error("the exposition must end with exactly one newline");
  const families = new Map<string, Family>();
  let current: Family | undefined;
  const lines = text.slice(0, -1).split("\n");
  for (const [i, line] of lines.entries()) {
    const where = `line ${i + 1} (${JSON.stringify(line)})`;
    if (line.startsWith("#")) {
      const m = /^# (HELP|TYPE) (\S+) (.*)$/.exec(line);
      if (!m) throw new Error(`${where}: a comment that is neither HELP nor TYPE`);
      const [, kind, name = "", rest = ""] = m;
      if (!metricName.test(name)) throw new Error(`${where}: bad metric name`);
      if (kind === "HELP") {
        if (families.has(name)) throw new Error(`${where}: second HELP for ${name}`);
        current = { name, help: rest, type: "", samples: [] };
        families.set(name, current);
      } else {
        if (current?.name !== name || current.type !== "") throw new Error(`${where}: TYPE must follow the HELP of its family, once`);
        if (!["counter", "gauge", "histogram", "summary", "untyped"].includes(rest)) throw new Error(`${where}: unknown type`);
        current.type = rest;
      }
      continue;
    }
    if (!current || current.type === "") throw new Error(`${where}: a sample before its family's HELP and TYPE`);
    const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})? (\S+)$/.exec(line);
    if (!m) throw new Error(`${where}: not a sample line`);
    const [, name = "", labelText, valueText = ""] = m;
    const allowed = current.type === "histogram" ? ["_bucket", "_sum", "_count"].map((s) => current?.name + s) : [current.name];
    if (!allowed.includes(name)) throw new Error(`${where}: sample ${name} outside its family (${current.name})`);
    const value = parseValue(valueText, where);
    if (current.type === "counter" && !(value >= 0)) throw new Error(`${where}: a counter must not be negative`);
    current.samples.push({ name, labels: parseLabels(labelText, where), value });
  }
  for (const f of families.values()) {
    if (f.type === "") throw new Error(`${f.name}: HELP without TYPE`);
    if (f.type === "histogram") checkHistogram(f);
  }
  return families;
}

function parseValue(text: string, where: string): number {
  if (text === "+Inf") return Infinity;
  if (text === "-Inf") return -Infinity;
  if (text === "NaN") return Number.NaN;
  if (!/^[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$/.test(text)) throw new Error(`${where}: bad value ${text}`);
  return Number(text);
}

function parseLabels(text: string | undefined, where: string): Record<string, string> {
  const labels: Record<string, string> = {};
  if (text === undefined) return labels;
  let rest = text.slice(1, -1);
  if (rest === "") throw new Error(`${where}: empty braces`);
  while (rest !== "") {
    const m = labelPair.exec(rest);
    if (!m) throw new Error(`${where}: bad label syntax at ${JSON.stringify(rest)}`);
    const [all, key = "", raw = ""] = m;
    if (key in labels) throw new Error(`${where}: label ${key} twice`);
    labels[key] = raw.replace(/\\(\\|"|n)/g, (_, c: string) => (c === "n" ? "\n" : c));
    rest = rest.slice(all.length);
  }
  return labels;
}

function checkHistogram(f: Family): void {
  const series = new Map<string, { buckets: [number, number][]; sum?: number; count?: number }>();
  for (const s of f.samples) {
    const { le, ...rest } = s.labels;
    const key = JSON.stringify(Object.entries(rest).sort());
    const entry = series.get(key) ?? { buckets: [] };
    series.set(key, entry);
    if (s.name.endsWith("_bucket")) {
      if (le === undefined) throw new Error(`${f.name}: a bucket without le`);
      entry.buckets.push([le === "+Inf" ? Infinity : Number(le), s.value]);
    } else if (s.name.endsWith("_sum")) entry.sum = s.value;
    else entry.count = s.value;
  }
  for (const [key, s] of series) {
    const what = `${f.name}${key}`;
    if (s.sum === undefined || s.count === undefined) throw new Error(`${what}: _sum or _count missing`);
    if (s.buckets.at(-1)?.[0] !== Infinity) throw new Error(`${what}: the last bucket must be +Inf`);
    for (let i = 1; i < s.buckets.length; i++) {
      const [le0, n0] = s.buckets[i - 1] as [number, number];
      const [le1, n1] = s.buckets[i] as [number, number];
      if (!(le1 > le0)) throw new Error(`${what}: buckets not in ascending le order`);
      if (n1 < n0) throw new Error(`${what}: buckets not cumulative`);
    }
    if (s.buckets.at(-1)?.[1] !== s.count) throw new Error(`${what}: the +Inf bucket differs from _count`);
  }
}

function sample(families: Map<string, Family>, name: string, labels: Record<string, string>): number {
  const family = [...families.values()].find((f) => f.samples.some((s) => s.name === name));
  const found = family?.samples.find((s) => s.name === name && JSON.stringify(Object.entries(s.labels).sort()) === JSON.stringify(Object.entries(labels).sort()));
  if (!found) throw new Error(`no sample ${name}${JSON.stringify(labels)}`);
  return found.value;
}

describe("the parser itself rejects what Prometheus would", () => {
  test.each([
    ["a sample before HELP/TYPE", "x 1\n"],
    ["TYPE before HELP", "# TYPE x gauge\n# HELP x h\nx 1\n"],
    ["a bad value", "# HELP x h\n# TYPE x gauge\nx one\n"],
    ["unquoted label", "# HELP x h\n# TYPE x gauge\nx{a=b} 1\n"],
    ["a foreign sample in a family", "# HELP x h\n# TYPE x gauge\ny 1\n"],
    ["non-cumulative buckets", '# HELP h h\n# TYPE h histogram\nh_bucket{le="1"} 2\nh_bucket{le="+Inf"} 1\nh_sum 1\nh_count 1\n'],
    ["+Inf bucket missing", '# HELP h h\n# TYPE h histogram\nh_bucket{le="1"} 1\nh_sum 1\nh_count 1\n'],
    ["no final newline", "# HELP x h\n# TYPE x gauge\nx 1"],
  ])("%s", (_, text) => {
    expect(() => parsePrometheus(text)).toThrow();
  });
});
