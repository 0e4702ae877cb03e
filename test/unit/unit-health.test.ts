// The rules of the SystemdUnitsReady condition (src/controllers/unit-health.ts), one row per case.
import { describe, expect, test } from "bun:test";
import type { OwnedUnit } from "../../src/api/state.ts";
import { assessUnit, conditionOf, unitCheckRetryMs, type UnitVerdict } from "../../src/controllers/unit-health.ts";
import type { UnitStatus } from "../../src/host/systemd.ts";

const nowMs = Date.parse("2026-08-01T12:00:00Z");
const sinceBootMs = 86_400_000;
const stuckMs = 5 * 60_000;
/** A state change `ms` ago, on both of systemd's clocks. */
const changed = (ms: number) => ({ stateChangeTimestamp: new Date(nowMs - ms), stateChangeSinceBootMs: sinceBootMs - ms });
const running: UnitStatus = {
  name: "x.service",
  loadState: "loaded",
  activeState: "active",
  subState: "running",
  mainPID: 42,
  unitFileState: "enabled",
  triggeredBy: [],
  serviceType: "simple",
  remainAfterExit: false,
  result: "success",
  ...changed(3_600_000),
};
const enabled: OwnedUnit = { enable: true, command: "start", dropIns: {} };
const dead: Partial<UnitStatus> = { activeState: "inactive", subState: "dead", mainPID: 0 };

const cases: [string, OwnedUnit, Partial<UnitStatus>, Omit<UnitVerdict, "unit">][] = [
  ["running and enabled", enabled, {}, { health: "healthy" }],
  ["failed, with the service's result", enabled, { activeState: "failed", subState: "failed", result: "exit-code" }, { health: "unhealthy", why: "failed (exit-code)" }],
  ["failed, and the OSC disables it (gardener-node-agent reports only enabled units that failed)", { ...enabled, enable: false }, { activeState: "failed", subState: "failed", result: "signal" }, { health: "healthy" }],
  ["failed, and the OSC stops it but leaves it enabled", { ...enabled, command: "stop" }, { activeState: "failed", subState: "failed", result: "signal" }, { health: "unhealthy", why: "failed (signal)" }],
  ["failed, enablement not recorded yet (a failed apply wrote it): expected to run", { dropIns: {} }, { activeState: "failed", subState: "failed", result: "exit-code" }, { health: "unhealthy", why: "failed (exit-code)" }],
  ["no unit file", enabled, { loadState: "not-found", ...dead }, { health: "unhealthy", why: "not loaded (not-found)" }],
  ["a unit file systemd rejected", enabled, { loadState: "bad-setting", ...dead }, { health: "unhealthy", why: "not loaded (bad-setting)" }],
  ["masked", enabled, { loadState: "masked", ...dead }, { health: "unhealthy", why: "not loaded (masked)" }],
  ["masked, and the OSC keeps it off", { ...enabled, enable: false }, { loadState: "masked", ...dead }, { health: "healthy" }],
  ["bad setting, and the OSC keeps it off", { ...enabled, enable: false }, { loadState: "bad-setting", ...dead }, { health: "unhealthy", why: "not loaded (bad-setting)" }],
  ["activating within the threshold", enabled, { activeState: "activating", subState: "start", ...changed(stuckMs - 1000) }, { health: "progressing", why: "activating (start) since 2026-08-01T11:55:01Z" }],
  ["activating for the threshold", enabled, { activeState: "activating", subState: "start-pre", ...changed(stuckMs) }, { health: "unhealthy", why: "stuck activating (start-pre) since 2026-08-01T11:55:00Z, longer than 5m" }],
  ["deactivating too long", enabled, { activeState: "deactivating", subState: "stop-sigterm", ...changed(stuckMs + 60_000) }, { health: "unhealthy", why: "stuck deactivating (stop-sigterm) since 2026-08-01T11:54:00Z, longer than 5m" }],
  ["the wall clock stepped back an hour: still progressing by the time since boot", enabled, { activeState: "activating", subState: "start", stateChangeTimestamp: new Date(nowMs + 3_600_000), stateChangeSinceBootMs: sinceBootMs - 1000 }, { health: "progressing", why: "activating (start) since 2026-08-01T13:00:00Z" }],
  ["the wall clock stepped forward an hour: not stuck by the time since boot", enabled, { activeState: "activating", subState: "start", stateChangeTimestamp: new Date(nowMs - 3_600_000), stateChangeSinceBootMs: sinceBootMs - 1000 }, { health: "progressing", why: "activating (start) since 2026-08-01T11:00:00Z" }],
  ["waiting to be restarted by Restart=", enabled, { activeState: "activating", subState: "auto-restart", ...changed(stuckMs * 2) }, { health: "healthy" }],
  ["enabled but inactive", enabled, dead, { health: "unhealthy", why: "inactive but enabled" }],
  ["a oneshot that has run", enabled, { ...dead, serviceType: "oneshot" }, { health: "healthy" }],
  ["a oneshot with RemainAfterExit that is inactive", enabled, { ...dead, serviceType: "oneshot", remainAfterExit: true }, { health: "unhealthy", why: "inactive but enabled" }],
  ["a unit a timer starts, between runs", enabled, { ...dead, triggeredBy: ["x.timer"] }, { health: "healthy" }],
  ["a timer waiting", enabled, { activeState: "active", subState: "waiting", serviceType: undefined, remainAfterExit: undefined, result: undefined }, { health: "healthy" }],
  ["enable: false but active", { ...enabled, enable: false }, {}, { health: "unhealthy", why: "active but the OSC says enable: false" }],
  ["command: stop but active", { ...enabled, command: "stop" }, {}, { health: "unhealthy", why: "active but the OSC says command: stop" }],
  ["enable: false and inactive", { ...enabled, enable: false }, dead, { health: "healthy" }],
  ["enablement not recorded yet (a failed apply wrote it): expected to run", { dropIns: {} }, dead, { health: "unhealthy", why: "inactive but enabled" }],
];

