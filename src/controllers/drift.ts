// Drift, seen at once: the directories holding what trellis wrote (OSC files, unit files, drop-ins)
// are watched with inotify, and the units it manages through systemd's PropertiesChanged signals.
// A change is looked at after a short debounce, between reconciles (during an apply the node differs
// from the last recorded state by design), against what the last apply recorded: a file whose
// content or mode differs or that is gone is repaired by a reconcile, a unit stopped behind trellis's
// back is started again. Every repair is a Warning event naming the file or unit and what differed,
// and counts in trellis_drift_total{kind}; a file or unit repaired recurringRepairs times within
// recurringWindow sets the Node condition ConfigurationDrift (a neighbour fighting trellis) until it
// has been quiet that long. Mode "report" only reports (the periodic re-check still repairs).
//
// One watch per parent directory, not per file (inotify watches are a per-user kernel budget), at most
// maxWatches of them; a directory that does not exist yet is watched after the next reconcile.
import { type FSWatcher, watch } from "node:fs";
import type { NodeAgentConfiguration } from "../api/agent-config.ts";
import type { OwnedUnit } from "../api/state.ts";
import { formatDuration } from "../api/duration.ts";
import { observeFile } from "../apply/observe.ts";
import { nodeRef } from "../kube/events.ts";
import { patchNodeConditionIfChanged } from "../kube/node.ts";
import { describeError } from "../log.ts";
import type { Registry } from "../metrics.ts";
import type { Step } from "../api/plan.ts";
import { type Drift, driftInSteps, driftKinds, type Written, fileDrift, pathsUnder, recurringDrift, watchedDirs, writtenPaths } from "../plan/drift.ts";
import type { OscController } from "./osc/controller.ts";
import type { Controller, OscWorkDeps } from "./types.ts";
import { monotonicMs } from "../time.ts";
import { later } from "../loops.ts";
import { type AssessableStatus, assessUnit, statusesForAssessment } from "./unit-health.ts";

export const driftConditionType = "ConfigurationDrift";
const maxWatches = 512;

export type DriftControllerDeps = Omit<OscWorkDeps, "secretName"> & {
  metrics: Registry;
  osc: Pick<OscController, "between" | "onReconciled">;
  selfUnit: string;
  config: NodeAgentConfiguration["controllers"]["drift"];
  /** Monotonic milliseconds. */
  clock?: () => number;
};

