// src/controllers/hostname.ts with an injected hostname: a changed name restarts the agent once, an
// unchanged one never, a failing lookup is logged and checked again, and stop() ends the checks.
import { expect, test } from "bun:test";
import { startHostnameCheck } from "../../src/controllers/hostname.ts";
import { createLogger } from "../../src/log.ts";
import { waitFor } from "../harness/exec.ts";

function setUp(names: () => string) {
  const lines: Record<string, unknown>[] = [];
  let restarts = 0;
  const check = startHostnameCheck({
    hostname: names,
    restartSelf: () => void restarts++,
    log: createLogger({ write: (l) => lines.push(JSON.parse(l)) }),
    intervalMs: 10,
  });
  return { check, lines, restarts: () => restarts };
}

test("a changed hostname restarts the agent, once, and says from what to what", async () => {
  let name = "node-a";
  const { check, lines, restarts } = setUp(() => name);
  await Bun.sleep(50);
  expect(restarts()).toBe(0);
  name = "node-b";
  await waitFor("the restart", () => restarts() === 1, 5_000, 5);
  name = "node-c";
  await Bun.sleep(50);
  expect(restarts()).toBe(1);
  expect(lines).toContainEqual(expect.objectContaining({ msg: "the hostname changed; restarting the agent to pick it up", from: "node-a", to: "node-b", controller: "hostname" }));
  await check.stop();
});

test("an unchanged hostname never restarts; a lookup that throws is logged and the check goes on", async () => {
  let calls = 0;
  const { check, lines, restarts } = setUp(() => {
    calls++;
    if (calls === 3) throw new Error("uname failed");
    return "node-a";
  });
  await waitFor("five checks", () => calls > 4, 5_000, 5);
  expect(restarts()).toBe(0);
  expect(lines).toContainEqual(expect.objectContaining({ level: "warn", msg: "could not read the hostname", error: "uname failed" }));
  await check.stop();
});

test("stop() ends the checks", async () => {
  let name = "node-a";
  const { check, restarts } = setUp(() => name);
  await check.stop();
  name = "node-b";
  await Bun.sleep(50);
  expect(restarts()).toBe(0);
});
