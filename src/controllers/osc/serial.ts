// Gardener's serial rollout (reconciliation.osc.node-agent.gardener.cloud/serial): one node at a time
// through a Lease named after the Secret. A node whose apply keeps failing keeps the lease, so a bad change
// stops there, up to the hold limit: past it the failure may be the node's own, and the lease goes to the
// next node (a Warning and trellis_serial_lease_given_up_total say so). The hold and the give-up are
// persisted (a crash loop must not start them over); the decisions are pure, in gates.ts.
import { formatDuration, formatElapsed } from "../../api/duration.ts";
import { type SerialHoldState, SerialHoldStateSchema, serialHoldPath } from "../../api/serial-hold.ts";
import { elapsedBetween } from "../../host/boot-clock.ts";
import { jsonStore } from "../../host/json-store.ts";
import { nodeRef } from "../../kube/events.ts";
import { createSerialGate, type SerialGate } from "../../kube/serial-gate.ts";
import { describeError } from "../../log.ts";
import type { OscContext, Wait } from "./context.ts";
import type { SerialHold } from "./gates.ts";

const store = (ctx: OscContext) => jsonStore(ctx.deps.files, serialHoldPath, SerialHoldStateSchema, (): SerialHoldState => ({ version: 1 }));

/** The serial lease's hold and give-up, read once, then kept in the context too. */
export async function serialState(ctx: OscContext): Promise<SerialHoldState> {
  ctx.state.serial ??= await store(ctx)
    .read()
    .catch((err: unknown) => {
      ctx.log.warn("could not read the serial lease's hold; starting it over", { path: serialHoldPath, error: describeError(err) });
      return { version: 1 as const };
    });
  return ctx.state.serial;
}

export async function saveSerial(ctx: OscContext, next: SerialHoldState): Promise<void> {
  ctx.state.serial = next;
  await store(ctx).write(next);
}

/**
 * Who holds the serial lease: the host's name, lower-cased, as gardener-node-agent holds it (it passes
 * nodeagent.GetHostName() as the leader elector's identity), so that on a node taken over from it during a
 * rollout the lease it holds is this node's own, not another holder's to wait out for 600 s. Not the Node's
 * name: the Node may not exist yet when a fresh node takes its turn, and the identity must not change when
 * kubelet registers it.
 */
export const serialIdentity = (hostName: string): string => hostName.toLowerCase();

export function serialGate(ctx: OscContext, identity: string): SerialGate {
  return createSerialGate({
    kube: ctx.deps.kube,
    secret: { name: ctx.deps.secretName, namespace: "kube-system", uid: ctx.state.secret?.metadata?.uid ?? "" },
    identity,
    log: ctx.log,
    // A waiting node looks again within seconds, so a released lease is taken up quickly; the
    // cost is a few GETs per waiting node during a rollout, none otherwise.
    maxRetryAfterMs: 5_000,
  });
}

/**
 * Gives up the serial lease an apply kept failing under for longer than the hold limit, and says so
 * on the Node: the pool's rollout goes on with the next node, and this node asks again after as long.
 */
export async function giveUpLease(ctx: OscContext, gate: SerialGate, identity: string, hold: SerialHold, limitMs: number): Promise<Wait> {
  await gate.release();
  const at = ctx.bootClock();
  await saveSerial(ctx, { version: 1, gaveUp: { checksum: hold.checksum, at } });
  ctx.metrics.serialGivenUp.inc();
  const heldFor = formatElapsed(elapsedBetween(hold.since, at));
  const message =
    `${identity} held the serial lease kube-system/${ctx.deps.secretName} for ${heldFor} (hold limit ${formatDuration(limitMs)}) ` +
    `and failed ${hold.failures} apply attempt(s) of OSC ${hold.checksum.slice(0, 12)}; gave it up so the next node can go on, ` +
    `asking again in ${formatDuration(limitMs)}. Last error: ${hold.lastError}`;
  ctx.log.warn("gave up the serial lease: the apply kept failing past the hold limit", { holder: identity, checksum: hold.checksum, failures: hold.failures, heldFor });
  const current = ctx.deps.node.current();
  if (current) await ctx.deps.events.record({ node: nodeRef(current), type: "Warning", reason: "SerialLeaseGivenUp", message });
  return { atMs: ctx.now() + limitMs, why: "serial lease cool-off over" };
}