export function startDriftController(deps: DriftControllerDeps): Controller {
  const log = deps.log.with({ controller: "drift" });
  const { config } = deps;
  const clock = deps.clock ?? monotonicMs;
  const found = deps.metrics.counter("trellis_drift_total", "Drift found on the node (repaired, or only reported in mode report), by kind.");
  for (const kind of driftKinds) found.inc({ kind }, 0);
  if (config.mode === "disabled") {
    deps.status.set("drift", { ok: true, summary: "drift watch disabled (controllers.drift.mode)" });
    return { stop: async () => {} };
  }

  const watchers = new Map<string, FSWatcher>();
  let written = new Map<string, Written>();
  let units = new Set<string>();
  const dirtyPaths = new Set<string>();
  const dirtyUnits = new Set<string>();
  let checking: Promise<void> = Promise.resolve();
  const debounce = later(() => {
    checking = checking.then(check);
  });
  const conditionUpdate = later(() => void updateCondition());
  let stopped = false;
  // Report mode: what was reported, by target, so a drift that stays is said once.
  const reported = new Map<string, string>();
  const repairs = new Map<string, number[]>();
  let repairCount = 0;
  let lastUnwatched = 0;
  // While this controller's own repair reconcile runs: its writes are reported by repair().
  let repairing = false;

  const changed = (paths: string[], unit?: string) => {
    if (stopped) return;
    for (const p of paths) dirtyPaths.add(p);
    if (unit) dirtyUnits.add(unit);
    // From the first change, not the last: a neighbour writing all the time must not postpone the repair forever.
    if (!debounce.pending()) debounce.in(config.debounce);
  };

  function watchDir(dir: string): void {
    let w: FSWatcher;
    try {
      w = watch(dir, { persistent: false }, () => changed(pathsUnder(written.keys(), dir)));
    } catch (err) {
      log.debug("not watching a directory (yet)", { dir, error: describeError(err) });
      return;
    }
    const lost = () => {
      if (watchers.get(dir) !== w) return;
      watchers.delete(dir);
      w.close();
      changed(pathsUnder(written.keys(), dir)); // the directory itself was removed
    };
    w.on("error", lost);
    w.on("close", lost);
    watchers.set(dir, w);
  }

  async function refresh(): Promise<void> {
    const state = await deps.store.read();
    written = writtenPaths(state.owned);
    units = new Set(Object.keys(state.owned.units).filter((u) => u !== deps.selfUnit));
    const { dirs, unwatched } = watchedDirs(written.keys(), maxWatches);
    if (unwatched.length > 0 && unwatched.length !== lastUnwatched) log.warn("too many directories to watch: these files are repaired only by the periodic re-check", { maxWatches, files: unwatched });
    lastUnwatched = unwatched.length; // said once, not after every reconcile
    const wanted = new Set(dirs);
    for (const [dir, w] of watchers) {
      if (wanted.has(dir)) continue;
      watchers.delete(dir);
      w.close();
    }
    for (const dir of dirs) if (!watchers.has(dir)) watchDir(dir);
    report();
  }

  function report(): void {
    deps.status.set("drift", {
      ok: true,
      summary: `${config.mode === "repair" ? "repairing" : "reporting"} drift of ${written.size} file(s) and ${units.size} unit(s) (${watchers.size} directories watched); ${repairCount} found so far`,
      mode: config.mode,
      watchedDirs: watchers.size,
      found: repairCount,
    });
  }

  async function check(): Promise<void> {
    if (stopped) return;
    const paths = [...dirtyPaths];
    const unitNames = [...dirtyUnits];
    dirtyPaths.clear();
    dirtyUnits.clear();
    try {
      await deps.osc.between(async (reconcile) => {
        const drifts = await find(paths, unitNames);
        if (drifts.length === 0) return;
        if (config.mode === "report") return await reportOnly(drifts);
        await repair(drifts, reconcile);
      });
    } catch (err) {
      if (!stopped) log.error("could not check for drift", { error: describeError(err) });
    }
  }

  async function find(paths: string[], unitNames: string[]): Promise<Drift[]> {
    const state = await deps.store.read();
    const recorded = writtenPaths(state.owned);
    const drifts: Drift[] = [];
    const seen = await deps.files.inspect(paths.filter((path) => recorded.has(path)));
    for (const path of paths) {
      const want = recorded.get(path);
      const file = seen.get(path)?.file;
      const d = want ? fileDrift(path, want, file && { sha256: file.sha256, mode: file.mode }) : undefined;
      if (d) drifts.push(d);
      else reported.delete(path);
    }
    const checked = unitNames.filter((unit) => state.owned.units[unit] && unit !== deps.selfUnit);
    const statuses = await statusesForAssessment(deps.systemd, checked);
    for (const unit of checked) {
      const want = state.owned.units[unit] as OwnedUnit;
      const s = statuses.get(unit) as AssessableStatus;
      // Only a clean stop: a unit that failed is unit-health's (SystemdUnitsReady) and its Restart='s.
      if (s.activeState === "inactive" && assessUnit(unit, want, s, Number.POSITIVE_INFINITY, 0).health === "unhealthy") {
        drifts.push({ target: unit, kind: "unit-stopped", detail: `${unit}: stopped (${s.subState}), the OSC wants it running` });
      } else reported.delete(unit);
    }
    return drifts;
  }

  async function reportOnly(drifts: Drift[]): Promise<void> {
    for (const d of drifts) {
      if (reported.get(d.target) === d.detail) continue;
      reported.set(d.target, d.detail);
      count(d, false);
      log.warn("drift found (report only: controllers.drift.mode is report)", { target: d.target, kind: d.kind, detail: d.detail });
      await record("DriftDetected", `${d.detail} (not repaired: controllers.drift.mode is report)`);
    }
    report();
  }

  async function repair(drifts: Drift[], reconcile: (why: string) => Promise<boolean>): Promise<void> {
    const files = drifts.filter((d) => d.kind !== "unit-stopped");
    let failure: string | undefined;
    if (files.length > 0) {
      repairing = true;
      const applied = await reconcile(`drift: ${files.map((d) => d.target).join(", ")}`).finally(() => (repairing = false));
      if (!applied) failure = "the reconcile that repairs it did not complete (see OSCApplyFailed)";
    }
    const after = writtenPaths((await deps.store.read()).owned);
    for (const d of drifts) {
      let problem = failure;
      if (d.kind === "unit-stopped") {
        problem = await deps.systemd.start(d.target).then(
          () => undefined,
          (err: unknown) => describeError(err),
        );
      } else {
        const want = after.get(d.target);
        const left = want ? fileDrift(d.target, want, await observeFile(deps.files, d.target)) : undefined;
        if (left) problem ??= `still differs: ${left.detail}`;
      }
      count(d, true);
      if (problem) {
        log.error("drift found, repair failed", { target: d.target, kind: d.kind, detail: d.detail, error: problem });
        await record("DriftRepairFailed", `${d.detail}; repair failed: ${problem}`);
      } else {
        log.warn("drift repaired", { target: d.target, kind: d.kind, detail: d.detail });
        await record("DriftRepaired", `${d.detail}; repaired`);
      }
    }
    report();
    await updateCondition();
  }

  // A drift found right after the agent started, before its Node watch delivered the Node, is still said.
  function count(d: Drift, repaired: boolean): void {
    found.inc({ kind: d.kind });
    repairCount++;
    if (repaired) repairs.set(d.target, [...(repairs.get(d.target) ?? []), clock()]);
  }

  // A reconcile that found drift before the watches did (the periodic re-check, drift while the agent
  // was down, a directory beyond maxWatches) repaired it as part of its apply: said all the same.
  async function repairedByReconcile(executed: readonly Step[]): Promise<void> {
    const drifts = driftInSteps(executed);
    if (drifts.length === 0) return;
    for (const d of drifts) {
      count(d, true);
      log.warn("drift repaired by a reconcile", { target: d.target, kind: d.kind, detail: d.detail });
      await record("DriftRepaired", `${d.detail}; repaired by a reconcile (the periodic re-check, or one that came first)`);
    }
    report();
    await updateCondition();
  }

  async function record(reason: string, message: string): Promise<void> {
    const node = deps.node.current();
    const event = { type: "Warning" as const, reason, message };
    if (node) await deps.events.record({ node: nodeRef(node), ...event });
    else void deps.node.found.then((n) => deps.events.record({ node: nodeRef(n), ...event }));
  }

  async function updateCondition(): Promise<void> {
    conditionUpdate.cancel();
    const { recurring, nextChangeAtMs } = recurringDrift(repairs, clock(), config.recurringRepairs, config.recurringWindow);
    if (nextChangeAtMs !== undefined && !stopped) conditionUpdate.in(nextChangeAtMs - clock());
    const node = deps.node.current();
    if (!node) return;
    const window = formatDuration(config.recurringWindow);
    const has = node.status?.conditions?.some((c) => c.type === driftConditionType);
    // A node that never fought anyone does not carry the condition at all.
    if (recurring.length === 0 && !has) return;
    const condition =
      recurring.length > 0
        ? {
            type: driftConditionType,
            status: "True" as const,
            reason: "DriftKeepsComingBack",
            message: `repaired at least ${config.recurringRepairs} times within ${window}: ${recurring.map((r) => `${r.target} (${r.count})`).join(", ")}; something on the node keeps changing them`,
          }
        : { type: driftConditionType, status: "False" as const, reason: "NoRecurringDrift", message: `no file or unit needed ${config.recurringRepairs} repairs within ${window}` };
    await patchNodeConditionIfChanged(deps.kube, node, condition).catch((err: unknown) =>
      log.warn("could not set the Node condition", { condition: driftConditionType, error: describeError(err) }),
    );
  }

  const refreshing = () =>
    refresh().catch((err: unknown) => log.error("could not update the drift watches", { error: describeError(err) }));
  void refreshing();
  const unsubscribeReconciled = deps.osc.onReconciled((executed) => {
    void refreshing();
    if (!repairing) void repairedByReconcile(executed);
  });
  let unsubscribeUnits: () => void = () => {};
  deps.systemd
    .watchUnits((unit) => {
      if (units.has(unit)) changed([], unit);
    })
    .then(
      (unsubscribe) => {
        if (stopped) unsubscribe();
        else unsubscribeUnits = unsubscribe;
      },
      (err: unknown) => log.warn("cannot watch the units for drift: a stopped unit is seen only by the unit check", { error: describeError(err) }),
    );

  return {
    stop: async () => {
      stopped = true;
      debounce.cancel();
      conditionUpdate.cancel();
      unsubscribeReconciled();
      unsubscribeUnits();
      const open = [...watchers.values()];
      watchers.clear();
      for (const w of open) w.close();
      await checking;
    },
  };
}
