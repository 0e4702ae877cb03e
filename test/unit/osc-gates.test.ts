// The OSC controller's gating decisions (src/controllers/osc/gates.ts) and the clock the reconciliation
// delay is measured by across restarts and reboots (src/host/boot-clock.ts).
import { describe, expect, test } from "bun:test";
import { delayLeft, firstHold, gatesFor, giveUpSerialLease, holdAfterFailure, parseDelay, serialCoolOffLeft } from "../../src/controllers/osc/gates.ts";
import { serialIdentity } from "../../src/controllers/osc/serial.ts";
import { elapsedBetween } from "../../src/host/boot-clock.ts";

describe("gatesFor: which gates an OSC passes on this node", () => {
  const base = { checksum: "new", serial: false };
  test.each([
    ["trellis's state records another OSC: an update", { stateApplied: "old", nodeApplied: "old" }, { kind: "update", delay: true, serial: false, admit: true }],
    ["state lost, the Node shows another OSC applied: still an update", { stateApplied: undefined, nodeApplied: "old" }, { kind: "update", delay: true, serial: false, admit: true }],
    ["taken over from gardener-node-agent (its checksum on the Node, no trellis state)", { stateApplied: undefined, nodeApplied: "gna" }, { kind: "update", delay: true, serial: false, admit: true }],
    ["a fresh node: no delay, no admission", { stateApplied: undefined, nodeApplied: undefined }, { kind: "fresh", delay: false, serial: false, admit: false }],
    ["this OSC is applied: no delay; drift repair passes the admission", { stateApplied: "new", nodeApplied: "old" }, { kind: "current", delay: false, serial: false, admit: true }],
    ["state lost, the Node shows this OSC applied: no delay", { stateApplied: undefined, nodeApplied: "new" }, { kind: "current", delay: false, serial: false, admit: true }],
    ["the state decides over the Node (it may not be patched yet)", { stateApplied: "old", nodeApplied: "new" }, { kind: "update", delay: true, serial: false, admit: true }],
  ] as const)("%s", (_, applied, gates) => {
    expect(gatesFor({ ...base, ...applied })).toEqual(gates);
  });

  // gardener-node-agent (add.go, EnqueueWithJitterDelay): a serial Secret's update is queued at once, never
  // after the delay; its serial lease is taken while the Node does not carry the OSC's checksum, and kept
  // until the checksum is patched (reconciler.go releases it only then).
  test.each([
    ["an update: the serial lease and no reconciliation delay", { stateApplied: "old", nodeApplied: "old" }, { kind: "update", delay: false, serial: true, admit: true }],
    ["taken over from gardener-node-agent: the serial lease, no delay", { stateApplied: undefined, nodeApplied: "gna" }, { kind: "update", delay: false, serial: true, admit: true }],
    ["a fresh node takes its turn on the serial lease", { stateApplied: undefined, nodeApplied: undefined }, { kind: "fresh", delay: false, serial: true, admit: false }],
    ["applied, but the Node does not show it yet (its report waits): the lease stays with the node", { stateApplied: "new", nodeApplied: "old" }, { kind: "current", delay: false, serial: true, admit: true }],
    ["applied, kubelet has not registered the Node yet: the lease stays with the node", { stateApplied: "new", nodeApplied: undefined }, { kind: "current", delay: false, serial: true, admit: true }],
    ["applied and reported: no serial lease", { stateApplied: "new", nodeApplied: "new" }, { kind: "current", delay: false, serial: false, admit: true }],
    ["state lost, the Node shows this OSC applied: no serial lease", { stateApplied: undefined, nodeApplied: "new" }, { kind: "current", delay: false, serial: false, admit: true }],
  ] as const)("a serial Secret: %s", (_, applied, gates) => {
    expect(gatesFor({ checksum: "new", serial: true, ...applied })).toEqual(gates);
  });
});

test("the serial lease's holder is the host's name, lower-cased, as gardener-node-agent's (nodeagent.GetHostName)", () => {
  // Not the Node's name: a lease gardener-node-agent holds on this machine is then this node's own.
  expect(serialIdentity("Worker-Pool-A-7f9c.Example")).toBe("worker-pool-a-7f9c.example");
  expect(serialIdentity("node-a")).toBe("node-a");
});

