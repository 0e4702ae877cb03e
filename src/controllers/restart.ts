// Restarts on request: the Node annotation worker.gardener.cloud/restart-systemd-services: "a,b.service"
// (set by the control plane, e.g. after rotating a credential kubelet reads) restarts those units, one
// after the other, and is then removed. Gardener's semantics: ".service" is appended to a name without
// one; a failed restart is reported (event, log) and not retried, the others still restart; the
// agent's own unit restarts last, after the annotation is gone — else the new agent would find it
// again and restart itself forever.
//
// Each value is handled once: Node updates that still show it (kubelet's, or ours racing the watch)
// are ignored until the annotation disappears or changes.
//
// A request that restarts a disruptive unit (kubelet and containerd always) is work of the node's rollout
// (src/controllers/rollout): it waits, annotation and all, while the node is paused, outside the canary or
// every maintenance window, or (with a disruption budget) for a slot; then its units restart and the node's
// health gate runs, and the slot goes back once the node passed it. A node that does not pass keeps its
// slot until it is healthy again; a failed OSC elsewhere never stops a requested restart.
import type { V1Node } from "@kubernetes/client-node";
import type { Systemd } from "../host/systemd.ts";
import { coreV1 } from "../kube/api.ts";
import type { Kube } from "../kube/client.ts";
import { rethrow } from "../kube/errors.ts";
import { type EventRecorder, nodeRef } from "../kube/events.ts";
import { describeError, type Logger } from "../log.ts";
import type { Controller, NodeSource } from "./types.ts";
import { countsAsDisruptive } from "../plan/disruption.ts";
import { workRevision } from "../rollout/pool.ts";
import type { Rollout } from "./rollout/controller.ts";
import { later, singleFlight } from "../loops.ts";
import { sha256Hex } from "../api/desired.ts";
import { effectiveChecksumAnnotation } from "../api/layers.ts";

export const restartAnnotation = "worker.gardener.cloud/restart-systemd-services";
/** Gardener's event reason for a unit restart, so existing tooling finds these events too. */
export const restartEventReason = "SystemDUnitRestart";

export type RestartControllerDeps = {
  kube: Kube;
  systemd: Systemd;
  events: EventRecorder;
  nodes: NodeSource;
  log: Logger;
  /** The agent's own unit (gardener-node-agent.service). */
  selfUnit: string;
  /** Wait before trying again to remove the annotation after that failed (5 s). */
  retryMs?: number;
  /** Fleet rollouts: the admission a disruptive restart goes through (none: restarts at once). */
  rollout?: Rollout;
  /** How long a request waits for the OSC controller's first look at the pool's Secret before it asks again. */
  settingsRetryMs?: number;
};

const unitSuffixes = [".service", ".socket", ".target", ".timer", ".path", ".mount", ".automount", ".swap", ".slice", ".scope", ".device"];

/** The units an annotation value asks for, in its order, each once; a name without a unit suffix is a service. */
export function requestedUnits(value: string): string[] {
  const names = value
    .split(",")
    .map((n) => n.trim())
    .filter((n) => n !== "")
    .map((n) => (unitSuffixes.some((s) => n.endsWith(s)) ? n : `${n}.service`));
  return [...new Set(names)];
}

type Request = {
  value: string;
  node: { name: string; uid: string };
  restartSelf: boolean;
  removed: boolean;
  /** Failed attempts to remove the annotation, for the backoff. */
  failures: number;
};

