// The Node condition SystemdUnitsReady, as gardener-node-agent's systemd unit check reports it:
// every systemdUnitCheck.syncPeriod, each unit trellis manages is asked how it is, and the condition
// says False/UnhealthyUnits naming every unhealthy unit and why, True/ProgressingUnits while some are
// still (de)activating within stuckThreshold, True/AllUnitsHealthy otherwise. A failed unit counts only
// when the OSC enables it, as with gardener-node-agent.
//
// The units are those of the state file's inventory: after a complete apply, every unit of the
// applied OSC (host units it only configures included); after a failed one, also those it wrote
// (gardener#10972). The condition is patched only when status, reason or message change, and the
// messages carry timestamps rather than running durations, so a steady node costs no API request.
import type { NodeAgentConfiguration } from "../api/agent-config.ts";
import { formatDuration } from "../api/duration.ts";
import type { OwnedUnit } from "../api/state.ts";
import { compareText } from "../api/text-order.ts";
import type { StateStore } from "../apply/state-store.ts";
import type { Systemd, UnitState, UnitStatus } from "../host/systemd.ts";
import { sinceBootMs } from "../host/boot-clock.ts";
import type { Kube } from "../kube/client.ts";
import { metaTime, type NodeCondition, patchNodeConditionIfChanged } from "../kube/node.ts";
import { describeError, type Logger } from "../log.ts";
import type { Controller, NodeSource, StatusBoard } from "./types.ts";
import { every, type FirstAfter } from "../loops.ts";
import { backoffDelay } from "../time.ts";

export const unitsConditionType = "SystemdUnitsReady";
const allHealthyMessage = "All systemd units from the operating system config are running as expected.";

export type UnitHealthControllerDeps = {
  systemd: Systemd;
  kube: Kube;
  nodes: NodeSource;
  store: StateStore;
  status: StatusBoard;
  log: Logger;
  config: NodeAgentConfiguration["controllers"]["systemdUnitCheck"];
  sinceBoot?: () => number;
  /** The first check waits for this (the agent's start: the OSC's first reconcile goes first). */
  firstAfter?: FirstAfter;
};

export type UnitVerdict = { unit: string; health: "healthy" | "progressing" | "unhealthy"; why?: string };

export function startUnitHealthController(deps: UnitHealthControllerDeps): Controller {
  const log = deps.log.with({ controller: "units" });
  const sinceBoot = deps.sinceBoot ?? sinceBootMs;
  let lastLogged: string | undefined;

  async function check(): Promise<void> {
    const state = await deps.store.read();
    const units = Object.entries(state.owned.units).sort(([a], [b]) => compareText(a, b));
    if (units.length === 0 && !state.lastApplied) {
      deps.status.set("units", { ok: true, summary: "no OSC applied yet: no units to check" });
      return;
    }
    const statuses = await statusesForAssessment(deps.systemd, units.map(([name]) => name));
    const verdicts = units.map(([name, want]) => assessUnit(name, want, statuses.get(name) as AssessableStatus, deps.config.stuckThreshold, sinceBoot()));
    const condition = conditionOf(verdicts);
    const text = `${condition.status}/${condition.reason}: ${condition.message}`;
    if (text !== lastLogged) log[condition.status === "True" ? "info" : "warn"]("systemd units", { condition: text });
    lastLogged = text;

    const node = deps.nodes.current();
    const board = {
      units: verdicts.filter((v) => v.health !== "healthy"),
      checked: verdicts.length,
      condition: { status: condition.status, reason: condition.reason },
    };
    const summary = `${verdicts.length} unit(s): ${condition.reason === "AllUnitsHealthy" ? "all healthy" : condition.message}`;
    if (!node) {
      deps.status.set("units", { ok: true, summary: `${summary} (the Node is not registered yet: no condition)`, ...board });
      return;
    }
    await patchNodeConditionIfChanged(deps.kube, node, condition);
    deps.status.set("units", { ok: true, summary, ...board });
  }

  let failures = 0;
  const loop = every(deps.config.syncPeriod, () =>
    check().then(
      () => {
        failures = 0;
      },
      (err: unknown) => {
        const error = describeError(err);
        log.error("could not check the systemd units", { error });
        deps.status.set("units", { ok: false, summary: `cannot check the systemd units: ${error}` });
        return unitCheckRetryMs(++failures, deps.config.syncPeriod, Math.random());
      },
    ),
    { firstAfter: deps.firstAfter },
  );
  // The condition goes up as soon as the Node is there, not a syncPeriod later.
  void deps.nodes.found.then(() => loop.wake());

  return { stop: () => loop.stop() };
}

/**
 * When a failed unit check is tried again: soon (0.5-1 s, doubling) and never more than 5 s apart however
 * long the failure lasted (one D-Bus read and one patch), so readiness is back within seconds of the API
 * server or D-Bus; found by the 5-minute apiserver-down chaos run, where a backoff growing to the
 * syncPeriod left /readyz at 503 for up to a minute after the API server was back.
 */
