// The OSC controller's side of an in-place update (the update itself: src/controllers/in-place.ts): what
// it says while the update waits, and how its end is reported.
import type { InPlaceChanges } from "../../api/in-place-state.ts";
import { nodeRef } from "../../kube/events.ts";
import type { OsUpdate } from "../in-place.ts";
import { noted, type OscContext, periodic, result, retryWait, type Wait } from "./context.ts";
import { setCondition } from "./report.ts";

/** An in-place update that waits (for the drain, or for the machine to restart): held, and said in the condition. */
export async function holdInPlace(ctx: OscContext, checksum: string, reason: string, why: string): Promise<Wait> {
  result(ctx, "held", why);
  ctx.log.info("the in-place update waits", { checksum, why });
  const current = ctx.deps.node.current();
  if (current) await setCondition(ctx, current, "False", reason, `OSC ${checksum.slice(0, 12)}: ${why}`);
  return periodic(ctx);
}

/**
 * An in-place update this process leaves unfinished because the agent stops: no failure (nothing is told
 * to machine-controller-manager); it is recorded as pending, and the next start finishes it.
 */
export function inPlaceInterrupted(ctx: OscContext, checksum: string, why: string): Wait {
  result(ctx, "held", `the in-place update is finished when the agent starts again: ${why}`);
  ctx.log.info("the in-place update is left to the agent's next start", { checksum, why });
  return periodic(ctx);
}

/**
 * After the apply of an in-place update: the rest of it. A failure is reported, the OSC not reported as
 * applied, and retried — unless it is final (an OS update that failed is not tried again for the same
 * version, as gardener-node-agent: the next OSC change wakes the controller).
 */
export async function finishInPlace(ctx: OscContext, checksum: string, work: InPlaceChanges, osUpdate: OsUpdate | null | undefined): Promise<Wait | undefined> {
  const outcome = await ctx.inPlace.finish(checksum, work, osUpdate);
  if (outcome && "waiting" in outcome) return holdInPlace(ctx, checksum, "InPlaceUpdateRestartPending", outcome.waiting);
  if (outcome && "stopped" in outcome) return inPlaceInterrupted(ctx, checksum, outcome.stopped);
  if (!outcome) return undefined;
  result(ctx, "failed", outcome.failed);
  ctx.log.error("the in-place update failed", { checksum, error: outcome.failed, final: outcome.final });
  const current = ctx.deps.node.current();
  const { reported } = noted(ctx, checksum);
  if (current && !reported.has(`in-place/${outcome.failed}`)) {
    if (outcome.final) reported.add(`in-place/${outcome.failed}`);
    await ctx.deps.events.record({ node: nodeRef(current), type: "Warning", reason: "InPlaceUpdateFailed", message: outcome.failed });
    await setCondition(ctx, current, "False", "InPlaceUpdateFailed", `OSC ${checksum.slice(0, 12)}: ${outcome.failed}`);
  }
  return outcome.final ? periodic(ctx) : retryWait(ctx, "a failed in-place update");
}
