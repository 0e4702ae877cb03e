// src/status.ts (the status board and its file) and the report of `trellis status` (src/cli/status.ts)
// over a temporary root: debounced atomic writes, the heartbeat, the final snapshot, credentials kept
// out of the file, readiness, and what the report says about a running, stopped, hung or unset agent.
import { describe, expect, test } from "bun:test";
import { mkdtempSync, readFileSync, statSync } from "node:fs";
import { statusPath, type StatusFile } from "../../src/api/status-file.ts";
import type { AgentState } from "../../src/api/state.ts";
import { statePath } from "../../src/apply/state-store.ts";
import { collectStatus, renderStatus } from "../../src/cli/status.ts";
import { createFiles, type FileContent, type Files } from "../../src/host/files.ts";
import { createLogger } from "../../src/log.ts";
import { createStatusBoard, readiness } from "../../src/status.ts";
import { runDir, waitFor } from "../harness/exec.ts";

const base = runDir("status-unit");
const log = createLogger({ write: () => {} });
const checksum = "6cb17c5988d9".padEnd(64, "0");

/** A fresh root, and a Files over it that records when the status file is written. */
function fresh(): { root: string; files: Files; writes: () => number; lastWritten: () => StatusFile | undefined; writeTimes: number[] } {
  const root = mkdtempSync(`${base}/root-`);
  const files = createFiles(root);
  // When each write of the status file started (its spacing), and what each finished write held. A reader
  // of the file sees a write's content before the write's promise settles, so a test that waits for some
  // content and then counts writes must wait for it here, in the finished writes, not on disk.
  const writeTimes: number[] = [];
  const written: FileContent[] = [];
  return {
    root,
    files: {
      ...files,
      root: files.root,
      writeAtomic: async (path, content, mode) => {
        if (path === statusPath) writeTimes.push(performance.now());
        await files.writeAtomic(path, content, mode);
        if (path === statusPath) written.push(content);
      },
    },
    writes: () => written.length,
    lastWritten: () => {
      const last = written.at(-1);
      return typeof last === "string" ? (JSON.parse(last) as StatusFile) : undefined;
    },
    writeTimes,
  };
}

const readStatus = (root: string): StatusFile => JSON.parse(readFileSync(root + statusPath, "utf8"));

