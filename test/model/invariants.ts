// The invariants judged once the faults have stopped and the pool had its quiet time (I1 and I2 are
// judged as things happen, in truth.ts). All from the world's record, none from an agent's claims:
// I3 no slot held for ever by a node that is alive, healthy and idle: a holder for minutes that is alive,
//    healthy, reachable, not disrupted and whose last change is older than its settle time plus a minute;
// I4 once faults stop, every good change reaches every selected node: each alive, reachable, unpaused
//    machine runs the final revision (with its overlays) if that is good — unless the budget is used up
//    by machines that are still disrupted (a bad change that broke a node without rollback stops the
//    pool on purpose), or the protocol stopped the final revision (or work that would bring a machine a
//    change of the failed admission) on a failure that only the node that failed may settle without
//    risking I2, and that node cannot: its Node was deleted in its gate (a change that kills machines
//    looks just like that), or it is paused. An operator resumes those;
// I5 with rollback on, no node ends on an OSC that failed its gate: no alive machine that has a good OSC
//    to go back to runs a broken unit — one it settled on (healthy for the settle time: its gate), or its
//    first (a machine that joined while the OSC was bad, and never settled on a good one since, has none).
import { type Content, layer, revisionChecksum, sameContent } from "./osc-model.ts";
import { rolloutKey, type World } from "./world.ts";

/** How long a healthy, idle node may have held a slot before that counts as for ever (I3). */
export const heldForEverMs = 3 * 60_000;

export function endChecks(w: World, holdingSince: ReadonlyMap<string, number>): void {
  const final = w.revision();
  const rollback = final.annotations[rolloutKey("rollback")] === "true";
  const now = w.clock.mono;
  const settleMs = w.config.settleSeconds * 1000;
  const short = (c: string | undefined) => c?.slice(0, 8) ?? "nothing";
  const budgetUsedUp = w.truth.disruptions.size + w.deadHolders().length >= w.truth.kNow();

  for (const m of w.machines.values()) {
    if (!m.alive) continue;
    const desired = layer(final, w.labelsOf(m));
    const since = holdingSince.get(m.name);
    if (since !== undefined && now - since >= heldForEverMs && w.healthy(m) && m.reachable() && !w.truth.disrupted(m.name) && now - m.contentChangedAt >= settleMs + 60_000) {
      w.truth.violate("I3", `${m.name} has held a slot for ${((now - since) / 1000).toFixed(0)}s while alive, healthy and idle (it runs ${short(m.lastApplied)}, changed ${((now - m.contentChangedAt) / 1000).toFixed(0)}s ago)`);
    }
    if (!budgetUsedUp && !stoppedUnsettled(w, desired.content) && w.breakages.good(desired.content) && m.reachable() && !w.paused(m) && !sameContent(m.running, desired.content)) {
      w.truth.violate("I4", `${m.name} never got the good OSC r${final.id} (${short(desired.checksum)}) in the quiet time; it runs ${short(m.lastApplied)}`);
    }
    const broken = w.breakages.in(m.running);
    if (rollback && m.ranGood && broken.length > 0) {
      w.truth.violate("I5", `${m.name} ends on ${short(m.lastApplied)}, whose ${broken.map((b) => `${b.unit}@${b.version}`).join(", ")} is broken, although rollback is on`);
    }
  }
}

/**
 * Whether the protocol stopped the final revision (what `desired` a machine gets of it) on a failure that
 * only the node that failed may settle without risking a second disruption by a bad change (I2), and that
 * node cannot, as I4 says: the revision that failed, or one with any unit or file version it changed.
 */
function stoppedUnsettled(w: World, desired: Content): boolean {
  const stopped = w.driver.stopped?.(w.store, w.pool());
  if (!stopped) return false;
  const node = w.machines.get(stopped.node);
  if (!w.lostHolders.has(stopped.node) && !(node !== undefined && node.alive && w.paused(node))) return false;
  if (stopped.revision === revisionChecksum(w.revision())) return true;
  const has = new Set([...Object.entries(desired.units), ...Object.entries(desired.files)].map(([k, v]) => `${k}@${v}`));
  return (stopped.changes ?? []).some((piece) => piece.some((c) => has.has(c)));
}

/** Whether the pool has finished: nothing disrupted, no slot held, every reachable unpaused machine on the final revision if it is good (or stopped unsettled, as I4 allows). */
export function finished(w: World): boolean {
  if (w.truth.disruptions.size > 0 || w.driver.holders(w.store, w.pool()).length > 0) return false;
  const final = w.revision();
  for (const m of w.machines.values()) {
    if (!m.alive || !m.reachable() || w.paused(m)) continue;
    const desired = layer(final, w.labelsOf(m)).content;
    if (w.breakages.good(desired) && !sameContent(m.running, desired) && !stoppedUnsettled(w, desired)) return false;
  }
  return true;
}
