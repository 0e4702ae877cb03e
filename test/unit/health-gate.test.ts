// The health gate's probes against a real local HTTP server and real commands (the gate's timing is the
// rollout state machine's: test/unit/rollout-machine.test.ts).
import { afterAll, describe, expect, test } from "bun:test";
import { createServer } from "node:http";
import type { AddressInfo } from "node:net";
import { runProbe } from "../../src/controllers/health-gate.ts";

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
