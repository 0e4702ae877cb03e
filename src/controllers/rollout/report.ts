// How a node shows its rollout: the Node condition OperatingSystemConfigRollout, events (each kind once per
// piece of work), and the status board. Derived from the state machine's transitions, in one place.
import type { Logger } from "../../log.ts";
import { describeError } from "../../log.ts";
import { nodeRef } from "../../kube/events.ts";
import { patchNodeConditionIfChanged } from "../../kube/node.ts";
import type { Action, NodeRollout, Work } from "../../rollout/machine.ts";
import type { OscWorkDeps } from "../types.ts";

export const rolloutConditionType = "OperatingSystemConfigRollout";

const short = (c: string) => c.slice(0, 12);
const named = (w: Work) => (w.kind === "osc" ? `OSC ${short(w.checksum)}` : `${w.kind} ${w.revision}`);

export function createRolloutReporter(deps: Pick<OscWorkDeps, "node" | "events" | "kube" | "status"> & { log: Logger }) {
  // What was said already, per piece of work and kind of message: a node waiting an hour says so once.
  const said = new Set<string>();
  // Revisions the leader said failed elsewhere: a node still waiting for one (it asks again at every
  // reconcile) keeps saying that the rollout stopped, not that it waits for a slot.
  const stoppedRevisions = new Set<string>();

  async function event(type: "Normal" | "Warning", reason: string, message: string, once?: string): Promise<void> {
    const node = deps.node.current();
    if (!node) return;
    if (once) {
      if (said.has(once)) return;
      said.add(once);
    }
    await deps.events.record({ node: nodeRef(node), type, reason, message });
  }

  async function condition(status: "True" | "False", reason: string, message: string): Promise<void> {
    const node = deps.node.current();
    if (!node) return;
    await patchNodeConditionIfChanged(deps.kube, node, { type: rolloutConditionType, status, reason, message }).catch((err: unknown) =>
      deps.log.warn("could not set the Node condition", { condition: rolloutConditionType, error: describeError(err) }),
    );
  }

  function board(s: NodeRollout): void {
    const cur = s.current;
    deps.status.set("rollout", {
      ok: cur?.phase !== "failed" && !cur?.recordOwed,
      summary: cur ? `${cur.phase} ${named(cur.work)}${cur.check ? `: ${cur.check}` : ""}` : "no rollout in progress on this node",
      ...s,
    });
  }

  return {
    /** Says what a step changed. */
    async transition(before: NodeRollout, after: NodeRollout, action: Action): Promise<void> {
      board(after);
      const was = before.current;
      const cur = after.current;
      if (action.do === "hold") {
        const work = cur?.work ?? was?.work;
        if (action.reason === "WaitingForSlot" && work && stoppedRevisions.has(work.revision)) return;
        const key = `${work?.revision ?? "?"}/${action.reason}`;
        await condition("False", action.reason, action.message);
        if (action.reason !== "Blocked" && action.reason !== "HealthGateFailed") await event("Normal", "RolloutWaiting", action.message, key);
        return;
      }
      if (action.do === "released") {
        const w = action.passed;
        if (was?.rollbackTo || was?.phase === "failed") {
          await condition("False", "RolledBack", `${named(was.work)} failed its health gate here (${was.check ?? "?"}); the node is healthy again on OSC ${short(w.checksum)}; the slot is free. A new OSC is applied as usual.`);
          await event("Normal", "RolloutRollbackHealthy", `the node is healthy again after ${named(was.work)} failed; slot given back`);
        } else {
          await condition("True", "HealthGatePassed", `${named(w)} passed its health gate`);
          await event("Normal", "RolloutHealthGatePassed", `${named(w)}: the node stayed healthy after restarting ${[...w.disruption.units, ...w.disruption.paths].join(", ")}; slot given back`);
        }
        return;
      }
      if (!cur) return;
      if (was?.phase === "waiting" && cur.phase === "applying") {
        await event("Normal", "RolloutSlotTaken", `admitted to disrupt for ${named(cur.work)}`);
      }
      if (cur.phase === "applying" && was?.phase !== "applying") {
        await condition("False", "HealthGatePending", `applying ${named(cur.work)}, which restarts ${[...cur.work.disruption.units, ...cur.work.disruption.paths].join(", ")}; then the node must stay healthy`);
      }
      if (cur.recordOwed && !was?.recordOwed) {
        const message = `${named(cur.work)} failed its health gate: ${cur.check ?? "?"}; the failure stops the pool's rollout of this revision`;
        await condition("False", "HealthGateFailed", message);
        await event("Warning", "RolloutHealthGateFailed", message);
      }
      if (cur.phase === "rolling-back" && was?.phase !== "rolling-back") {
        await event("Warning", "RolloutRolledBack", `${named(cur.work)} failed its health gate: going back to the last good OSC ${short(cur.rollbackTo?.checksum ?? "")}`);
      }
      if (cur.phase === "failed" && was?.phase !== "failed") {
        const message = `${named(cur.work)} failed its health gate${cur.rollbackTo ? " and so did the rollback to the last good OSC" : ""} (${cur.check ?? "?"}); the node keeps its disruption slot until it is healthy again`;
        await condition("False", "HealthGateFailed", message);
        await event("Warning", "RolloutHealthGateFailed", message, `${cur.work.revision}/failed`);
      }
    },
    /** The leader's word that what this node waits for failed its gate elsewhere. */
    async stopped(work: Work, failure: string): Promise<void> {
      const message = `${named(work)} failed its health gate on another node (${failure}): the rollout of this OSC is stopped; a new OSC goes on`;
      stoppedRevisions.add(work.revision);
      await condition("False", "RolloutStopped", message);
      await event("Warning", "RolloutStopped", message, `${work.revision}/stopped`);
    },
  };
}