describe("the status board", () => {
  test("writes the components to /run/trellis/status.json (0644), at most once per interval however often they report", async () => {
    const { root, files, writes, lastWritten, writeTimes } = fresh();
    const board = createStatusBoard({ files, log, minIntervalMs: 300, heartbeatMs: 60_000 });
    try {
      await waitFor("the first write", () => writes() === 1, 5_000, 5); // right after the start: the agent is up, nothing reported yet
      expect(readStatus(root)).toMatchObject({ version: 1, pid: process.pid, heartbeatSeconds: 60, components: {} });
      for (let i = 0; i < 50; i++) {
        board.set("osc", { ok: i % 2 === 0, summary: `round ${i}` });
        await Bun.sleep(5);
      }
      board.set("lease", { ok: true, summary: "renewed", lastRenew: "2026-01-01T00:00:00.000Z", failures: 0 });
      expect(board.snapshot().osc).toMatchObject({ ok: false, summary: "round 49" });
      // 51 reports, a few writes, each at least the interval after the one before; the last state is on disk.
      await waitFor("the last state written", () => lastWritten()?.components.lease?.summary === "renewed", 5_000, 10);
      expect(writes()).toBeGreaterThanOrEqual(2);
      expect(writes()).toBeLessThan(10);
      for (let i = 1; i < writeTimes.length; i++) expect((writeTimes[i] as number) - (writeTimes[i - 1] as number)).toBeGreaterThan(295);
      const file = readStatus(root);
      expect(file.components.osc).toMatchObject({ ok: false, summary: "round 49" });
      expect(file.components.lease).toMatchObject({ ok: true, summary: "renewed", lastRenew: "2026-01-01T00:00:00.000Z", failures: 0 });
      expect(Date.parse(file.components.osc?.at ?? "")).toBeGreaterThan(Date.now() - 5_000);
      expect(statSync(root + statusPath).mode & 0o7777).toBe(0o644);
    } finally {
      await board.close();
    }
  });

  // Found by test/chaos/scenarios/clock-jump.ts: the spacing of writes was measured on the wall clock, so
  // after the clock went back an hour the next write was scheduled an hour later and every report and
  // heartbeat in between was dropped (`trellis status` showed the agent as stale).
  test("a wall clock set back an hour does not hold the writes back", async () => {
    const { root, files, writes } = fresh();
    let wall = Date.parse("2026-03-01T13:00:00.000Z");
    const board = createStatusBoard({ files, log, minIntervalMs: 10, heartbeatMs: 60_000, now: () => wall });
    try {
      await waitFor("the first write", () => writes() === 1, 2_000, 5);
      wall -= 3_600_000;
      board.set("lease", { ok: true, summary: "renewed after the jump" });
      await waitFor("a write after the jump", () => writes() === 2, 2_000, 5);
      expect(readStatus(root).components.lease).toMatchObject({ summary: "renewed after the jump", at: "2026-03-01T12:00:00.000Z" });
    } finally {
      await board.close();
    }
  });

  test("a heartbeat rewrites the file while nothing changes; close() writes a last snapshot marked stopped, then nothing", async () => {
    const { root, files, writes } = fresh();
    const board = createStatusBoard({ files, log, minIntervalMs: 10, heartbeatMs: 100 });
    await waitFor("the first write", () => writes() >= 1, 5_000, 5);
    const first = readStatus(root).writtenAt;
    await waitFor("two heartbeats", () => writes() >= 3, 5_000, 10);
    expect(Date.parse(readStatus(root).writtenAt)).toBeGreaterThan(Date.parse(first));
    board.set("osc", { ok: true, summary: "applied" });
    await board.close();
    const last = readStatus(root);
    expect(last.stoppedAt).toBeString();
    expect(last.components.osc?.summary).toBe("applied");
    const count = writes();
    board.set("osc", { ok: false, summary: "after close" });
    await Bun.sleep(250);
    expect(writes()).toBe(count);
  });

  test("nothing that looks like a credential reaches the file; errors become their messages", async () => {
    const { root, files } = fresh();
    const board = createStatusBoard({ files, log, minIntervalMs: 10 });
    const jwt = "eyJhbGciOiJSUzI1NiIsImtpZCI6IiJ9.eyJzdWIiOiJzeXN0ZW06c2VydmljZWFjY291bnQifQ.c2lnbmF0dXJl";
    const key = "-----BEGIN EC PRIVATE KEY-----\nMHcCAQEEIBkg\n-----END EC PRIVATE KEY-----";
    board.set("token", {
      ok: false,
      summary: `sync failed: Authorization: Bearer ${jwt}`,
      lastError: `wrote ${jwt} to /var/lib/x`,
      nested: { list: ["bootstrap abcdef.0123456789abcdef used", key], n: 3n, when: new Date(0) },
      error: new Error("outer", { cause: new Error("inner") }),
      harmless: [checksum, "/var/lib/gardener-node-agent/credentials/token", "node-a.eu-west-1.compute.internal", "v1.35.4"],
    });
    await board.close();
    const text = readFileSync(root + statusPath, "utf8");
    for (const secret of [jwt, "abcdef.0123456789abcdef", "MHcCAQEEIBkg", "eyJ"]) expect(text).not.toContain(secret);
    const token = readStatus(root).components.token;
    expect(token).toMatchObject({
      summary: "sync failed: Authorization: [redacted]",
      lastError: "wrote [redacted] to /var/lib/x",
      nested: { list: ["bootstrap [redacted] used", "[redacted]"], n: "3", when: "1970-01-01T00:00:00.000Z" },
      error: "outer: inner",
    });
    // Checksums, paths, host names and versions are not mistaken for credentials.
    expect(token?.harmless).toEqual([checksum, "/var/lib/gardener-node-agent/credentials/token", "node-a.eu-west-1.compute.internal", "v1.35.4"]);
  });

  test("a write that fails is logged once per failing streak, and the board goes on", async () => {
    const lines: string[] = [];
    const { files } = fresh();
    let fail = true;
    const flaky: Files = { ...files, root: files.root, writeAtomic: (p, c, m) => (fail ? Promise.reject(new Error("read-only file system (EROFS)")) : files.writeAtomic(p, c, m)) };
    const board = createStatusBoard({ files: flaky, log: createLogger({ write: (l) => lines.push(l) }), minIntervalMs: 10, heartbeatMs: 30 });
    await Bun.sleep(150);
    fail = false;
    await Bun.sleep(100);
    await board.close();
    const messages = lines.map((l) => JSON.parse(l).msg);
    expect(messages.filter((m) => m.startsWith("could not write the status file"))).toHaveLength(1);
    expect(messages).toContain("writing the status file works again");
  });

  test("readiness: ready while every component is ok, else one reason per component that is not", async () => {
    const { files } = fresh();
    const board = createStatusBoard({ files, log });
    try {
      expect(readiness(board)).toEqual({ ok: true, reasons: [] });
      board.set("osc", { ok: true, summary: "applied" });
      board.set("lease", { ok: false, summary: "renewing failed: forbidden (403)" });
      board.set("units", { ok: false, summary: "kubelet.service failed" });
      expect(readiness(board)).toEqual({ ok: false, reasons: ["lease: renewing failed: forbidden (403)", "units: kubelet.service failed"] });
      board.set("lease", { ok: true, summary: "renewed" });
      expect(readiness(board).reasons).toEqual(["units: kubelet.service failed"]);
    } finally {
      await board.close();
    }
  });
});

