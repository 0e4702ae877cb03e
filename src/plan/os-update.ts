// What the OS update of an in-place update does next on this node, as gardener-node-agent (v1.150,
// pkg/nodeagent/controller/operatingsystemconfig) decides it. Pure; src/controllers/os-update.ts does it.
//
// The OS extension's command usually restarts the machine (an A/B image: the new version is what boots
// next, the old one again if that boot fails), so the outcome is known only after the restart: the
// node runs the OSC's version (done), or it restarted without it (rolled back). gardener-node-agent
// remembers an attempt by the Node annotation updating-operating-system-version and never runs the
// command again for a version it failed (the command failed, or the machine rolled back): only an OSC
// with another version starts over. trellis does the same, and records the attempt on the node too
// (before the command runs, with the boot it runs in), which tells a restart of the machine from a
// restart of the agent: gardener-node-agent reads any restart of itself as one of the machine.
import { sameVersion } from "./in-place.ts";

/** trellis's record of an OS update command it started (kept in the in-place state, across restarts). */
export type OsUpdateAttempt = {
  /** The version the command updates to. */
  version: string;
  /** The boot of the machine the command ran in (src/host/boot-clock.ts, machineBoot). */
  boot: string;
  /** The command exited 0 (and the machine has not restarted since, or this record would be settled). */
  finished: boolean;
  /** Why it failed for good (the command failed, or the machine restarted without the version). */
  failed?: string | undefined;
};

export type OsUpdateDecision =
  /** The node runs the version the OSC asks for. */
  | { next: "done" }
  /** The command ran to its end; the machine has not restarted into the new version yet. */
  | { next: "wait"; why: string }
  /** Run the OS extension's command (again: `again` says why). */
  | { next: "run"; again?: string }
  /**
   * Failed for good for this version: not tried again until an OSC asks for another one. `told`: the Node
   * already says so (its update-failed-reason), nothing to patch.
   */
  | { next: "fail"; why: string; told: boolean };

export type OsUpdateInput = {
  /** The OSC's spec.inPlaceUpdates.operatingSystemVersion. */
  want: string;
  /** The node's version now (os-release), undefined if it names none. */
  have: string | undefined;
  /** The attempt trellis recorded, if any. */
  attempt: OsUpdateAttempt | undefined;
  /** This boot of the machine. */
  boot: string;
  /** The Node's updating-operating-system-version and update-failed-reason annotations. */
  node: { updating?: string | undefined; failedReason?: string | undefined };
};

/** gardener-node-agent's words for a machine that restarted without the new version. */
export const rolledBack = (want: string, have: string | undefined): string =>
  `OS update might have failed and rolled back to the previous version. Desired version: "${want}", Current version: "${have ?? "unknown"}"`;

const same = (a: string | undefined, b: string): boolean => a !== undefined && sameVersion(a, b) === true;

export function decideOsUpdate(o: OsUpdateInput): OsUpdateDecision {
  if (same(o.have, o.want)) return { next: "done" };
  if (o.attempt && same(o.attempt.version, o.want)) {
    if (o.attempt.failed !== undefined) return { next: "fail", why: o.attempt.failed, told: o.node.failedReason === o.attempt.failed };
    if (o.attempt.boot !== o.boot) return { next: "fail", why: rolledBack(o.want, o.have), told: false };
    if (o.attempt.finished) return { next: "wait", why: `the OS update to ${o.want} ran; the machine has not restarted into it yet` };
    // The agent stopped while the command ran, and the machine did not restart: the command was ended
    // with the agent's unit. It runs again, as an update tool must allow.
    return { next: "run", again: "the agent stopped while the OS update command ran, and the machine did not restart" };
  }
  // No record of trellis's (its state was lost, or gardener-node-agent made the attempt): the Node's.
  if (same(o.node.updating, o.want)) {
    return o.node.failedReason ? { next: "fail", why: o.node.failedReason, told: true } : { next: "fail", why: rolledBack(o.want, o.have), told: false };
  }
  return { next: "run" };
}
