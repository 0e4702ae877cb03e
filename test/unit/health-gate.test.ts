// The health gate's timing (settle continuously, fail at the timeout naming the last failed check) on a
// fake monotonic clock, and its probes against a real local HTTP server and real commands.
import { afterAll, describe, expect, test } from "bun:test";
import { createServer } from "node:http";
import type { AddressInfo } from "node:net";
import { type GateVerdict, gateRun, runProbe } from "../../src/controllers/health-gate.ts";

/** A gate whose looks return the scripted verdicts, one per tick, with the clock advanced 1 s per tick. */
function scripted(verdicts: GateVerdict[], o = { settleMs: 3000, timeoutMs: 10_000 }) {
  let t = 0;
  let i = 0;
  const tick = gateRun({ ...o, clock: () => t, look: async () => verdicts[Math.min(i++, verdicts.length - 1)] as GateVerdict });
  return async () => {
    const results: string[] = [];
    for (;;) {
      const r = await tick();
      results.push(r.result === "failed" ? `failed: ${r.check}` : r.result);
      if (r.result !== "pending") return results;
      t += 1000;
    }
  };
}
const ok: GateVerdict = { healthy: true };
const bad = (check: string): GateVerdict => ({ healthy: false, check });

describe("the gate's timing", () => {
  test("healthy from the start: passes once healthy for the settle time", async () => {
    expect(await scripted([ok])()).toEqual(["pending", "pending", "pending", "passed"]);
  });

  test("a failure during settling starts the settle time over", async () => {
    expect(await scripted([ok, ok, bad("unit x: failed"), ok, ok, ok, ok])()).toEqual(["pending", "pending", "pending", "pending", "pending", "pending", "passed"]);
  });

  test("never healthy: fails at the timeout, naming the last failed check", async () => {
    const r = await scripted([bad("Node Ready: False"), bad("unit kubelet.service: restarting after a failure (auto-restart)")])();
    expect(r.at(-1)).toBe("failed: unit kubelet.service: restarting after a failure (auto-restart)");
    expect(r.length).toBe(11); // looks at 0 … 10 s
  });

  test("healthy at the deadline may finish settling; unhealthy after it fails at once", async () => {
    const lateButGood = [...Array(9).fill(bad("probe: HTTP 503")), ok];
    expect((await scripted(lateButGood)()).at(-1)).toBe("passed");
    const flapsLate = [...Array(9).fill(bad("probe: HTTP 503")), ok, ok, bad("probe: HTTP 500")];
    expect((await scripted(flapsLate)()).at(-1)).toBe("failed: probe: HTTP 500");
  });
});

describe("probes", () => {
  const server = createServer((req, res) => {
    if (req.url === "/slow") return; // never answers
    res.statusCode = req.url === "/ok" ? 200 : req.url === "/moved" ? 302 : 503;
    res.end();
  });
  const ready = new Promise<number>((resolve) => server.listen(0, "127.0.0.1", () => resolve((server.address() as AddressInfo).port)));
  afterAll(() => {
    server.closeAllConnections();
    server.close();
  });
  const url = async (path: string) => `http://127.0.0.1:${await ready}${path}`;

  test.each([
    ["/ok", undefined],
    ["/moved", undefined],
    ["/down", "HTTP 503"],
  ])("http %s", async (path, expected) => {
    expect(await runProbe({ kind: "http", url: await url(path) }, 2000)).toBe(expected);
  });
  test("http that never answers is cut at the time limit", async () => {
    expect(await runProbe({ kind: "http", url: await url("/slow") }, 200)).toBe("no answer within 200 ms");
  });
  test("http to a closed port says why", async () => {
    expect(await runProbe({ kind: "http", url: "http://127.0.0.1:1/" }, 2000)).toBeString();
  });
  test.each([
    [["/bin/true"], undefined],
    [["/bin/sh", "-c", "echo broken >&2; exit 3"], "exit code 3: broken"],
    [["/bin/sleep", "5"], "did not finish within 200 ms"],
  ])("exec %j", async (argv, expected) => {
    expect(await runProbe({ kind: "exec", argv }, 200)).toBe(expected);
  });
  test("exec of a missing command says so", async () => {
    expect(await runProbe({ kind: "exec", argv: ["/nonexistent/probe"] }, 1000)).toContain("ENOENT");
  });
});