test("a failed unit check is retried within 5 s however long it kept failing (readiness back soon after an outage)", () => {
  expect(unitCheckRetryMs(1, 60_000, 1)).toBe(1_000);
  expect(unitCheckRetryMs(1, 60_000, 0)).toBe(500);
  for (const failures of [4, 10, 300]) expect(unitCheckRetryMs(failures, 60_000, 1)).toBe(5_000);
  expect(unitCheckRetryMs(300, 2_000, 1)).toBe(2_000); // never later than the syncPeriod itself
});

describe("assessUnit", () => {
  test.each(cases)("%s", (_, want, status, verdict) => {
    expect(assessUnit("x.service", want, { ...running, ...status }, stuckMs, sinceBootMs)).toEqual({ unit: "x.service", ...verdict });
  });
});

describe("conditionOf (gardener-node-agent's reasons)", () => {
  const v = (unit: string, health: UnitVerdict["health"], why?: string): UnitVerdict => ({ unit, health, ...(why ? { why } : {}) });
  test("unhealthy units win and are all named", () => {
    expect(conditionOf([v("a.service", "unhealthy", "failed"), v("b.service", "progressing", "activating (start)"), v("c.service", "unhealthy", "inactive but enabled")])).toEqual({
      type: "SystemdUnitsReady",
      status: "False",
      reason: "UnhealthyUnits",
      message: "a.service: failed; c.service: inactive but enabled",
    });
  });
  test("progressing units keep the condition True", () => {
    expect(conditionOf([v("a.service", "healthy"), v("b.service", "progressing", "activating (start)")])).toEqual({
      type: "SystemdUnitsReady",
      status: "True",
      reason: "ProgressingUnits",
      message: "b.service: activating (start)",
    });
  });
  test("all healthy, or nothing to check", () => {
    const healthy = { type: "SystemdUnitsReady", status: "True", reason: "AllUnitsHealthy", message: "All systemd units from the operating system config are running as expected." } as const;
    expect(conditionOf([v("a.service", "healthy")])).toEqual(healthy);
    expect(conditionOf([])).toEqual(healthy);
  });
});
