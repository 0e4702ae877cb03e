// The OS update of an in-place update: what to do next (src/plan/os-update.ts), as gardener-node-agent
// v1.150 decides it, and how the OS extension's command is run and retried (src/controllers/os-update.ts).
import { afterAll, describe, expect, test } from "bun:test";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { machineBoot } from "../../src/host/boot-clock.ts";
import { osUpdateFailure, runOsUpdate } from "../../src/controllers/os-update.ts";
import { decideOsUpdate, type OsUpdateInput, rolledBack } from "../../src/plan/os-update.ts";

const boot1 = "b1/100";
const boot2 = "b1/900";
const input = (o: Partial<OsUpdateInput>): OsUpdateInput => ({ want: "13", have: "12", attempt: undefined, boot: boot1, node: {}, ...o });

describe("what the OS update does next", () => {
  test("done once os-release names the version (13 = 13.0), whatever was recorded", () => {
    expect(decideOsUpdate(input({ have: "13.0" }))).toEqual({ next: "done" });
    expect(decideOsUpdate(input({ have: "13", attempt: { version: "13", boot: boot1, finished: false, failed: "x" }, node: { updating: "13", failedReason: "x" } }))).toEqual({ next: "done" });
  });

  test("nothing recorded and the Node not marked: run the command", () => {
    expect(decideOsUpdate(input({}))).toEqual({ next: "run" });
    // An attempt at another version, or the Node marked for another one: this version was never tried.
    expect(decideOsUpdate(input({ attempt: { version: "14", boot: boot1, finished: true }, node: { updating: "14", failedReason: "no" } }))).toEqual({ next: "run" });
  });

  test("the command ran to its end in this boot: wait for the machine to restart", () => {
    expect(decideOsUpdate(input({ attempt: { version: "13", boot: boot1, finished: true } }))).toMatchObject({ next: "wait" });
  });

  test("the machine restarted and runs the old version: rolled back, failed for good (gardener-node-agent's words), whether or not the command had returned", () => {
    for (const finished of [true, false]) {
      expect(decideOsUpdate(input({ boot: boot2, attempt: { version: "13", boot: boot1, finished } }))).toEqual({ next: "fail", why: rolledBack("13", "12"), told: false });
    }
    expect(rolledBack("13", "12")).toBe('OS update might have failed and rolled back to the previous version. Desired version: "13", Current version: "12"');
  });

  test("the agent stopped while the command ran, the machine did not restart: run it again", () => {
    expect(decideOsUpdate(input({ attempt: { version: "13", boot: boot1, finished: false } }))).toMatchObject({ next: "run", again: expect.stringContaining("agent stopped") });
  });

  test("a failed attempt is not run again for the same version; told once the Node carries its reason", () => {
    const attempt = { version: "13", boot: boot1, finished: false, failed: "the command failed" };
    expect(decideOsUpdate(input({ attempt }))).toEqual({ next: "fail", why: "the command failed", told: false });
    expect(decideOsUpdate(input({ attempt, boot: boot2, node: { updating: "13", failedReason: "the command failed" } }))).toEqual({ next: "fail", why: "the command failed", told: true });
  });

  test("no record of trellis's, the Node marked for this version (gardener-node-agent's attempt, or state lost): its reason, or rolled back", () => {
    expect(decideOsUpdate(input({ node: { updating: "13", failedReason: "OS update has failed" } }))).toEqual({ next: "fail", why: "OS update has failed", told: true });
    expect(decideOsUpdate(input({ node: { updating: "13.0" } }))).toEqual({ next: "fail", why: rolledBack("13", "12"), told: false });
  });
});

