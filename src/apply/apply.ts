// Brings the node to a desired state: plan (or resume the interrupted plan for the same OSC), persist
// the plan, execute it step by step through the host adapters, and record progress at checkpoints.
//
// - A failed write stops the apply before any unit is touched (the plan puts every write first); a
//   failed removal or daemon-reload stops it before any unit the OSC keeps is touched: units must not
//   restart on half-written configuration. The steps run again on the next attempt.
// - A failed unit operation does not stop the others; it stays pending in the persisted plan and is
//   retried by the next attempt (the caller backs off between attempts).
// - The agent's own unit restarts last, after every other step was attempted, even if one failed.
// - The last-applied record is written only when every step succeeded.
import { dirname } from "node:path";
import type { Desired } from "../api/desired.ts";
import { dropInDir, paths } from "../api/paths.ts";
import type { AgentState, Owned, Progress } from "../api/state.ts";
import type { FileContent, Files } from "../host/files.ts";
import type { Systemd } from "../host/systemd.ts";
import type { Logger } from "../log.ts";
import { describeError } from "../log.ts";
import { ownedAfter, settleOwned } from "../plan/owned.ts";
import { withOwedRestarts } from "../plan/owed.ts";
import type { Plan, Step } from "../api/plan.ts";
import { planForNode } from "./observe.ts";
import type { StateStore } from "./state-store.ts";

export type ApplyDeps = {
  files: Files;
  systemd: Systemd;
  store: StateStore;
  log: Logger;
  /** The agent's own unit (restarted last). */
  selfUnit: string;
  now?: () => Date;
  /** The plan the caller already made for this OSC (and weighed for its rollout): applied as it is, not made again. */
  planned?: { plan: Plan; owned: Owned };
  /** What the caller adds to a new plan before it is persisted (an in-place update's removal of kubelet's stale state). */
  amend?: (plan: Plan) => Plan;
};

export type StepFailure = { step: Step; error: string };

export type ApplyOutcome = {
  checksum: string;
  plan: Plan;
  /** Whether this apply resumed a plan an earlier run had persisted. */
  resumed: boolean;
  executed: Step[];
  failures: StepFailure[];
  /** Everything succeeded and the last-applied record was written. */
  complete: boolean;
  /** The agent's own unit restart is queued: systemd stops this process in a moment. */
  restartingSelf: boolean;
};

/**
 * Applies `desired` (from the OSC with this checksum; `oscYaml` is recorded as last applied on success,
 * unless it is recorded already: then it may be undefined).
 */
export async function applyDesired(desired: Desired, checksum: string, oscYaml: string | Uint8Array | undefined, deps: ApplyDeps): Promise<ApplyOutcome> {
  let state = await deps.store.read();
  let progress = state.progress;
  let resumed = false;
  if (progress && progress.checksum !== checksum) {
    // The OSC changed while an apply was unfinished: keep what it wrote as owned, and its pending
    // restarts, then plan the new OSC from scratch.
    const carried = await abandon(progress, state.owned, deps.files, deps.log);
    state = { ...state, owned: carried.owned, progress: undefined };
    progress = undefined;
    deps.log.info("an unfinished apply of an older OSC was superseded", { checksum, pendingRestarts: carried.pending });
    const fresh = await planFresh(desired, checksum, state.owned, deps);
    state = { ...state, owned: fresh.owned };
    progress = { checksum, plan: amended(withOwedRestarts(fresh.plan, carried.pending, desired, deps.selfUnit), deps), done: [] };
  } else if (progress) {
    resumed = true;
    deps.log.info("resuming an unfinished apply", { checksum, steps: progress.plan.steps.length, done: progress.done.length });
  } else {
    const fresh = deps.planned ?? (await planFresh(desired, checksum, state.owned, deps));
    state = { ...state, owned: fresh.owned };
    progress = { checksum, plan: amended(fresh.plan, deps), done: [] };
  }

  if (progress.plan.steps.length === 0) {
    state = await finish(state, desired, checksum, oscYaml, deps, []);
    return { checksum, plan: progress.plan, resumed, executed: [], failures: [], complete: true, restartingSelf: false };
  }
  state = { ...state, progress };
  await deps.store.write(state); // the plan is on disk before its first step runs

  const run = await execute(progress, state, desired, deps);
  state = run.state;
  const complete = run.failures.length === 0;
  if (complete) state = await finish(state, desired, checksum, oscYaml, deps, run.self ? [...run.executed, run.self] : run.executed);
  else await deps.store.write(state);
  let restartingSelf = false;
  if (run.self) {
    // After this the agent is stopped by systemd; everything is recorded already.
    deps.log.info("restarting the agent's own unit last", { unit: deps.selfUnit, reason: run.self.reason });
    restartingSelf = await deps.systemd.queueRestart(run.self.unit).then(
      () => true,
      (err: unknown) => {
        run.failures.push({ step: run.self as Step, error: describeError(err) });
        return false;
      },
    );
  }
  return { checksum, plan: progress.plan, resumed, executed: run.executed, failures: run.failures, complete, restartingSelf };
}