export function startRestartController(deps: RestartControllerDeps): Controller {
  const log = deps.log.with({ controller: "restart" });
  const core = coreV1(deps.kube);
  const retryMs = deps.retryMs ?? 5_000;
  let handled: Request | undefined; // the value whose restarts ran, until the annotation disappears
  let latest: V1Node | undefined;
  // One pending retry: of the admission, or of the annotation's removal.
  const retry = later(() => trigger());
  let stopped = false;

  // Each pass works on the latest Node.
  const passes = singleFlight(async () => {
    if (latest) await reconcile(latest);
  });
  const trigger = () => passes.trigger("node changed");

  async function reconcile(node: V1Node): Promise<void> {
    const value = node.metadata?.annotations?.[restartAnnotation];
    if (value === undefined) {
      handled = undefined;
      return;
    }
    if (value !== handled?.value) {
      // Asked again at once on a Node change (unpaused, relabelled) or the rollout's word (a grant): not only
      // when the retry is due, which may be a minute away while a granted slot would sit idle.
      retry.cancel();
      const units = requestedUnits(value);
      const admission = await admit(node, value, units);
      if (admission === "wait") return;
      handled = { value, node: nodeRef(node), restartSelf: false, removed: false, failures: 0 };
      if (admission.ranAlready) {
        // Restarted before this agent stopped, and gated since: only the annotation is left to remove.
        await removeAnnotation(handled);
        return;
      }
      log.info("restarting units on request", { annotation: restartAnnotation, units });
      const failed: string[] = [];
      for (const unit of units) {
        if (unit === deps.selfUnit) handled.restartSelf = true;
        else if (!(await restart(handled, unit))) failed.push(unit);
      }
      // The gate runs in the rollout controller from here; the slot goes back once the node passed it.
      if (admission.admitted !== undefined) await deps.rollout?.applied({ complete: failed.length === 0, checksum: admission.admitted, ...(failed.length ? { error: `restarting ${failed.join(", ")} failed` } : {}) });
      await removeAnnotation(handled);
      return;
    } else if (handled.removed || retry.pending()) {
      return; // done, or the removal is waiting for its retry
    }
    await removeAnnotation(handled);
  }

  /**
   * Whether the restart of `units` may go now: at once (nothing disruptive, or no rollout), admitted under
   * the node's rollout (`admitted`: the work's checksum, its gate to follow), done already (`ranAlready`), or
   * "wait" (asked again later).
   */
  async function admit(node: V1Node, value: string, units: string[]): Promise<{ admitted?: string; ranAlready?: true } | "wait"> {
    const rollout = deps.rollout;
    if (!rollout) return {};
    const pool = rollout.current();
    // Before the OSC controller has read the pool's Secret its settings are unknown: wait, never bypass them.
    if (!pool) return askAgain(deps.settingsRetryMs ?? 1000, "the rollout settings are not read yet");
    const disruptive = units.filter((u) => u !== deps.selfUnit && countsAsDisruptive(u, pool.settings.disruptiveUnits));
    if (disruptive.length === 0) return {};
    // One piece of work at a time per node: an OSC change under way there goes first (offering the restart
    // now would take its place in the pool's queue, and it would take the restart's back). Not one the pool
    // stopped (it failed its gate elsewhere): that one waits in vain, and the restart would wait with it.
    const busy = (await rollout.state()).current;
    const stoppedOnPool = busy?.phase === "waiting" && rollout.stopped(busy.work.revision);
    if (busy && busy.work.kind !== "restart" && !stoppedOnPool) return askAgain(5_000, `the node's rollout is busy with ${busy.work.kind} work (${busy.phase})`);
    const a = node.metadata?.annotations ?? {};
    const applied = a[effectiveChecksumAnnotation] ?? a["checksum/cloud-config-data"] ?? "";
    const decision = await rollout.offer({
      kind: "restart",
      revision: workRevision("restart", node.metadata?.name ?? "", sha256Hex(value).slice(0, 16)),
      checksum: applied,
      base: a["checksum/cloud-config-data"] ?? "",
      disruption: { units: disruptive, paths: [] },
    });
    if (decision.do === "hold") {
      log.info("the requested restart waits", { units: disruptive, reason: decision.reason, message: decision.message });
      return askAgain(decision.retryAfterMs, decision.reason);
    }
    // "wait": this very request is past its restarts and in its gate (the agent stopped before removing the
    // annotation): not again.
    return decision.do === "apply" ? { admitted: applied } : { ranAlready: true };
  }

  function askAgain(ms: number, why: string): "wait" {
    retry.in(Math.max(1000, ms));
    log.debug("the requested restart asks again later", { why, inMs: ms });
    return "wait";
  }

  /** Whether the unit restarted. */
  async function restart(request: Request, unit: string): Promise<boolean> {
    try {
      await deps.systemd.restart(unit);
      log.info("restarted unit on request", { unit });
      await deps.events.record({ node: request.node, type: "Normal", reason: restartEventReason, message: `Restarted ${unit} as requested by the annotation ${restartAnnotation}` });
      return true;
    } catch (err) {
      const error = describeError(err);
      log.error("could not restart unit on request", { unit, error });
      await deps.events.record({ node: request.node, type: "Warning", reason: restartEventReason, message: `Restarting ${unit} as requested by the annotation ${restartAnnotation} failed: ${error}` });
      return false;
    }
  }

  // A JSON patch that removes the annotation only while it still holds this request's value: a merge
  // patch would also delete a new request the control plane set while the units were restarting.
  // When the value changed the patch fails, and the Node update with the new value is the next request.
  async function removeAnnotation(request: Request): Promise<void> {
    const path = `/metadata/annotations/${restartAnnotation.replaceAll("~", "~0").replaceAll("/", "~1")}`;
    try {
      await core
        .patchNode(
          { name: request.node.name, body: [{ op: "test", path, value: request.value }, { op: "remove", path }] },
          "json",
        )
        .catch(rethrow(deps.kube, `removing the annotation ${restartAnnotation} from Node ${request.node.name}`));
    } catch (err) {
      // Removed, replaced, or the Node deleted meanwhile: nothing is left to remove for this request.
      if (deps.nodes.current()?.metadata?.annotations?.[restartAnnotation] !== request.value) return;
      const delayMs = Math.min(retryMs * 2 ** request.failures++, 5 * 60_000);
      log.warn("could not remove the restart annotation; trying again", { error: describeError(err), delayMs });
      retry.in(delayMs);
      return;
    }
    request.removed = true;
    log.info("removed the restart annotation", { annotation: restartAnnotation, value: request.value });
    // A stopping agent goes away anyway, and an operator's `systemctl stop` is not undone.
    if (request.restartSelf && !stopped) await restartSelf(request);
  }

  // Not awaited by stop(): systemd stops this very process to restart it, so the job finishes only
  // after the process has exited. The event is recorded first, while there is still time.
  async function restartSelf(request: Request): Promise<void> {
    log.info("restarting the agent's own unit last, on request", { unit: deps.selfUnit });
    await deps.events.record({ node: request.node, type: "Normal", reason: restartEventReason, message: `Restarting ${deps.selfUnit} (the agent itself) as requested by the annotation ${restartAnnotation}` });
    void deps.systemd.queueRestart(deps.selfUnit).catch(async (err: unknown) => {
      if (stopped) return; // the restart is under way, and it stopped us: its connection closed
      const error = describeError(err);
      log.error("could not restart the agent's own unit", { unit: deps.selfUnit, error });
      await deps.events.record({ node: request.node, type: "Warning", reason: restartEventReason, message: `Restarting ${deps.selfUnit} (the agent itself) failed: ${error}` });
    });
  }

  const onNode = (node: V1Node) => {
    latest = node;
    trigger();
  };
  const unsubscribe = deps.nodes.subscribe(onNode);
  const unwatchRollout = deps.rollout?.onChange(trigger);
  const first = deps.nodes.current();
  if (first) onNode(first);

  return {
    stop: async () => {
      stopped = true;
      const finished = passes.stop();
      unsubscribe();
      unwatchRollout?.();
      retry.cancel();
      await finished;
    },
  };
}
