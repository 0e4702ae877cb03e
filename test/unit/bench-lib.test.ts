// The benchmarks' own measuring tools: the CPU profile reader, the statistics, the byte-counting relay.
import { describe, expect, test } from "bun:test";
import { createConnection, createServer } from "node:net";
import { startByteProxy } from "../harness/byte-proxy.ts";
import { type CpuProfile, profileWindow } from "../bench/lib/cpuprofile.ts";
import { oscYaml } from "../bench/lib/bench-osc.ts";
import { percentile, summary } from "../bench/lib/stats.ts";
import { initClockTicks } from "../bench/lib/proc.ts";
import { ThreadTracker, threadRole } from "../bench/lib/threads.ts";

describe("profileWindow", () => {
  // root → main → parse (leaf), root → main (self), root → (idle); one sample per ms.
  const frame = (functionName: string) => ({ functionName, url: "/$bunfs/root/trellis", lineNumber: 9 });
  const profile: CpuProfile = {
    nodes: [
      { id: 1, callFrame: frame("(root)"), children: [2, 4] },
      { id: 2, callFrame: frame("main"), children: [3] },
      { id: 3, callFrame: frame("parse") },
      { id: 4, callFrame: frame("(idle)") },
    ],
    startTime: 0,
    endTime: 10_000,
    samples: [3, 3, 3, 2, 4, 4, 3, 2, 4, 4],
    timeDeltas: [1000, 1000, 1000, 1000, 1000, 1000, 1000, 1000, 1000, 1000],
  };

  test("splits busy from idle and attributes self and inclusive time", () => {
    const w = profileWindow(profile, 0, 100, 1);
    expect(w.idleMs).toBe(3); // the last sample has no successor: it stands for no time
    expect(w.busyMs).toBe(6);
    expect(w.self.map((f) => [f.fn, f.ms])).toEqual([["parse trellis:10", 4], ["main trellis:10", 2]]);
    expect(w.inclusive[0]).toEqual({ fn: "main trellis:10", ms: 6, percent: 100 });
  });

  test("a gap without samples is waiting, not the previous function's time", () => {
    const gappy = { ...profile, samples: [3, 2], timeDeltas: [1000, 50_000] };
    const w = profileWindow(gappy, 0, 100, 1);
    expect(w.busyMs).toBe(1);
    expect(w.self[0]).toEqual({ fn: "parse trellis:10", ms: 1, percent: 100 });
  });

  test("keeps only the samples of the window", () => {
    const w = profileWindow(profile, 3.5, 7.5, 1); // the samples at 4, 5, 6 and 7 ms: main, idle, idle, parse
    expect(w.sampledMs).toBe(4);
    expect(w.self.map((f) => f.fn)).toEqual(["main trellis:10", "parse trellis:10"]);
  });
});

test("summary and nearest-rank percentiles", () => {
  const xs = Array.from({ length: 30 }, (_, i) => i + 1);
  expect(percentile(xs, 99)).toBe(30);
  expect(percentile(xs, 50)).toBe(15);
  expect(summary([3, 1, 2, 10])).toEqual({ n: 4, median: 2.5, p99: 10, min: 1, max: 10 });
});

test("the benchmark OSC is deterministic and a change touches one file", () => {
  expect(oscYaml(0)).toBe(oscYaml(0));
  const diff = (a: string, b: string) => a.split("\n").filter((l, i) => l !== b.split("\n")[i]).length;
  expect(diff(oscYaml(0), oscYaml(1))).toBe(1);
  expect(oscYaml(0, { units: 2, filesPerUnit: 3 }).match(/- path:/g)?.length).toBe(6);
});

test("the byte-counting relay passes bytes through both ways and counts them", async () => {
  const echo = createServer((s) => s.on("data", (b: Buffer) => s.write(Buffer.concat([b, b]))));
  await new Promise<void>((r) => echo.listen(0, "127.0.0.1", r));
  const port = (echo.address() as { port: number }).port;
  const proxy = await startByteProxy(`https://127.0.0.1:${port}`);
  try {
    const reply = await new Promise<string>((resolve, reject) => {
      const url = new URL(proxy.server);
      const c = createConnection({ host: url.hostname, port: Number(url.port) });
      c.on("error", reject);
      c.on("data", (b: Buffer) => {
        resolve(b.toString());
        c.end();
      });
      c.write("hello");
    });
    expect(reply).toBe("hellohello");
    expect(proxy.counts()).toMatchObject({ sent: 5, received: 10, connections: 1 });
  } finally {
    await proxy.close();
    echo.close();
  }
});

test("the thread tracker splits a process's CPU by thread role, and what it cannot attribute is the rest", async () => {
  expect(threadRole("Bun Pool 3")).toBe("Bun Pool");
  expect(threadRole("JITWorker")).toBe("JITWorker");
  await initClockTicks();
  const tracker = new ThreadTracker("", process.pid);
  tracker.start();
  const until = performance.now() + 300;
  let x = 0;
  while (performance.now() < until) x += Math.sqrt(x + 1); // the main thread's own CPU
  const cpu = tracker.finish();
  expect(x).toBeGreaterThan(0);
  expect(cpu.seconds).toBeGreaterThanOrEqual(0.2);
  const main = Object.entries(cpu.byThread).sort((a, b) => b[1] - a[1])[0];
  expect(main?.[1]).toBeGreaterThanOrEqual(0.2);
  const attributed = Object.values(cpu.byThread).reduce((a, b) => a + b, 0);
  expect(attributed + cpu.unattributed).toBeCloseTo(cpu.seconds, 1);
  expect(Object.values(cpu.threadsAtEnd).reduce((a, b) => a + b, 0)).toBeGreaterThanOrEqual(1);
});