describe("running the OS extension's command", () => {
  const dir = mkdtempSync(`${tmpdir()}/trellis-os-update-`);
  afterAll(() => rmSync(dir, { recursive: true, force: true }));
  const fast = { intervalMs: 20, timeoutMs: 2_000, retriable: /network problems/i };
  const running = { retry: fast, machineStopping: async () => false };
  /** A command that fails `failures` times with `output`, then succeeds; counts its runs in a file. */
  function flaky(name: string, failures: number, output: string): { path: string; runs: () => number } {
    const count = `${dir}/${name}.runs`;
    writeFileSync(count, "");
    const path = `${dir}/${name}.sh`;
    writeFileSync(path, `#!/bin/sh\necho run >> ${count}\n[ "$(wc -l < ${count})" -gt ${failures} ] && exit 0\necho "${output}" >&2\nexit 1\n`, { mode: 0o755 });
    return { path, runs: () => readFileSync(count, "utf8").split("\n").filter(Boolean).length };
  }

  test("network problems are retried until the command succeeds", async () => {
    const cmd = flaky("network", 2, "error: Network Problems reaching the image registry");
    expect(await runOsUpdate(cmd.path, [], new AbortController().signal, running)).toEqual({ ok: true });
    expect(cmd.runs()).toBe(3);
  });

  // The reason machine-controller-manager shows is gardener-node-agent's text, byte for byte (the differential test compares it too).
  test("any other failure ends it at once, worded as gardener-node-agent words it: the kind of error, Go's exit text, the output as it was", async () => {
    const cmd = flaky("invalid", 5, "invalid arguments: --to 13");
    expect(await runOsUpdate(cmd.path, ["--to", "13"], new AbortController().signal, running)).toEqual({ failed: "failed to execute OS update command: non-retriable error detected: exit status 1, output: invalid arguments: --to 13\n" });
    expect(cmd.runs()).toBe(1);
    const other = flaky("other", 5, "disk full");
    expect(await runOsUpdate(other.path, [], new AbortController().signal, running)).toEqual({ failed: "failed to execute OS update command: no specific error detected: exit status 1, output: disk full\n" });
  });

  test("network problems past the retries' time fail it, as gardener-node-agent's retry words its timeout", async () => {
    const cmd = flaky("timeout", 1000, "network problems");
    const r = await runOsUpdate(cmd.path, [], new AbortController().signal, { ...running, retry: { ...fast, timeoutMs: 100 } });
    expect(r).toEqual({ failed: "failed to execute OS update command: retry failed with context deadline exceeded, last error: retriable error detected: exit status 1, output: network problems\n" });
    expect(cmd.runs()).toBeGreaterThan(1);
  });

  test("a command that is missing or killed is named as Go's os/exec names it", async () => {
    expect(await runOsUpdate(`${dir}/missing`, [], new AbortController().signal, running)).toEqual({ failed: `failed to execute OS update command: no specific error detected: fork/exec ${dir}/missing: no such file or directory, output: ` });
    expect(await runOsUpdate("/bin/sh", ["-c", "kill -KILL $$"], new AbortController().signal, running)).toEqual({ failed: "failed to execute OS update command: no specific error detected: signal: killed, output: " });
  });

  test("only the output's last 2,000 characters are kept (the Node's annotations are bounded)", () => {
    expect(osUpdateFailure("exit status 1", `${"x".repeat(5000)}end`, false)).toBe(`failed to execute OS update command: no specific error detected: exit status 1, output: ${"x".repeat(1997)}end`);
  });

  // The reboot the command starts ends it (and the agent) with a SIGTERM to the agent's unit, and the
  // agent may see the command's exit before its own stop: that is no failure, nor run again.
  test("a command ended while the machine shuts down did not fail: stopped, whatever its exit, and not run again", async () => {
    const cmd = flaky("shutdown", 5, "network problems");
    let asked = 0;
    const shuttingDown = async () => (asked++, true);
    expect(await runOsUpdate(cmd.path, [], new AbortController().signal, { retry: fast, machineStopping: shuttingDown })).toEqual({ stopped: "the machine is shutting down while the OS update command ran" });
    expect({ runs: cmd.runs(), asked }).toEqual({ runs: 1, asked: 1 });
    const killed = await runOsUpdate("/bin/sh", ["-c", "kill -TERM $$"], new AbortController().signal, { retry: fast, machineStopping: shuttingDown });
    expect(killed).toEqual({ stopped: "the machine is shutting down while the OS update command ran" });
  });

  test("a command that succeeds does not ask whether the machine shuts down", async () => {
    const cmd = flaky("succeeds", 0, "");
    expect(await runOsUpdate(cmd.path, [], new AbortController().signal, { retry: fast, machineStopping: () => Promise.reject(new Error("not asked")) })).toEqual({ ok: true });
  });

  test("the agent stopping ends the command and says so: not a failure (the command may be restarting the machine)", async () => {
    const stop = new AbortController();
    const started = performance.now();
    const run = runOsUpdate("/bin/sleep", ["30"], stop.signal, running);
    setTimeout(() => stop.abort(new Error("the agent is stopping")), 50);
    expect(await run).toEqual({ stopped: "the agent stopped while the OS update command ran" });
    expect(performance.now() - started).toBeLessThan(5_000);
  });
});

test("this boot of the machine: the kernel's boot id and when PID 1 started, the same on every reading", () => {
  const boot = machineBoot();
  expect(boot).toMatch(/^[0-9a-f-]{36}\/\d+$/);
  expect(machineBoot()).toBe(boot);
});