const amended = (plan: Plan, deps: ApplyDeps): Plan => deps.amend?.(plan) ?? plan;

function planFresh(desired: Desired, checksum: string, owned: Owned, deps: ApplyDeps): Promise<{ plan: Plan; owned: Owned }> {
  return planForNode({ desired, checksum, owned, files: deps.files, systemd: deps.systemd, selfUnit: deps.selfUnit });
}

type Run = { state: AgentState; executed: Step[]; failures: StepFailure[]; self?: Extract<Step, { kind: "restart" }> };

async function execute(progress: Progress, start: AgentState, desired: Desired, deps: ApplyDeps): Promise<Run> {
  let state = start;
  const done = new Set(progress.done);
  const executed: Step[] = [];
  const failures: StepFailure[] = [];
  const checkpoint = async () => {
    state = { ...state, progress: { ...progress, done: [...done].sort((a, b) => a - b) } };
    await deps.store.write(state);
  };
  // A writer killed mid-write leaves its temp file; clear them where this plan writes.
  const dirs = new Set(progress.plan.steps.flatMap((s) => (s.kind === "write" ? [dirname(s.path)] : [])));
  for (const dir of dirs) await deps.files.cleanupTemp(dir);
  let self: Extract<Step, { kind: "restart" }> | undefined;
  let unitPhase = false;
  for (const [i, step] of progress.plan.steps.entries()) {
    if (done.has(i)) continue;
    if (step.kind === "restart" && step.unit === deps.selfUnit) {
      // Marked done before it runs: the restart ends this process, and must not loop on resume.
      done.add(i);
      self = step;
      continue;
    }
    const isUnitOp = step.kind === "enable" || step.kind === "disable" || step.kind === "stop" || step.kind === "restart";
    if (isUnitOp && !unitPhase) {
      unitPhase = true;
      await checkpoint(); // files and unit files are in place: record them before units change
    }
    try {
      await runStep(step, desired, deps);
      executed.push(step);
      state = { ...state, owned: ownedAfter(state.owned, step) };
      done.add(i);
      if (isUnitOp) await checkpoint();
    } catch (err) {
      const error = describeError(err);
      failures.push({ step, error });
      deps.log.error("step failed", { step: stepName(step), error });
      if (!isUnitOp) {
        await checkpoint();
        return { state, executed, failures }; // nothing else runs on half-written configuration
      }
    }
  }
  await checkpoint();
  return { state, executed, failures, ...(self ? { self } : {}) };
}

