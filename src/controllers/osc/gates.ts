// The gating decisions of the OSC controller, pure: which gates an OSC passes before it is applied on
// this node (the reconciliation delay, the serial lease, trellis's own rollout admission), and when a
// node whose apply keeps failing gives the serial lease up. src/controllers/osc/ does the I/O.
//
// What gardener-node-agent does (pkg/nodeagent/controller/operatingsystemconfig, v1.150.0): the delay
// applies only to a Secret update seen by a running agent (a Secret seen at the agent's start, or at a
// fresh node's first start, is reconciled at once), and never to a serial Secret (add.go,
// EnqueueWithJitterDelay: a serial Secret's update is queued at once); the serial lease is taken by every
// node whose Node does not carry the OSC's checksum as applied, fresh nodes included, and kept until the
// Node does (reconciler.go: the lease is released only after the checksum is patched). trellis decides
// from what is known as applied, so that a node that lost its state, or is taken over from
// gardener-node-agent, is still treated as the update it is:
//   - "update": something else is applied (trellis's state, else the Node's checksum annotation, which
//     gardener-node-agent writes too): the delay (unless serial), the serial lease, admission.
//   - "fresh": nothing is known to be applied: the serial lease (as gardener-node-agent), no delay and no
//     admission: there is nothing running to disrupt, and holding a new node back only delays capacity.
//   - "current": this OSC is what is applied: it is re-ensured at once, without the delay; the serial lease
//     only while the Node does not show it yet (its report waits for a registry's readiness probe, the
//     static pods, or kubelet registering the Node); what re-ensuring it disrupts (drift repair restarting
//     kubelet) passes trellis's admission like any change.
import { parseGoDuration } from "../../api/duration.ts";
import type { SerialHoldState } from "../../api/serial-hold.ts";
import { type BootClockReading, elapsedBetween } from "../../host/boot-clock.ts";

export type NodeKind = "update" | "fresh" | "current";

export type Gates = { kind: NodeKind; delay: boolean; serial: boolean; admit: boolean };

export function gatesFor(o: {
  checksum: string;
  /** The checksum trellis's state records as applied. */
  stateApplied: string | undefined;
  /** The checksum the Node carries as applied (the effective one where overlays apply, else the base). */
  nodeApplied: string | undefined;
  /** The Secret asks for a serial rollout (reconciliation.osc.node-agent.gardener.cloud/serial). */
  serial: boolean;
}): Gates {
  const applied = o.stateApplied ?? o.nodeApplied;
  const kind: NodeKind = applied === undefined ? "fresh" : applied === o.checksum ? "current" : "update";
  const reported = o.nodeApplied === o.checksum;
  return { kind, delay: kind === "update" && !o.serial, serial: o.serial && !(kind === "current" && reported), admit: kind !== "fresh" };
}

export type DelaySetting = { ms: number } | { ms: 0; unparsable: string };

/** The Node's reconciliation-delay annotation: absent is no delay; a value that does not parse (or is negative) counts as none, and says so. */
export function parseDelay(text: string | undefined): DelaySetting {
  if (!text) return { ms: 0 };
  const ms = parseGoDuration(text);
  return ms === undefined || ms < 0 ? { ms: 0, unparsable: text } : { ms };
}

/** How much longer an update waits: the delay less the time since this node first saw the OSC. */
export function delayLeft(delayMs: number, elapsedMs: number): number {
  return Math.max(0, delayMs - elapsedMs);
}

export type Hold = { ms: number; why: string; message: string };

/**
 * Whether the OSC waits before anything is asked of the cluster (a disruption slot, the serial lease):
 * for the rest of the reconciliation delay, or while this node lets the others go first after giving the
 * serial lease up. Undefined: go on.
 */
export function firstHold(gates: Gates, o: { delayLeftMs: number; coolOffLeftMs: number }): Hold | undefined {
  if (gates.delay && o.delayLeftMs > 0) return { ms: o.delayLeftMs, why: "reconciliation delay over", message: "holding the updated OSC back (reconciliation delay)" };
  if (gates.serial && o.coolOffLeftMs > 0) {
    return { ms: o.coolOffLeftMs, why: "serial lease cool-off over", message: "gave up the serial lease for this OSC: letting the waiting nodes go first" };
  }
  return undefined;
}

/**
 * A failing apply's hold on the serial lease, from the start of its first failing apply, measured as the
 * reconciliation delay is (src/host/boot-clock.ts): kept across agent restarts (src/api/serial-hold.ts),
 * so that an agent in a crash loop does not start a new hold at every start.
 */
export type SerialHold = NonNullable<SerialHoldState["hold"]>;
export type SerialGaveUp = NonNullable<SerialHoldState["gaveUp"]>;

/**
 * Whether a node whose apply failed (again) gives the serial lease up. It keeps it while within the
 * limit, so that a bad change stops at the first node; past it, the failure may be this node's own
 * (a broken disk, a full /var), and the pool's rollout must not wait for it forever.
 */
export function giveUpSerialLease(hold: SerialHold, now: BootClockReading, limitMs: number): boolean {
  return elapsedBetween(hold.since, now) >= limitMs;
}

/** The hold after another failed apply of `checksum` that started at `started`: the same hold, or a new one for a new OSC. */
export function holdAfterFailure(hold: SerialHold | undefined, checksum: string, started: BootClockReading, error: string): SerialHold {
  return hold?.checksum === checksum ? { ...hold, failures: hold.failures + 1, lastError: error } : { checksum, since: started, failures: 1, lastError: error };
}

/**
 * After giving the lease up for `checksum`, a node waits this long before asking for it again, so that the
 * nodes waiting for their turn (they ask every few seconds) take it first.
 */
export function serialCoolOffLeft(gaveUp: SerialGaveUp | undefined, checksum: string, now: BootClockReading, coolOffMs: number): number {
  return gaveUp?.checksum === checksum ? Math.max(0, coolOffMs - elapsedBetween(gaveUp.at, now)) : 0;
}
