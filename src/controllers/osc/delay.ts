// Gardener's reconciliation delay (the Node annotation node-agent.gardener.cloud/reconciliation-delay): an
// updated OSC is held back that long after this node first saw it. When it was first seen is kept in the
// state directory, measured on the boot clock: an agent restart does not start the wait over, a wall-clock
// step does not move it.
import type { V1Node } from "@kubernetes/client-node";
import { DelayStartSchema, delayStartPath } from "../../api/delay-start.ts";
import { effectiveChecksumAnnotation } from "../../api/layers.ts";
import { elapsedBetween } from "../../host/boot-clock.ts";
import { jsonStore } from "../../host/json-store.ts";
import { describeError } from "../../log.ts";
import * as v from "valibot";
import type { OscContext } from "./context.ts";
import { delayLeft, parseDelay } from "./gates.ts";
import { annotations } from "./report.ts";

export function delayRemaining(ctx: OscContext, current: V1Node | undefined, checksum: string): number {
  const delay = parseDelay(current?.metadata?.annotations?.[annotations.reconciliationDelay]);
  if ("unparsable" in delay) ctx.log.warn("ignoring an unparsable reconciliation delay", { annotation: annotations.reconciliationDelay, value: delay.unparsable });
  const firstSeen = ctx.state.firstSeen;
  if (delay.ms === 0 || firstSeen?.checksum !== checksum) return 0;
  return delayLeft(delay.ms, elapsedBetween(firstSeen, ctx.bootClock()));
}

/** Records when this node first saw `checksum` (kept in the state dir, so an agent restart keeps the time). */
export async function noteFirstSeen(ctx: OscContext, checksum: string): Promise<void> {
  if (ctx.state.firstSeen?.checksum === checksum) return;
  const store = jsonStore(ctx.deps.files, delayStartPath, v.optional(DelayStartSchema), () => undefined);
  const saved = await store.read().catch((err: unknown) => {
    ctx.log.warn("could not read when the OSC was first seen; counting from now", { path: delayStartPath, error: describeError(err) });
    return undefined;
  });
  if (saved?.checksum === checksum) {
    ctx.state.firstSeen = saved;
    return;
  }
  ctx.state.firstSeen = { version: 1, checksum, ...ctx.bootClock() };
  await store.write(ctx.state.firstSeen);
}

/** What the Node says is applied: the effective checksum where overlays apply, else the base one. */
export function nodeAppliedChecksum(current: V1Node | undefined): string | undefined {
  const a = current?.metadata?.annotations ?? {};
  return a[effectiveChecksumAnnotation] ?? a[annotations.appliedChecksum];
}