describe("the report of `trellis status`", () => {
  const now = Date.parse("2026-03-01T12:00:00.000Z");
  const iso = (msAgo: number) => new Date(now - msAgo).toISOString();

  async function setUp(opts: { state?: AgentState | string; status?: Partial<StatusFile> | string }) {
    const { files } = fresh();
    if (opts.state !== undefined) await files.writeAtomic(statePath, typeof opts.state === "string" ? opts.state : JSON.stringify(opts.state), 0o600);
    if (opts.status !== undefined) {
      const status: StatusFile = { version: 1, pid: 4242, startedAt: iso(3_600_000), writtenAt: iso(4_000), heartbeatSeconds: 30, components: {}, ...(typeof opts.status === "string" ? {} : opts.status) };
      await files.writeAtomic(statusPath, typeof opts.status === "string" ? opts.status : JSON.stringify(status), 0o644);
    }
    return (alive: (pid: number) => boolean = (pid) => pid === 4242) => collectStatus({ files, now: () => now, alive });
  }
  const applied: AgentState = { version: 1, owned: { version: 1, files: {}, units: {} }, lastApplied: { checksum, at: iso(300_000) } };
  const components = {
    osc: { ok: true, summary: "OSC 6cb17c5988d9 applied", at: iso(10_000) },
    lease: { ok: true, summary: "renewed", at: iso(4_000), lastRenew: iso(4_000), failures: 0 },
  };

  test("all well: the applied OSC and when, nothing unfinished, each component, the agent running; ok", async () => {
    const report = await (await setUp({ state: applied, status: { components } }))();
    expect(report).toMatchObject({ ok: true, problems: [], agent: { running: true, pid: 4242 }, osc: { checksum, appliedAt: iso(300_000) } });
    expect(renderStatus(report, now)).toBe(
      [
        "agent:  running (pid 4242, up 1 h 0 m, status written 4 s ago)",
        "OSC:    6cb17c5988d9 applied 5 m 0 s ago (2026-03-01T11:55:00.000Z)",
        "apply:  nothing unfinished",
        "",
        "components:",
        "  ok    lease  renewed (4 s ago)",
        "               lease renewed 4 s ago (2026-03-01T11:59:56.000Z)",
        "  ok    osc    OSC 6cb17c5988d9 applied (10 s ago)",
        "",
        "all ok",
      ].join("\n"),
    );
  });

  test("an unfinished apply, a failing component with its units and error, and other details shown as they are", async () => {
    const state: AgentState = {
      ...applied,
      progress: { checksum: "f580e02bbdcf".padEnd(64, "1"), plan: { checksum: "f580e02bbdcf".padEnd(64, "1"), steps: [{ kind: "daemon-reload", reason: "x" }, { kind: "restart", unit: "web.service", reason: "y" }] }, done: [0] },
    };
    const units = {
      ok: false,
      summary: "2 unit(s) unhealthy",
      at: iso(20_000),
      units: [{ unit: "kubelet.service", health: "unhealthy", why: "failed" }, { unit: "web.service", health: "progressing" }],
      lastError: "kubelet.service: exited 1",
      checked: 5,
      condition: { status: "False", reason: "UnhealthyUnits" },
    };
    const report = await (await setUp({ state, status: { components: { ...components, units } } }))();
    expect(report.ok).toBe(false);
    expect(report.problems).toEqual([
      "the apply of OSC f580e02bbdcf is unfinished (1 of 2 steps done); the agent resumes it when it runs",
      "units: 2 unit(s) unhealthy",
    ]);
    const text = renderStatus(report, now);
    expect(text).toContain("apply:  unfinished: OSC f580e02bbdcf, 1 of 2 steps done\n");
    expect(text).toContain(
      [
        "  FAIL  units  2 unit(s) unhealthy (20 s ago)",
        "               units not healthy: kubelet.service (unhealthy: failed), web.service (progressing)",
        "               last error: kubelet.service: exited 1",
        "               checked: 5",
        "               condition: status=False, reason=UnhealthyUnits",
        "",
      ].join("\n"),
    );
    // An ok component shows its details in words only (the lease's age), not the rest (failures: 0).
    expect(text).not.toContain("failures");
    expect(text).toEndWith("2 problem(s):\n  - the apply of OSC f580e02bbdcf is unfinished (1 of 2 steps done); the agent resumes it when it runs\n  - units: 2 unit(s) unhealthy");
  });

  test("details of unexpected types are shown as they are, never make the file unreadable", async () => {
    const odd = { ok: false, summary: "odd", at: iso(1_000), lastError: null, lastRenew: 5, units: "kubelet", extra: { a: [1, "b"] } };
    const report = await (await setUp({ state: applied, status: { components: { odd } } }))();
    expect(report.problems).toEqual(["odd: odd"]);
    expect(renderStatus(report, now)).toContain(["  FAIL  odd  odd (1 s ago)", "             lastRenew: 5", "             units: kubelet", '             extra: a=[1,"b"]', ""].join("\n"));
    const unrenewed = await (await setUp({ state: applied, status: { components: { lease: { ok: false, summary: "no Node", at: iso(1_000), lastRenew: null } } } }))();
    expect(renderStatus(unrenewed, now)).toContain("  FAIL  lease  no Node (1 s ago)\n               lease not renewed yet\n");
  });

  test.each([
    ["no status file since boot", undefined, undefined, "agent: not running: it has not written /run/trellis/status.json since boot"],
    ["a clean stop", { stoppedAt: iso(90_000) }, undefined, "agent: stopped 1 m 30 s ago (2026-03-01T11:58:30.000Z)"],
    ["its process gone", {}, () => false, "agent: not running (pid 4242 is gone)"],
    ["a status too old (hung)", { writtenAt: iso(70_000) }, undefined, "agent: not answering: its status is 1 m 10 s old (rewritten every 30 s)"],
    ["a broken status file", "{", undefined, "agent: unknown: /run/trellis/status.json: not valid JSON"],
    ["a status file of another shape", '{"version":2}', undefined, "agent: unknown: /run/trellis/status.json: version: Invalid type"],
  ] as const)("the agent is not running: %s", async (_, status, alive, problem) => {
    const report = await (await setUp({ state: applied, ...(status !== undefined ? { status } : {}) }))(alive);
    expect(report.ok).toBe(false);
    expect(report.agent.running).toBe(false);
    expect(report.problems).toHaveLength(1);
    expect(report.problems[0]).toStartWith(problem);
    expect(renderStatus(report, now)).toStartWith(`agent:  ${problem.slice("agent: ".length)}`);
  });

  test("a node where nothing was applied yet, and an unreadable state, are problems too", async () => {
    const none = await (await setUp({ status: { components } }))();
    expect(none.problems).toEqual(["no OSC has been applied on this node yet"]);
    expect(renderStatus(none, now)).toContain("OSC:    none applied yet\n");
    const broken = await (await setUp({ state: "{not json", status: { components } }))();
    expect(broken.problems).toHaveLength(1);
    expect(broken.problems[0]).toStartWith(`cannot read the agent's state: ${statePath}: not valid JSON`);
    expect(renderStatus(broken, now)).toContain("OSC:    unknown (the state cannot be read)\napply:  unknown\n");
  });
});
