// The health gate after a disruptive change: the node must show, continuously for the settle time (in
// this order, so that a failure names the most telling check),
// - every unit the change restarted active (a unit cycling through auto-restart is not);
// - Node Ready as kubelet reports it (if the change restarted kubelet: reported by the kubelet running
//   now, i.e. a heartbeat since its process became active, not the old kubelet's last word; a kubelet
//   that runs but stops reporting is caught once the Node's grace period marks it NotReady, which the
//   default settle time of 60 s outlasts);
// - every unit of the OSC healthy, as SystemdUnitsReady judges them (computed now, not the condition,
//   which is refreshed only every syncPeriod);
// - the Secret's probe, if it has one (HTTP 2xx/3xx, or a command exiting 0, within its time limit).
// Passing releases the node's slot; not passing within the health timeout fails the gate, naming the
// check that failed last. Settle and timeout are measured on a monotonic clock.
import { execFile } from "node:child_process";
import type { V1Node } from "@kubernetes/client-node";
import type { Probe, RolloutSettings } from "../api/rollout.ts";
import type { OwnedUnit } from "../api/state.ts";
import type { UnitStatus } from "../host/systemd.ts";
import { assessUnit, conditionOf } from "./unit-health.ts";

/**
 * `node`: the check that failed is about the Node as the API server has it (the decisive look reads it fresh).
 * `inconclusive`: the node could not see its own health (its Node as the API server has it could not be read,
 * or the node lifecycle controller marked it Unknown): a partition looks like that as much as a change that
 * broke the node's network.
 */
export type GateVerdict = { healthy: true } | { healthy: false; check: string; node?: true; inconclusive?: true };

export type HealthCheckDeps = {
  node(): V1Node | undefined;
  unitStatus(unit: string): Promise<UnitStatus>;
  ownedUnits(): Promise<Record<string, OwnedUnit>>;
  stuckThresholdMs: number;
  /** ms since boot, for how long a unit has been in its state. */
  sinceBoot(): number;
  /** The wall clock (ms): kubelet's heartbeats are its readings of this machine's clock. */
  wallNow?: () => number;
};

/** One look at the node's health after a change that restarted `units`. */
export async function checkHealth(deps: HealthCheckDeps, settings: Pick<RolloutSettings, "probe" | "probeTimeoutMs">, change: { units: string[] }): Promise<GateVerdict> {
  const owned = await deps.ownedUnits();
  // One D-Bus read per unit per look: the checks below all use these.
  const statuses = new Map<string, UnitStatus>();
  for (const unit of Object.keys(owned)) statuses.set(unit, await deps.unitStatus(unit));
  for (const unit of change.units) {
    const want = owned[unit];
    const s = statuses.get(unit);
    if (!want || !s || want.enable === false || want.command === "stop") continue; // stopped on purpose
    const verdict = assessUnit(unit, want, s, deps.stuckThresholdMs, deps.sinceBoot());
    if (verdict.health !== "healthy" || s.subState === "auto-restart") {
      return { healthy: false, check: `unit ${unit}: ${s.subState === "auto-restart" ? "restarting after a failure (auto-restart)" : verdict.why ?? `${s.activeState} (${s.subState})`}` };
    }
  }
  const node = deps.node();
  const ready = node?.status?.conditions?.find((c) => c.type === "Ready");
  if (!node) return { healthy: false, check: "Node: not registered", node: true };
  if (ready?.status !== "True") {
    return { healthy: false, check: `Node Ready: ${ready ? `${ready.status} (${ready.reason ?? ""}${ready.message ? `: ${ready.message}` : ""})` : "no Ready condition"}`, node: true, ...(ready?.status === "Unknown" ? { inconclusive: true as const } : {}) };
  }
  if (change.units.includes("kubelet.service")) {
    const kubelet = statuses.get("kubelet.service") ?? (await deps.unitStatus("kubelet.service"));
    // When kubelet became active, on the wall clock as it reads now (its time since boot taken back from
    // now): a wall clock stepped back after kubelet started must not make its fresh heartbeats look old.
    const started = kubelet.stateChangeSinceBootMs !== undefined ? (deps.wallNow ?? Date.now)() - (deps.sinceBoot() - kubelet.stateChangeSinceBootMs) : kubelet.activeEnterTimestamp?.getTime();
    // Heartbeats have whole seconds.
    const heartbeat = new Date(ready.lastHeartbeatTime ?? 0).getTime();
    if (started === undefined || heartbeat < Math.floor(started / 1000) * 1000) return { healthy: false, check: "Node Ready: not yet reported by the kubelet running now", node: true };
  }
  const units = conditionOf(Object.entries(owned).map(([unit, want]) => assessUnit(unit, want, statuses.get(unit) as UnitStatus, deps.stuckThresholdMs, deps.sinceBoot())));
  if (units.reason !== "AllUnitsHealthy") return { healthy: false, check: `SystemdUnitsReady: ${units.reason}: ${units.message}` };
  if (settings.probe) {
    const problem = await runProbe(settings.probe, settings.probeTimeoutMs);
    if (problem) return { healthy: false, check: `probe ${describeProbe(settings.probe)}: ${problem}` };
  }
  return { healthy: true };
}

export const describeProbe = (p: Probe) => (p.kind === "http" ? p.url : `exec ${p.argv.join(" ")}`);

/** Undefined when the probe passes; else why not. */
export async function runProbe(probe: Probe, timeoutMs: number): Promise<string | undefined> {
  if (probe.kind === "http") {
    try {
      const res = await fetch(probe.url, { signal: AbortSignal.timeout(timeoutMs), redirect: "manual" });
      await res.body?.cancel();
      return res.status >= 200 && res.status < 400 ? undefined : `HTTP ${res.status}`;
    } catch (err) {
      return err instanceof Error && err.name === "TimeoutError" ? `no answer within ${timeoutMs} ms` : `${err instanceof Error ? err.message : String(err)}`;
    }
  }
  const [file, ...args] = probe.argv as [string, ...string[]];
  return new Promise((resolve) => {
    execFile(file, args, { timeout: timeoutMs, killSignal: "SIGKILL", maxBuffer: 64 * 1024 }, (err, _stdout, stderr) => {
      if (!err) return resolve(undefined);
      const e = err as NodeJS.ErrnoException & { killed?: boolean; code?: number | string };
      if (e.killed) return resolve(`did not finish within ${timeoutMs} ms`);
      const tail = String(stderr).trim().split("\n").at(-1)?.slice(0, 200);
      resolve(typeof e.code === "number" ? `exit code ${e.code}${tail ? `: ${tail}` : ""}` : e.message);
    });
  });
}