describe("the reconciliation delay", () => {
  test("parseDelay: absent is none, a bad or negative value is none and says so", () => {
    expect(parseDelay(undefined)).toEqual({ ms: 0 });
    expect(parseDelay("1m30s")).toEqual({ ms: 90_000 });
    expect(parseDelay("soon")).toEqual({ ms: 0, unparsable: "soon" });
    expect(parseDelay("-5s")).toEqual({ ms: 0, unparsable: "-5s" });
  });
  test("delayLeft never goes below zero", () => {
    expect(delayLeft(60_000, 20_000)).toBe(40_000);
    expect(delayLeft(60_000, 90_000)).toBe(0);
  });
  const boot = "b1";
  const seen = { bootId: boot, uptimeMs: 1_000_000, wallMs: Date.parse("2026-11-25T12:00:00Z") };
  test("within a boot the time since boot counts: a wall-clock step changes nothing", () => {
    expect(elapsedBetween(seen, { bootId: boot, uptimeMs: 1_030_000, wallMs: seen.wallMs + 3_600_000 })).toBe(30_000);
    expect(elapsedBetween(seen, { bootId: boot, uptimeMs: 1_030_000, wallMs: seen.wallMs - 3_600_000 })).toBe(30_000);
  });
  test("across a reboot the wall clock spans the gap; one that went backwards counts as no time", () => {
    expect(elapsedBetween(seen, { bootId: "b2", uptimeMs: 5_000, wallMs: seen.wallMs + 120_000 })).toBe(120_000);
    expect(elapsedBetween(seen, { bootId: "b2", uptimeMs: 5_000, wallMs: seen.wallMs - 120_000 })).toBe(0);
  });
});

describe("the serial lease's hold limit", () => {
  const at = (uptimeMs: number, bootId = "b1", wallMs = 1_700_000_000_000 + uptimeMs) => ({ bootId, uptimeMs, wallMs });
  const hold = { checksum: "c", since: at(1000), failures: 3, lastError: "disk full" };
  test("a failing apply keeps the lease within the limit and gives it up at the limit", () => {
    expect(giveUpSerialLease(hold, at(1000 + 599_999), 600_000)).toBe(false);
    expect(giveUpSerialLease(hold, at(1000 + 600_000), 600_000)).toBe(true);
  });
  test("the hold's time runs across agent restarts (the time since boot) and across a reboot (the wall clock), never backwards", () => {
    // An agent that restarted keeps the hold it read back: only the reading of now is new.
    expect(giveUpSerialLease(hold, { ...at(1000 + 600_000), wallMs: 0 }, 600_000)).toBe(true);
    expect(giveUpSerialLease(hold, at(5_000, "b2", hold.since.wallMs + 600_000), 600_000)).toBe(true);
    expect(giveUpSerialLease(hold, at(5_000, "b2", hold.since.wallMs - 1), 600_000)).toBe(false);
  });
  test("another failure of the same OSC keeps the hold's start; another OSC starts a new hold", () => {
    expect(holdAfterFailure(hold, "c", at(900_000), "still full")).toEqual({ checksum: "c", since: at(1000), failures: 4, lastError: "still full" });
    expect(holdAfterFailure(hold, "d", at(900_000), "new")).toEqual({ checksum: "d", since: at(900_000), failures: 1, lastError: "new" });
    expect(holdAfterFailure(undefined, "c", at(7), "first")).toEqual({ checksum: "c", since: at(7), failures: 1, lastError: "first" });
  });
  test("after giving it up, the node waits a cool-off for that OSC only", () => {
    const gaveUp = { checksum: "c", at: at(10_000) };
    expect(serialCoolOffLeft(gaveUp, "c", at(15_000), 60_000)).toBe(55_000);
    expect(serialCoolOffLeft(gaveUp, "c", at(70_000), 60_000)).toBe(0);
    expect(serialCoolOffLeft(gaveUp, "other", at(15_000), 60_000)).toBe(0);
    expect(serialCoolOffLeft(undefined, "c", at(15_000), 60_000)).toBe(0);
  });
});

describe("firstHold: what an OSC waits for before asking the cluster for anything", () => {
  const update = gatesFor({ checksum: "new", stateApplied: "old", nodeApplied: undefined, serial: false });
  const serialUpdate = gatesFor({ checksum: "new", stateApplied: "old", nodeApplied: undefined, serial: true });
  const fresh = gatesFor({ checksum: "new", stateApplied: undefined, nodeApplied: undefined, serial: true });
  const current = gatesFor({ checksum: "new", stateApplied: "new", nodeApplied: "new", serial: true });
  test("an update waits out the delay; a serial one does not, it cools off after giving the serial lease up", () => {
    expect(firstHold(update, { delayLeftMs: 5000, coolOffLeftMs: 9000 })).toMatchObject({ ms: 5000, why: "reconciliation delay over" });
    expect(firstHold(update, { delayLeftMs: 0, coolOffLeftMs: 9000 })).toBeUndefined();
    expect(firstHold(serialUpdate, { delayLeftMs: 5000, coolOffLeftMs: 9000 })).toMatchObject({ ms: 9000, why: "serial lease cool-off over" });
    expect(firstHold(serialUpdate, { delayLeftMs: 5000, coolOffLeftMs: 0 })).toBeUndefined();
  });
  test("a fresh node is not delayed but cools off; the OSC already applied waits for nothing", () => {
    expect(firstHold(fresh, { delayLeftMs: 5000, coolOffLeftMs: 0 })).toBeUndefined();
    expect(firstHold(fresh, { delayLeftMs: 5000, coolOffLeftMs: 9000 })).toMatchObject({ ms: 9000 });
    expect(firstHold(current, { delayLeftMs: 5000, coolOffLeftMs: 9000 })).toBeUndefined();
  });
});