export function unitCheckRetryMs(failures: number, syncPeriodMs: number, random: number): number {
  return backoffDelay(failures, { initialMs: 1000, maxMs: Math.min(5_000, syncPeriodMs) }, random);
}

/** How one managed unit is doing, from what the OSC wants of it and what systemd says. Pure. */
/** `sinceBootMs`: now, in ms since boot, the clock systemd's monotonic timestamps use (a wall-clock step does not make a unit look stuck). */
/** What assessUnit needs of a unit: its brief state, and for any but a loaded active unit its full status. */
export type AssessableStatus = UnitState & Partial<Omit<UnitStatus, keyof UnitState>>;

/**
 * Each unit's status as assessUnit needs it, in one ListUnitsByNames for all: a loaded, active unit is
 * judged by its brief state alone; any other is read in full (its result, timestamps and triggers
 * matter). A steady node's check is then one D-Bus call and a small read per unit, not three calls and
 * two full property sets per unit, whose parsing led the idle agent's JavaScript profile.
 */
export async function statusesForAssessment(systemd: Systemd, units: readonly string[]): Promise<Map<string, AssessableStatus>> {
  const brief = await systemd.unitStates(units);
  const statuses = new Map<string, AssessableStatus>();
  for (const unit of units) {
    const b = brief.get(unit);
    statuses.set(unit, b && b.loadState === "loaded" && b.activeState === "active" ? b : await systemd.unitStatus(unit));
  }
  return statuses;
}

export function assessUnit(unit: string, want: OwnedUnit, s: AssessableStatus, stuckThresholdMs: number, sinceBootMs: number): UnitVerdict {
  const healthy: UnitVerdict = { unit, health: "healthy" };
  const unhealthy = (why: string): UnitVerdict => ({ unit, health: "unhealthy", why });
  const shouldRun = want.enable !== false && want.command !== "stop";
  const stoppedBy = want.enable === false ? "enable: false" : "command: stop";

  if (s.loadState !== "loaded") {
    // A unit the OSC keeps off may as well be absent; a unit file systemd rejected is always a problem.
    if (!shouldRun && (s.loadState === "not-found" || s.loadState === "masked")) return healthy;
    return unhealthy(`not loaded (${s.loadState})`);
  }
  switch (s.activeState) {
    case "failed":
      // As gardener-node-agent: only a unit the OSC enables is unhealthy when it failed (`command: stop`
      // alone does not disable it); one it disables may have failed when it was stopped.
      if (want.enable === false) return healthy;
      return unhealthy(s.result && s.result !== "success" ? `failed (${s.result})` : "failed");
    case "activating":
    case "deactivating":
    case "reloading": {
      // Restart= cycles a service through "activating (auto-restart)" between runs: systemd is on it.
      if (s.subState === "auto-restart") return healthy;
      const since = s.stateChangeTimestamp;
      const state = `${s.activeState} (${s.subState})${since ? ` since ${metaTime(since)}` : ""}`;
      const changedAt = s.stateChangeSinceBootMs;
      if (changedAt !== undefined && sinceBootMs - changedAt >= stuckThresholdMs) return unhealthy(`stuck ${state}, longer than ${formatDuration(stuckThresholdMs)}`);
      return { unit, health: "progressing", why: state };
    }
    case "active":
      return shouldRun ? healthy : unhealthy(`active but the OSC says ${stoppedBy}`);
    case "inactive":
      if (!shouldRun) return healthy;
      // Enabled units that rightly sit inactive: a oneshot without RemainAfterExit once it has run,
      // and a unit a timer, path or socket starts, between activations.
      if (s.serviceType === "oneshot" && !s.remainAfterExit) return healthy;
      if ((s.triggeredBy?.length ?? 0) > 0) return healthy;
      return unhealthy("inactive but enabled");
    default:
      return healthy;
  }
}

/** gardener-node-agent's condition: unhealthy beats progressing beats healthy; messages joined with "; ". */
export function conditionOf(verdicts: UnitVerdict[]): NodeCondition {
  const messages = (health: UnitVerdict["health"]) =>
    verdicts
      .filter((v) => v.health === health)
      .map((v) => `${v.unit}: ${v.why}`)
      .join("; ");
  if (verdicts.some((v) => v.health === "unhealthy")) {
    return { type: unitsConditionType, status: "False", reason: "UnhealthyUnits", message: messages("unhealthy") };
  }
  if (verdicts.some((v) => v.health === "progressing")) {
    return { type: unitsConditionType, status: "True", reason: "ProgressingUnits", message: messages("progressing") };
  }
  return { type: unitsConditionType, status: "True", reason: "AllUnitsHealthy", message: allHealthyMessage };
}
