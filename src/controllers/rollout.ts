// The node's side of a fleet rollout (settings: src/api/rollout.ts). Owns the rollout state file, the
// disruption slot this node holds (renewed while held, for whatever reasons hold it: an OSC change, a
// requested restart), the health gate after a disruptive change, and how the node reports all of it: the
// Node condition OperatingSystemConfigRollout, events, the status board.
//
// The OSC controller asks `admit` before applying an update: a paused node, a node outside the canary
// selector, a disruptive change outside every maintenance window or without a free slot waits (and says
// why); anything else goes. Before a disruptive apply it records the gate (`gated`: the change may
// restart the agent itself), and once the apply is complete calls `tick` until the gate passes (the slot
// is given back) or fails (the slot stays taken and the failed OSC is recorded on it, so no other node
// takes it; with rollback the OSC controller applies the last good OSC and its gate runs instead).
import { CoreV1Api, type V1Node } from "@kubernetes/client-node";
import { formatDuration } from "../api/duration.ts";
import { effectiveChecksumAnnotation } from "../api/layers.ts";
import { pausedLabel, poolLabel, type RolloutSettings, slotCount } from "../api/rollout.ts";
import { emptyRolloutState, lastGoodOscPath, type RolloutState, RolloutStateSchema, rolloutStatePath } from "../api/rollout-state.ts";
import { matches } from "../api/selector.ts";
import { nextOpening, openWindow } from "../api/windows.ts";
import { jsonStore } from "../host/json-store.ts";
import { apiClient, type Kube } from "../kube/client.ts";
import { explainKubeError } from "../kube/errors.ts";
import { nodeRef } from "../kube/events.ts";
import { patchNodeConditionIfChanged } from "../kube/node.ts";
import { createSlots, type SlotHolder, type Slots } from "../kube/slots.ts";
import { describeError } from "../log.ts";
import { checkHealth, gateRun, type GateTick } from "./health-gate.ts";
import { sinceBootMs } from "../host/boot-clock.ts";
import type { OscWorkDeps } from "./types.ts";
import { monotonicMs } from "../time.ts";

export const rolloutConditionType = "OperatingSystemConfigRollout";
/** The annotation the OSC controller sets on the Node: which OSC is applied there. */
const appliedChecksumAnnotation = "checksum/cloud-config-data";

export type RolloutDeps = OscWorkDeps & {
  stuckThresholdMs: number;
  /** How often a held slot is renewed (its Lease lasts 4 times as long). */
  renewEveryMs?: number;
  /** The wall clock: timestamps for people and maintenance windows. */
  now?: () => number;
  /** Monotonic ms. */
  clock?: () => number;
};

/** A refusal says how long to wait before asking again (a duration: each caller times it on its own monotonic clock). */
export type Admission = { go: true } | { go: false; reason: string; message: string; retryAfterMs: number };
export type PoolContext = { secretUid: string; checksum: string; settings: RolloutSettings };
/** osc.yaml's checksum (Gardener's, on the Node) and that of what the node applies (overlays included). */
export type Checksums = { base: string; checksum: string };

export type Rollout = {
  state(): Promise<RolloutState>;
  /** Whether `checksum` may be applied now; takes a slot for a disruptive change. */
  admit(o: PoolContext & { disrupted: string[] }): Promise<Admission>;
  /**
   * A disruptive change is about to be applied: its gate is recorded first (the change may restart the
   * agent itself) and runs once the apply is complete.
   */
  gated(checksum: string, units: string[], rolledBack?: boolean): Promise<void>;
  /** One look of the running gate (undefined: none runs). */
  tick(settings: RolloutSettings): Promise<GateTick | undefined>;
  /** The gate passed: the slot goes back, the gated OSC is the node's last good one (`osc` its bytes). */
  passed(ids: Checksums, osc: Uint8Array): Promise<void>;
  /** The gate failed: the slot stays; `rollingBack` when the last good OSC is applied next. */
  failed(check: string, rollingBack: boolean): Promise<void>;
  /** The last good OSC's bytes, if there is one other than `checksum`. */
  lastGood(except: string): Promise<{ checksum: string; base: string; osc: Uint8Array } | undefined>;
  /** A non-disruptive change applied outside any gate: it is the last good OSC now. */
  applied(ids: Checksums, osc: Uint8Array): Promise<void>;
  /** Takes / gives back the slot for a reason other than an OSC change (a requested restart). */
  takeSlot(reason: string, o: PoolContext): Promise<Admission>;
  releaseSlot(reason: string): Promise<void>;
  /** The OSC controller's latest view of the pool's Secret: what other controllers take slots under. */
  observe(o: PoolContext): void;
  current(): PoolContext | undefined;
  /** Runs a health gate for `units` restarted outside an OSC change until it passes or fails (its verdict). */
  gateUntilDone(units: string[], settings: RolloutSettings, signal: AbortSignal): Promise<{ passed: true } | { passed: false; check: string }>;
  stop(): Promise<void>;
};

