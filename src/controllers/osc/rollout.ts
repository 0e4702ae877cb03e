// The OSC controller's side of a fleet rollout (the rollout itself: src/controllers/rollout/): what an
// apply disrupts, offered to the node's rollout before it runs, and the rollback it may ask for.
import { parseOscBytes } from "../../api/desired.ts";
import type { Plan } from "../../api/plan.ts";
import { lastGoodOscPath } from "../../api/rollout-state.ts";
import type { RolloutSettings } from "../../api/rollout.ts";
import type { Progress } from "../../api/state.ts";
import { applyDesired } from "../../apply/apply.ts";
import { desiredForNode } from "../../apply/desired-for-node.ts";
import { changesOf, disruptionOf } from "../../plan/disruption.ts";
import { describeError } from "../../log.ts";
import { describeStep } from "../../plan/render.ts";
import type { Work } from "../../rollout/machine.ts";
import { type OscContext, periodic, result, retryWait, type Wait } from "./context.ts";
import { reportFailure, reportSuccess } from "./report.ts";

/** The steps of an unfinished apply not done yet. */
const remaining = (progress: Progress | undefined): Plan | undefined => progress && { ...progress.plan, steps: progress.plan.steps.filter((_, i) => !progress.done.includes(i)) };

/**
 * What an apply of `checksum` will do: the plan just made (with the restarts an unfinished apply of an older
 * OSC still owes, which the apply carries over), or what is left of this OSC's unfinished apply.
 */
export function toWeigh(planned: Plan | undefined, progress: Progress | undefined, checksum: string): Plan | undefined {
  if (!planned) return remaining(progress);
  const owed = progress && progress.checksum !== checksum ? (remaining(progress)?.steps ?? []) : [];
  return { ...planned, steps: [...planned.steps, ...owed] };
}

/**
 * What the node's rollout says of this OSC's apply: apply it now (`admitted`: on the rollout's word, which
 * then hears how the apply ended; else without asking it), or the wait (held back, waiting for a slot, its
 * gate running) — or the rollback the rollout asks for first.
 */
export async function admit(ctx: OscContext, w: Omit<Work, "disruption">, plan: Plan | undefined, settings: RolloutSettings): Promise<{ admitted: boolean } | { wait: Wait }> {
  const disruption = plan ? disruptionOf(plan, settings.disruptiveUnits) : { units: [], paths: [] };
  const changes = plan ? changesOf(plan) : [];
  await reportOwed(ctx);
  // A no-op re-check asks nothing of the rollout, unless an OSC's work is under way there (a rollback to
  // apply, a gate to follow); a requested restart waiting or gating is the restart controller's, and the
  // end of an apply the rollout was not asked about must not pass for the end of that restart's apply.
  const current = (await ctx.deps.rollout.state()).current;
  if ((plan?.steps.length ?? 0) === 0 && (!current || current.work.kind === "restart")) return { admitted: false };
  const decision = await ctx.deps.rollout.offer({ ...w, disruption, ...(changes.length > 0 ? { changes } : {}) });
  if (decision.do === "apply") return decision.target === "last-good" ? { wait: await rollBack(ctx, w.checksum) } : { admitted: true };
  result(ctx, "held", decision.do === "hold" ? decision.message : `OSC ${w.checksum.slice(0, 12)}: the health gate of this node's last change runs`);
  return { wait: decision.do === "hold" ? { atMs: ctx.now() + decision.retryAfterMs, why: decision.reason } : periodic(ctx) };
}

/** The rollback the node's rollout asks for without an OSC to offer (the Secret not read since the agent started). */
export async function rollBackPending(ctx: OscContext): Promise<Wait> {
  const failed = (await ctx.deps.rollout.state()).current?.work.checksum ?? "?";
  return rollBack(ctx, failed);
}

/** Applies the node's last good OSC again after `failed` failed its gate (under the same slot; its gate follows). */
async function rollBack(ctx: OscContext, failed: string): Promise<Wait> {
  const { deps, log } = ctx;
  const back = await deps.rollout.lastGood();
  if (!back) throw new Error(`rolling back from OSC ${failed.slice(0, 12)}: no last good OSC is kept (${lastGoodOscPath})`);
  const source = `the last good OSC ${back.checksum.slice(0, 12)} (${lastGoodOscPath})`;
  const parsed = parseOscBytes(back.osc, source);
  if (!parsed.ok) throw new Error(`rolling back: ${parsed.errors.join("; ")}`);
  const resolved = await desiredForNode(parsed.value, source, { files: deps.files, hostName: deps.hostName, readSecret: (n) => ctx.secretRefs.read(n), images: deps.images, log, signal: ctx.stopping });
  if (!resolved.ok) throw new Error(`rolling back: ${resolved.errors.join("; ")}`);
  log.warn("rolling back to the last good OSC", { failed, to: back.checksum });
  const outcome = await applyDesired(resolved.value, back.checksum, back.osc, { files: deps.files, systemd: deps.systemd, store: deps.store, log, selfUnit: deps.selfUnit });
  ctx.state.executed = outcome.executed;
  const error = outcome.failures.map((f) => `${describeStep(f.step)}: ${f.error}`).join("; ");
  await deps.rollout.applied({ complete: outcome.complete, checksum: back.checksum, ...(error ? { error } : {}) });
  result(ctx, "failed", `OSC ${failed.slice(0, 12)} failed its health gate; rolled back to ${back.checksum.slice(0, 12)}`);
  if (!outcome.complete) {
    await reportFailure(ctx, deps.node.current(), back.checksum, outcome);
    return retryWait(ctx, "a failed rollback");
  }
  ctx.state.reportOwed = () => reportSuccess(ctx, deps.node.current(), { base: back.base, checksum: back.checksum }, resolved.value, outcome);
  return (await reportOwed(ctx)) ? periodic(ctx) : retryWait(ctx, "the rollback's report to the Node");
}

/** Makes a rollback's report to the Node that could not be made (kept until it is). Whether none is owed now. */
async function reportOwed(ctx: OscContext): Promise<boolean> {
  const report = ctx.state.reportOwed;
  if (!report) return true;
  try {
    await report();
    ctx.state.reportOwed = undefined;
    return true;
  } catch (err) {
    ctx.log.warn("could not report the rollback to the Node yet; trying again at the next reconcile", { error: describeError(err) });
    return false;
  }
}