async function runStep(step: Step, desired: Desired, deps: ApplyDeps): Promise<void> {
  switch (step.kind) {
    case "write":
      return deps.files.writeAtomic(step.path, contentFor(step, desired), step.mode);
    case "remove":
      // Idempotent, so a removal that a crash cut short is finished by the resumed plan.
      if (step.target.type === "drop-ins") {
        await deps.files.removeTree(step.path);
        return;
      }
      await deps.files.remove(step.path);
      if (step.target.type === "drop-in") await deps.files.removeDirIfEmpty(dropInDir(step.target.unit));
      // A registry removed from the OSC takes its certs.d directory along (containerd would still
      // consult an empty one); CA files another tool put there keep it.
      if (dirname(dirname(step.path)) === paths.containerdHostsDir) await deps.files.removeDirIfEmpty(dirname(step.path));
      return;
    case "daemon-reload":
      return deps.systemd.daemonReload();
    case "enable":
      await deps.systemd.enableUnits([step.unit]);
      return;
    case "disable":
      await deps.systemd.disableUnits([step.unit]);
      return;
    case "stop":
      return deps.systemd.stop(step.unit);
    case "restart":
      return deps.systemd.restart(step.unit);
  }
}

function contentFor(step: Extract<Step, { kind: "write" }>, desired: Desired): FileContent {
  const t = step.target;
  const content =
    t.type === "file"
      ? desired.files.find((f) => f.path === step.path && f.sha256 === step.sha256)?.content
      : t.type === "unit"
        ? desired.units.find((u) => u.name === t.unit && u.sha256 === step.sha256)?.content
        : desired.units.find((u) => u.name === t.unit)?.dropIns.find((d) => d.name === t.name && d.sha256 === step.sha256)?.content;
  // A resumed plan belongs to the same OSC checksum, so its content is always there.
  if (content === undefined) throw new Error(`no content with sha256 ${step.sha256} for ${step.path} in the desired state`);
  return content;
}

/** What an apply did, as the OSCApplied event tells it: how many steps, which units restarted. */
export function summaryOf(executed: Step[]): { steps: number; restarted: string[] } {
  return { steps: executed.length, restarted: executed.flatMap((s) => (s.kind === "restart" ? [s.unit] : [])) };
}

// `executed`: this run's steps. What the apply of this checksum did is kept with it, so that it can still
// be reported after the agent restarted (its own restart often ends the first apply, before kubelet has
// registered the Node to report on); a later no-op re-check keeps it.
async function finish(state: AgentState, desired: Desired, checksum: string, oscYaml: string | Uint8Array | undefined, deps: ApplyDeps, executed: Step[]): Promise<AgentState> {
  const at = (deps.now?.() ?? new Date()).toISOString();
  const previous = state.lastApplied?.checksum === checksum ? state.lastApplied : undefined;
  if (!previous) {
    if (oscYaml === undefined) throw new Error(`the OSC ${checksum} is to be recorded as applied, and its bytes were not given`);
    await deps.store.recordApplied(oscYaml, desired);
  }
  const summary =
    previous && executed.length === 0
      ? { steps: previous.steps, restarted: previous.restarted }
      : summaryOf(executed);
  const next: AgentState = { version: 1, owned: settleOwned(state.owned, desired), lastApplied: { checksum, at, ...summary } };
  await deps.store.write(next);
  return next;
}

/**
 * An unfinished plan being superseded: adopt what it wrote, and return the unit steps it still owed.
 * Never fails: a saved plan must not outrank a newer OSC, so a step whose path cannot even be read
 * (the old OSC named a directory, say) is simply not adopted.
 */
async function abandon(progress: Progress, owned: Owned, files: Files, log: Logger): Promise<{ owned: Owned; pending: Step[] }> {
  let next = owned;
  const pending: Step[] = [];
  for (const [i, step] of progress.plan.steps.entries()) {
    if (progress.done.includes(i)) continue;
    if (step.kind === "write") {
      const written = await files.sha256(step.path).catch((err: unknown) => {
        log.warn("a path of the superseded apply cannot be read; not adopted", { path: step.path, error: describeError(err) });
        return undefined;
      });
      if (written === step.sha256) next = ownedAfter(next, step);
    }
    if (step.kind === "restart" || step.kind === "stop") pending.push(step);
  }
  return { owned: next, pending };
}

function stepName(step: Step): string {
  return step.kind === "write" || step.kind === "remove" ? `${step.kind} ${step.path}` : step.kind === "daemon-reload" ? step.kind : `${step.kind} ${step.unit}`;
}