/**
 * Whether a slot whose holder stopped renewing may be taken over: its Node is gone, or it is Ready with
 * the OSC it took the slot for applied. A holder that died during its change keeps its slot.
 */
export async function safeToReclaim(kube: Kube, h: SlotHolder): Promise<boolean> {
  let holder: V1Node;
  try {
    holder = await apiClient(kube, CoreV1Api).readNode({ name: h.node });
  } catch (err) {
    const e = explainKubeError(err, { server: kube.server, caSource: kube.caSource, what: `reading Node ${h.node}, which holds slot ${h.slot}` });
    if (e.reason === "not-found") return true;
    throw e;
  }
  const ready = holder.status?.conditions?.find((c) => c.type === "Ready")?.status === "True";
  const applied = holder.metadata?.annotations?.[effectiveChecksumAnnotation] ?? holder.metadata?.annotations?.[appliedChecksumAnnotation];
  return ready && h.checksum !== "" && applied === h.checksum;
}

export function startRollout(deps: RolloutDeps): Rollout {
  const log = deps.log.with({ controller: "rollout" });
  const now = deps.now ?? Date.now;
  const clock = deps.clock ?? monotonicMs;
  const renewEveryMs = deps.renewEveryMs ?? 10_000;
  const core = apiClient(deps.kube, CoreV1Api);
  let cached: RolloutState | undefined;
  let gate: { checksum: string; tick: () => Promise<GateTick> } | undefined;
  let renewal: ReturnType<typeof setInterval> | undefined;
  let poolSize: { n: number; at: number } | undefined;
  const reported = new Set<string>();

  const store = jsonStore(deps.files, rolloutStatePath, RolloutStateSchema, emptyRolloutState);
  async function state(): Promise<RolloutState> {
    if (cached) return cached;
    cached = await store.read();
    if (cached.slot) keepRenewing(); // held before the agent restarted
    return cached;
  }
  async function save(next: RolloutState): Promise<void> {
    await store.write(next);
    cached = next;
    deps.status.set("rollout", {
      ok: next.gate?.phase !== "failed",
      summary: next.gate
        ? `${next.gate.phase} OSC ${next.gate.checksum.slice(0, 12)}${next.gate.failedCheck ? `: ${next.gate.failedCheck}` : ""}${next.slot ? ` (holding slot ${next.slot.name})` : ""}`
        : next.slot
          ? `holding slot ${next.slot.name} for ${next.slot.reasons.join(", ")}`
          : "no rollout in progress on this node",
      ...next,
    });
  }

  const nodeName = () => deps.node.current()?.metadata?.name;
  const slotsFor = (secretUid: string): Slots | undefined => {
    const name = nodeName();
    return name ? createSlots({ kube: deps.kube, secret: { name: deps.secretName, namespace: "kube-system", uid: secretUid }, identity: name, log, durationSeconds: Math.ceil((4 * renewEveryMs) / 1000) }) : undefined;
  };
  // The Secret as the OSC controller last saw it; its uid owns the slot Leases this node creates.
  let pool: PoolContext | undefined;
  const poolUid = () => pool?.secretUid ?? "";

  function keepRenewing(): void {
    if (renewal) return;
    renewal = setInterval(() => {
      void (async () => {
        const s = await state();
        if (!s.slot) return stopRenewing();
        const slots = slotsFor(poolUid());
        if (!slots) return;
        try {
          await slots.renew(s.slot.name, s.gate?.checksum);
        } catch (err) {
          const e = explainKubeError(err, { server: deps.kube.server, caSource: deps.kube.caSource, what: `renewing slot ${s.slot.name}` });
          if (e.reason !== "conflict") return log.warn("could not renew the disruption slot", { slot: s.slot.name, error: describeError(e) });
          // Freed by an operator (deleted) or taken over: this node no longer holds it.
          log.warn("the disruption slot is no longer this node's", { slot: s.slot.name, error: e.message });
          await save({ ...(await state()), slot: undefined });
          stopRenewing();
        }
      })().catch((err: unknown) => log.warn("slot renewal", { error: describeError(err) }));
    }, renewEveryMs);
  }
  function stopRenewing(): void {
    if (renewal) clearInterval(renewal);
    renewal = undefined;
  }

  async function report(type: "Normal" | "Warning", reason: string, message: string, once?: string): Promise<void> {
    const node = deps.node.current();
    if (!node) return;
    if (once) {
      if (reported.has(once)) return;
      reported.add(once);
    }
    await deps.events.record({ node: nodeRef(node), type, reason, message });
  }
  async function condition(status: "True" | "False", reason: string, message: string): Promise<void> {
    const node = deps.node.current();
    if (!node) return;
    await patchNodeConditionIfChanged(deps.kube, node, { type: rolloutConditionType, status, reason, message }).catch((err: unknown) =>
      log.warn("could not set the Node condition", { condition: rolloutConditionType, error: describeError(err) }),
    );
  }

  async function poolNodes(): Promise<number> {
    if (poolSize && clock() - poolSize.at < 60_000) return poolSize.n;
    const list = await core.listNode({ labelSelector: `${poolLabel}=${deps.secretName}` });
    poolSize = { n: Math.max(1, list.items.length), at: clock() };
    return poolSize.n;
  }

  const reclaimable = (h: SlotHolder) => safeToReclaim(deps.kube, h);

  async function takeSlot(reason: string, o: PoolContext): Promise<Admission> {
    const s = await state();
    if (s.slot) {
      if (!s.slot.reasons.includes(reason)) await save({ ...s, slot: { ...s.slot, reasons: [...s.slot.reasons, reason] } });
      return { go: true };
    }
    if (!o.settings.budget) return { go: true };
    const slots = slotsFor(o.secretUid);
    if (!slots) return { go: false, reason: "WaitingForNode", message: "the Node is not registered yet", retryAfterMs: 5_000 };
    const k = slotCount(o.settings.budget, await poolNodes(), `Secret kube-system/${deps.secretName}`);
    if (!k.ok) return { go: false, reason: "InvalidBudget", message: k.errors.join("; "), retryAfterMs: 60_000 };
    const decision = await slots.acquire(k.value, o.checksum, reclaimable);
    if (!decision.held && decision.stopped) {
      return {
        go: false,
        reason: "RolloutStopped",
        message: `OSC ${o.checksum.slice(0, 12)} failed its health gate on another node (${decision.stopped.failure}, recorded on ${decision.stopped.slot}): the rollout of this OSC is stopped; a new OSC (or deleting that Lease) goes on`,
        retryAfterMs: 60_000,
      };
    }
    if (!decision.held) {
      const holders = decision.holders.map((h) => `${h.node}${h.expired ? " (not renewing)" : ""}`).join(", ");
      // Jittered, so that waiting nodes do not all ask at the same instant.
      return { go: false, reason: "WaitingForSlot", message: `all ${k.value} disruption slot(s) are taken: ${holders}`, retryAfterMs: 3_000 + Math.random() * 4_000 };
    }
    await save({ ...s, slot: { name: decision.slot, reasons: [reason] } });
    keepRenewing();
    if (decision.reclaimedFrom) await report("Normal", "RolloutSlotReclaimed", `took over slot ${decision.slot} from ${decision.reclaimedFrom.node}, which stopped renewing it after its change had passed (or its Node is gone)`);
    await report("Normal", "RolloutSlotTaken", `took disruption slot ${decision.slot} of ${k.value} for ${reason}`);
    return { go: true };
  }

  async function releaseSlot(reason: string): Promise<void> {
    const s = await state();
    if (!s.slot) return;
    const reasons = s.slot.reasons.filter((r) => r !== reason);
    if (reasons.length > 0) return save({ ...s, slot: { ...s.slot, reasons } });
    const slots = slotsFor(poolUid());
    if (slots) await slots.release(s.slot.name);
    stopRenewing();
    await save({ ...s, slot: undefined });
  }

  async function admit(o: PoolContext & { disrupted: string[] }): Promise<Admission> {
    const node = deps.node.current();
    const labels = node?.metadata?.labels ?? {};
    const short = o.checksum.slice(0, 12);
    const wait = async (reason: string, message: string, retryAfterMs: number): Promise<Admission> => {
      await condition("False", reason, message);
      if (reason === "InvalidBudget") await report("Warning", "RolloutInvalidSetting", message, `${o.checksum}/${reason}`);
      else await report("Normal", "RolloutWaiting", message, `${o.checksum}/${reason}`);
      log.info("holding the OSC back", { checksum: o.checksum, reason, message });
      return { go: false, reason, message, retryAfterMs };
    };
    if (labels[pausedLabel] === "true") return wait("Paused", `OSC ${short} waits: this node is paused (label ${pausedLabel}=true)`, 60_000);
    if (o.settings.canary && !matches(o.settings.canary, labels)) {
      return wait("NotSelected", `OSC ${short} waits: this node does not match the canary selector "${o.settings.canary.text}"`, 60_000);
    }
    if (o.disrupted.length === 0) return { go: true };
    if (o.settings.windows) {
      const at = new Date(now());
      if (!openWindow(o.settings.windows, at)) {
        const next = nextOpening(o.settings.windows, at);
        const message = `OSC ${short} restarts ${o.disrupted.join(", ")} and waits for a maintenance window${next ? ` (next: ${next.toISOString()})` : ""}`;
        // The window is a wall-clock fact; the wait until it opens is re-checked at least every 15 minutes.
        return wait("OutsideMaintenanceWindow", message, Math.min((next?.getTime() ?? Number.POSITIVE_INFINITY) - at.getTime(), 15 * 60_000));
      }
    }
    const admitted = await takeSlot("osc", o);
    if (!admitted.go) return wait(admitted.reason, admitted.reason === "RolloutStopped" ? admitted.message : `OSC ${short} restarts ${o.disrupted.join(", ")} and waits: ${admitted.message}`, admitted.retryAfterMs);
    return admitted;
  }

  async function gated(checksum: string, units: string[], rolledBack = false): Promise<void> {
    const s = await state();
    const failedChecksum = rolledBack ? s.gate?.checksum : undefined;
    await save({ ...s, gate: { phase: rolledBack ? "rolled-back" : "gating", checksum: failedChecksum ?? checksum, units, appliedAt: new Date(now()).toISOString(), ...(rolledBack && s.gate?.failedCheck ? { failedCheck: s.gate.failedCheck } : {}) } });
    gate = undefined;
    await condition("False", "HealthGatePending", `applying OSC ${checksum.slice(0, 12)}, which restarts ${units.join(", ")}; then the node must stay healthy`);
  }

  async function tick(settings: RolloutSettings): Promise<GateTick | undefined> {
    const s = await state();
    const g = s.gate;
    if (!g || (g.phase !== "gating" && g.phase !== "rolled-back")) return undefined;
    if (!gate || gate.checksum !== `${g.phase}/${g.checksum}`) {
      gate = {
        checksum: `${g.phase}/${g.checksum}`,
        tick: gateRun({ settleMs: settings.settleMs, timeoutMs: settings.healthTimeoutMs, clock, look: lookAt(g.units, settings) }),
      };
    }
    const t = await gate.tick();
    if (t.result === "pending") await condition("False", "HealthGatePending", `OSC ${g.checksum.slice(0, 12)}${g.phase === "rolled-back" ? " rolled back" : ""}: waiting for the node to stay healthy for ${formatDuration(settings.settleMs)}${t.check ? `; now: ${t.check}` : ""}`);
    return t;
  }

  async function passed(ids: Checksums, osc: Uint8Array): Promise<void> {
    const s = await state();
    const g = s.gate;
    if (!g) return;
    gate = undefined;
    if (g.phase === "rolled-back") {
      await save({ ...s, gate: { ...g, phase: "blocked" } });
      await releaseSlot("osc");
      await condition("False", "RolledBack", `OSC ${g.checksum.slice(0, 12)} failed its health gate here (${g.failedCheck ?? "?"}); the node went back to its last good OSC, which passed; the slot is free again. A new OSC is applied as usual.`);
      await report("Normal", "RolloutRollbackHealthy", `the last good OSC passed its health gate again after OSC ${g.checksum.slice(0, 12)} failed; slot given back`);
      return;
    }
    await deps.files.writeAtomic(lastGoodOscPath, osc, 0o600);
    await save({ ...s, gate: undefined, lastGood: { checksum: g.checksum, base: ids.base, at: new Date(now()).toISOString() } });
    await releaseSlot("osc");
    await condition("True", "HealthGatePassed", `OSC ${g.checksum.slice(0, 12)} passed its health gate`);
    await report("Normal", "RolloutHealthGatePassed", `OSC ${g.checksum.slice(0, 12)}: the node stayed healthy after restarting ${g.units.join(", ")}; slot given back`);
  }

  async function failed(check: string, rollingBack: boolean): Promise<void> {
    const s = await state();
    const g = s.gate;
    if (!g) return;
    gate = undefined;
    const wasRollback = g.phase === "rolled-back";
    await save({ ...s, gate: { ...g, phase: rollingBack ? "gating" : "failed", failedCheck: wasRollback ? `${g.failedCheck ?? "?"}; after rolling back: ${check}` : check } });
    const slots = s.slot ? slotsFor(poolUid()) : undefined;
    if (s.slot && slots && !wasRollback) {
      await slots.markFailed(s.slot.name, g.checksum, `node ${nodeName()}: ${check}`).catch((err: unknown) => log.warn("could not record the failed change on the slot", { error: describeError(err) }));
    }
    const message = wasRollback
      ? `OSC ${g.checksum.slice(0, 12)} failed its health gate and so did the rollback to the last good OSC (${check}); the node keeps its disruption slot`
      : `OSC ${g.checksum.slice(0, 12)} failed its health gate: ${check}; ${rollingBack ? "rolling back to the last good OSC" : "the node keeps its disruption slot, so the rollout stops here"}`;
    await condition("False", "HealthGateFailed", message);
    await report("Warning", "RolloutHealthGateFailed", message);
  }

  async function lastGood(except: string): Promise<{ checksum: string; base: string; osc: Uint8Array } | undefined> {
    const s = await state();
    if (!s.lastGood || s.lastGood.checksum === except) return undefined;
    const osc = await deps.files.read(lastGoodOscPath);
    return osc ? { checksum: s.lastGood.checksum, base: s.lastGood.base ?? s.lastGood.checksum, osc } : undefined;
  }

  async function applied(ids: Checksums, osc: Uint8Array): Promise<void> {
    const { checksum } = ids;
    const s = await state();
    if (s.lastGood?.checksum === checksum && !s.gate) return;
    await deps.files.writeAtomic(lastGoodOscPath, osc, 0o600);
    await save({ ...s, gate: s.gate?.phase === "blocked" && s.gate.checksum !== checksum ? undefined : s.gate, lastGood: { checksum, base: ids.base, at: new Date(now()).toISOString() } });
    await condition("True", "Applied", `OSC ${checksum.slice(0, 12)} applied without disruption`);
  }

  const lookAt = (units: string[], settings: RolloutSettings) => () =>
    checkHealth(
      { node: () => deps.node.current(), unitStatus: (u) => deps.systemd.unitStatus(u), ownedUnits: async () => (await deps.store.read()).owned.units, stuckThresholdMs: deps.stuckThresholdMs, sinceBoot: sinceBootMs },
      settings,
      { units },
    );

  async function gateUntilDone(units: string[], settings: RolloutSettings, signal: AbortSignal): Promise<{ passed: true } | { passed: false; check: string }> {
    const tick = gateRun({ settleMs: settings.settleMs, timeoutMs: settings.healthTimeoutMs, clock, look: lookAt(units, settings) });
    for (;;) {
      if (signal.aborted) return { passed: false, check: "the agent is stopping" };
      const t = await tick();
      if (t.result === "passed") return { passed: true };
      if (t.result === "failed") return { passed: false, check: t.check };
      await new Promise((resolve) => setTimeout(resolve, 1000));
    }
  }

  return {
    state,
    admit,
    observe: (o) => {
      pool = o;
    },
    current: () => pool,
    gateUntilDone,
    gated,
    tick,
    passed,
    failed,
    lastGood,
    applied,
    takeSlot,
    releaseSlot,
    stop: async () => stopRenewing(),
  };
}
