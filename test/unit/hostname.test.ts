// src/controllers/hostname.ts with an injected hostname: a changed name restarts the agent once, an
// unchanged one (or one whose case alone changed, as gardener-node-agent lower-cases it) never, a failing
// lookup is logged and checked again, and stop() ends the checks.
import { expect, test } from "bun:test";
import { agentHostName, startHostnameCheck } from "../../src/controllers/hostname.ts";
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

test("the agent's hostname is the host's lower-cased (gardener-node-agent's GetHostName), as kubelet labels its Node", () => {
  expect(agentHostName("Node-A.Example")).toBe("node-a.example");
  expect(agentHostName("node-a")).toBe("node-a");
});

test("a change of case alone is no change; a change of name is said lower-cased", async () => {
  let name = "Node-A";
  let checks = 0;
  const { check, lines, restarts } = setUp(() => {
    checks++;
    return name;
  });
  name = "NODE-a";
  const after = checks;
  await waitFor("five checks of the new spelling", () => checks > after + 4, 5_000, 5);
  expect(restarts()).toBe(0);
  name = "Node-B";
  await waitFor("the restart", () => restarts() === 1, 5_000, 5);
  expect(lines).toContainEqual(expect.objectContaining({ msg: "the hostname changed; restarting the agent to pick it up", from: "node-a", to: "node-b" }));
  await check.stop();
});
