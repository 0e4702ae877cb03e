// The OperatingSystemConfig controller: watches the OSC Secret (by name only) and the agent's Node,
// and reconciles the node to the OSC — on every change, every syncPeriod (drift repair), and on retry
// after a failure. Level-triggered and single-flight (src/loops.ts): each reconcile reads the latest
// Secret, never the event that woke it, and a trigger during a reconcile runs one more afterwards.
//
// Rollout controls from the control plane: the Node annotation reconciliation-delay holds an updated
// OSC back for that long after it was first seen, and a Secret annotated serial applies one node at a
// time through a Lease. A node whose apply fails keeps the serial lease, so a bad change stops there
// instead of rolling on to the next node, up to a hold limit: past it the failure may be the node's own,
// and the lease goes to the next node (a Warning and trellis_serial_lease_given_up_total say so). Which
// gates an OSC passes on this node is decided in src/controllers/osc-gates.ts. trellis's own fleet
// rollouts (rollout.trellis.dev/ settings, src/controllers/rollout.ts) hold an update back on a paused
// node, outside the canary, outside the maintenance windows or without a free disruption slot, and gate
// a disruptive change on the node's health afterwards, rolling back if the Secret asks for it.
import type { V1Node, V1Secret } from "@kubernetes/client-node";
import { decodeBase64 } from "../api/base64.ts";
import { type Desired, oscChecksum, parseOscBytes, secretRefsOf } from "../api/desired.ts";
import { oscDataKey, paths } from "../api/paths.ts";
import { type DelayStart, DelayStartSchema, delayStartPath } from "../api/delay-start.ts";
import { type ApplyOutcome, applyDesired, summaryOf } from "../apply/apply.ts";
import { desiredForNode } from "../apply/desired-for-node.ts";
import { createOscParser } from "./osc-parse.ts";
import { checkSelfUpdate } from "../apply/self-update.ts";
import { jsonStore } from "../host/json-store.ts";
import { type BootClockReading, elapsedBetween, readBootClock } from "../host/boot-clock.ts";
import type { ImageStore } from "../host/registry/store.ts";
import { nodeRef } from "../kube/events.ts";
import { patchNodeConditionIfChanged, patchNodeMetadata } from "../kube/node.ts";
import { createSerialGate, isSerialRollout, type SerialGate } from "../kube/serial-gate.ts";
import { watchSecretRefs } from "../kube/secret-refs.ts";
import { watchObjects } from "../kube/watch.ts";
import type { OscWorkDeps } from "./types.ts";
import { delayLeft, firstHold, gatesFor, giveUpSerialLease, holdAfterFailure, parseDelay, type SerialHold, serialCoolOffLeft } from "./osc-gates.ts";
import { type SerialHoldState, SerialHoldStateSchema, serialHoldPath } from "../api/serial-hold.ts";
import { backoffDelay, monotonicMs } from "../time.ts";
import { singleFlight } from "../loops.ts";
import { formatDuration, formatElapsed } from "../api/duration.ts";
import { describeError } from "../log.ts";
import type { Registry } from "../metrics.ts";
import { describeStep } from "../plan/render.ts";
import type { Plan, Step } from "../api/plan.ts";
import { parseRolloutSettings, poolLabel, type RolloutSettings } from "../api/rollout.ts";
import { planForNode } from "../apply/observe.ts";
import { disruptionOf } from "../plan/disruption.ts";
import type { Rollout } from "./rollout/controller.ts";
import type { Work } from "../rollout/machine.ts";
import type { Progress } from "../api/state.ts";
import { lastGoodOscPath } from "../api/rollout-state.ts";
import { effectiveChecksumAnnotation, type Layered, layeredChecksum, layerOsc, parseOverlays } from "../api/layers.ts";
import type { OperatingSystemConfig } from "../api/osc.ts";
import type { Result } from "../api/result.ts";
import { stringify } from "yaml";
import * as v from "valibot";
import { createInPlaceUpdater, type InPlaceUpdaterDeps, type OsUpdate, readyForUpdate } from "./in-place.ts";
import { hasInPlaceChanges } from "../plan/in-place.ts";
import type { InPlaceChanges } from "../api/in-place-state.ts";

const cpuMsSince = (from: ReturnType<typeof process.cpuUsage>) => {
  const d = process.cpuUsage(from);
  return Math.round((d.user + d.system) / 1000);
};

export const annotations = {
  appliedChecksum: "checksum/cloud-config-data",
  reconciliationDelay: "node-agent.gardener.cloud/reconciliation-delay",
} as const;
export const labels = {
  kubernetesVersion: "worker.gardener.cloud/kubernetes-version",
  worker: "node-role.kubernetes.io/worker",
  controlPlane: "node-role.kubernetes.io/control-plane",
  zone: "topology.kubernetes.io/zone",
} as const;
/** trellis's own Node condition: whether the current OSC is applied, and if not, why. */
export const conditionType = "OperatingSystemConfigApplied";
const apiServerManifest = "/etc/kubernetes/manifests/kube-apiserver.yaml";

export type OscControllerDeps = OscWorkDeps & {
  metrics: Registry;
  kubernetesVersion: string;
  syncPeriodMs: number;
  hostName: string;
  selfUnit: string;
  /** Node path of the agent's own binary, and its --config-dir: an OSC replacing the binary is checked first. */
  selfBinary: string;
  configDir: string;
  images: ImageStore;
  /** Fleet rollouts: budget, health gate, windows, selection (src/controllers/rollout.ts). */
  rollout: Rollout;
  /** The monotonic clock every wait and duration is measured by. */
  clock?: () => number;
  /** What the reconciliation delay is measured by, across agent restarts and reboots. */
  bootClock?: () => BootClockReading;
  /** What in-place updates need besides (src/controllers/in-place.ts). */
  tokens: InPlaceUpdaterDeps["tokens"];
  certificate: InPlaceUpdaterDeps["certificate"];
  apiServer: InPlaceUpdaterDeps["apiServer"];
};

type OscControllerStatus = {
  synced: boolean;
  lastChecksum?: string;
  /** held: a rollout holds the OSC back on this node (paused, canary, window, slot, health gate). */
  lastResult?: "applied" | "failed" | "invalid" | "waiting" | "held";
  lastError?: string;
  reconciles: number;
};

export type OscController = {
  /** Resolves once the Secret's first LIST has been delivered. */
  synced: Promise<void>;
  /** Resolves once the first reconcile ended, whatever its result (the agent tells systemd it is ready). */
  firstReconcile: Promise<void>;
  /**
   * Runs `fn` between reconciles, never during one; `reconcile` runs one there and says whether the
   * OSC is applied after it.
   */
  between<T>(fn: (reconcile: (why: string) => Promise<boolean>) => Promise<T>): Promise<T>;
  /** Calls `listener` after every reconcile with the steps it executed (what trellis owns may have changed); returns an unsubscribe. */
  onReconciled(listener: (executed: readonly Step[]) => void): () => void;
  stop(): Promise<void>;
};

/** osc.yaml's checksum (Gardener's, on the Node) and that of what the node applies (overlays included). */
type Checksums = { base: string; checksum: string };

/** The steps of an unfinished apply not done yet. */
const remaining = (progress: Progress | undefined): Plan | undefined => progress && { ...progress.plan, steps: progress.plan.steps.filter((_, i) => !progress.done.includes(i)) };

/**
 * What an apply of `checksum` will do: the plan just made (with the restarts an unfinished apply of an older
 * OSC still owes, which the apply carries over), or what is left of this OSC's unfinished apply.
 */
function toWeigh(planned: Plan | undefined, progress: Progress | undefined, checksum: string): Plan | undefined {
  if (!planned) return remaining(progress);
  const owed = progress && progress.checksum !== checksum ? (remaining(progress)?.steps ?? []) : [];
  return { ...planned, steps: [...planned.steps, ...owed] };
}

/** When to reconcile again, on the monotonic clock. */
type Wait = { atMs: number; why: string };

/** A registry mirror waiting for its readiness probe is probed again this often. */
const registryProbeRetryMs = 10_000;

export function startOscController(deps: OscControllerDeps): OscController {
  const log = deps.log.with({ controller: "osc" });
  const now = deps.clock ?? monotonicMs;
  const bootClock = deps.bootClock ?? readBootClock;
  const delayStarts = jsonStore(deps.files, delayStartPath, v.optional(DelayStartSchema), () => undefined);
  let secret: V1Secret | undefined;
  // What this agent noted about the OSC it sees now: which problems it reported already. Replaced when
  // the OSC changes, so nothing piles up over months.
  let seen: { checksum: string; reported: Set<string> } | undefined;
  const note = (checksum: string) => (seen?.checksum === checksum ? seen : (seen = { checksum, reported: new Set() }));
  // When this node first saw the OSC, for the reconciliation delay (persisted: a restart does not restart the wait).
  let firstSeen: DelayStart | undefined;
  // The serial lease while an apply under it keeps failing, and the OSC this node gave the lease up for:
  // persisted (a crash loop must not start them over), read once, then kept here too.
  const serialHolds = jsonStore(deps.files, serialHoldPath, SerialHoldStateSchema, (): SerialHoldState => ({ version: 1 }));
  let serial: SerialHoldState | undefined;
  const serialState = async (): Promise<SerialHoldState> =>
    (serial ??= await serialHolds.read().catch((err: unknown) => {
      log.warn("could not read the serial lease's hold; starting it over", { path: serialHoldPath, error: describeError(err) });
      return { version: 1 as const };
    }));
  const saveSerial = async (next: SerialHoldState) => {
    serial = next;
    await serialHolds.write(next);
  };
  let failures = 0;
  let stopped = false;
  // A long image download must not hold up the agent's shutdown.
  const stopping = new AbortController();
  let leftoverLeaseChecked = false;
  const inPlace = createInPlaceUpdater({ ...deps, log, signal: stopping.signal });
  const status: OscControllerStatus = { synced: false, reconciles: 0 };

  const reconciledListeners = new Set<(executed: readonly Step[]) => void>();
  // What the current reconcile's apply did, for the listeners.
  let executed: readonly Step[] = [];
  let timer: ReturnType<typeof setTimeout> | undefined;
  let reconciled: () => void = () => {};
  const firstReconcile = new Promise<void>((done) => (reconciled = done));
  const reconcileOnce = async (why: string): Promise<void> => {
    const started = now();
    executed = [];
    const wait = await reconcile(why).catch(async (err: unknown) => {
      const error = describeError(err);
      status.lastResult = "failed";
      status.lastError = error;
      log.error("reconcile failed", { error });
      const current = deps.node.current();
      if (current) await deps.events.record({ node: nodeRef(current), type: "Warning", reason: "OSCReconcileError", message: error });
      return retryWait("reconcile error");
    });
    duration.observe((now() - started) / 1000);
    reconciles.inc({ result: status.lastResult ?? "error" });
    report();
    reconciled();
    schedule(wait);
    for (const listener of reconciledListeners) listener(executed);
  };
  const passes = singleFlight(reconcileOnce);
  const trigger = passes.trigger;
  // The drift check compares the node with what the last apply recorded: during an apply the two
  // differ by design, so it runs only between reconciles, as a pass of the same single flight.
  const between = <T>(fn: (reconcile: (why: string) => Promise<boolean>) => Promise<T>): Promise<T> =>
    passes.exclusive(() =>
      fn(async (why) => {
        await reconcileOnce(why);
        return status.lastResult === "applied";
      }),
    );
  const schedule = (wait: Wait) => {
    if (timer) clearTimeout(timer);
    if (stopped) return;
    timer = setTimeout(() => trigger(wait.why), Math.max(0, wait.atMs - now()));
  };
  const report = () => {
    const checksum = status.lastChecksum?.slice(0, 12) ?? "none";
    const summary =
      status.lastResult === "applied"
        ? `OSC ${checksum} applied`
        : status.lastResult === "waiting"
          ? `waiting for Secret kube-system/${deps.secretName}`
          : status.lastResult === "held"
            ? `OSC ${checksum} held back: ${status.lastError ?? ""}`
            : `OSC ${checksum} ${status.lastResult ?? "not reconciled yet"}: ${status.lastError ?? ""}`;
    deps.status.set("osc", { ok: status.synced && (status.lastResult === "applied" || status.lastResult === "held"), summary, ...status });
  };
  const periodic = (): Wait => ({ atMs: now() + deps.syncPeriodMs, why: "periodic re-check" });
  const retryWait = (why: string): Wait => {
    failures++;
    // 1 s doubling per failure in a row, up to 256 s; not jittered: one node's retries concern no other.
    const ms = backoffDelay(failures, { initialMs: 1000, maxMs: 256_000 }, 1);
    return { atMs: now() + ms, why: `retry after ${why}` };
  };

  const reconciles = deps.metrics.counter("trellis_reconcile_total", "OSC reconciles by result (applied, failed, invalid, waiting, error).");
  const duration = deps.metrics.histogram("trellis_reconcile_duration_seconds", "Time of one OSC reconcile.", [0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60]);
  const restarts = deps.metrics.counter("trellis_unit_restarts_total", "Units restarted by OSC applies, by unit.");
  const serialGivenUp = deps.metrics.counter("trellis_serial_lease_given_up_total", "Serial leases this node gave up after its apply kept failing past the hold limit.");
  let appliedChecksum: string | undefined;
  deps.metrics.collect("trellis_applied_osc_info", "1, labelled with the checksum of the OSC last applied completely.", () =>
    appliedChecksum ? [{ labels: { checksum: appliedChecksum }, value: 1 }] : [],
  );

  const secretWatch = watchObjects<V1Secret>({
    kube: deps.kube,
    path: "/api/v1/namespaces/kube-system/secrets",
    fieldSelector: `metadata.name=${deps.secretName}`,
    log,
    onEvent: (e) => {
      secret = e.type === "DELETED" ? undefined : e.object;
      // When this node learnt of a change, before any work on it: with the "OSC applied" line after it,
      // where a slow rollout spent its time on this node (delivery or the node's own work).
      log.info("OSC Secret changed", { event: e.type.toLowerCase(), resourceVersion: e.object.metadata?.resourceVersion });
      trigger(`secret ${e.type.toLowerCase()}`);
    },
  });
  deps.metrics.collect("trellis_watch_restarts_total", "Watches of the OSC Secret resumed or restarted (reconnects and relists).", () => {
    const st = secretWatch.stats();
    return [{ labels: { watch: "osc-secret" }, value: st.restarts + st.gone + st.errors }];
  }, "counter");
  // The Secrets its secretRef files name: read from their watches, and a change to one is applied at once.
  const secretRefs = watchSecretRefs({ kube: deps.kube, log, onChange: (name) => trigger(`secret ${name} (secretRef) changed`) });
  const readSecret = (name: string) => secretRefs.read(name);
  const synced = secretWatch.synced.then(() => {
    status.synced = true;
    // No Secret in the first list: one reconcile says so (waiting), and it counts as the first one.
    if (!secret) trigger("no OSC Secret yet");
  });
  // Rejected only when the agent stops before the first list arrived (the API server unreachable):
  // whoever awaits `synced` sees that, but the stop itself must not end in an unhandled rejection.
  synced.catch(() => undefined);

  // Kubelet updates the Node all the time: only the rollout annotation concerns this controller, and
  // the labels when the Secret has overlays (they pick by label).
  let delayAnnotation = deps.node.current()?.metadata?.annotations?.[annotations.reconciliationDelay];
  let layeredSecret = false;
  let labelsSeen = JSON.stringify(deps.node.current()?.metadata?.labels ?? {});
  let drained = readyForUpdate(deps.node.current());
  const unsubscribe = deps.node.subscribe((n) => {
    if (readyForUpdate(n) !== drained) {
      drained = !drained;
      trigger("in-place update condition changed");
    }
    const value = n.metadata?.annotations?.[annotations.reconciliationDelay];
    const labelsNow = JSON.stringify(n.metadata?.labels ?? {});
    const labelsChanged = labelsNow !== labelsSeen;
    labelsSeen = labelsNow;
    if (layeredSecret && labelsChanged) trigger("node labels changed (the Secret has overlays)");
    if (value === delayAnnotation) return;
    delayAnnotation = value;
    trigger("reconciliation delay changed");
  });
  // The rollout asks for a reconcile when its answer changed: a slot was granted, a gate failed and the node rolls back.
  const unsubscribeRollout = deps.rollout.onChange(() => trigger("rollout decision changed"));
  // A node that applied before kubelet registered it reports once the Node exists.
  void deps.node.found.then(() => trigger("node found"));

  const oscParser = createOscParser({ files: deps.files, path: paths.parsedOsc, log });

  async function reconcile(why: string): Promise<Wait> {
    status.reconciles++;
    const cpuAtStart = process.cpuUsage();
    if (!secret) {
      status.lastResult = "waiting";
      log.info("waiting for the OSC Secret", { secret: `kube-system/${deps.secretName}`, why });
      return periodic();
    }
    const source = `Secret kube-system/${deps.secretName}`;
    // The rollout settings first: requested restarts go through them even while the OSC is invalid or cannot be resolved.
    const rollout = parseRolloutSettings(secret.metadata?.annotations, source);
    if (rollout.ok) deps.rollout.observe({ secretUid: secret.metadata?.uid ?? "", settings: rollout.value });
    const encoded = secret.data?.[oscDataKey];
    if (encoded === undefined) return invalid("missing", [`${source}: has no data["${oscDataKey}"]`]);
    const bytes = decodeBase64(encoded);
    if (!bytes) return invalid("undecodable", [`${source}: data["${oscDataKey}"] is not valid base64`]);
    // Gardener's checksum: of the bytes as they are, never of a re-encoded text. The Node's
    // checksum/cloud-config-data names it; with overlays matching this node, what the node applies has
    // a checksum of its own (`checksum`), for everything else.
    const base = oscChecksum(bytes);
    const parsed = await oscParser.parse(bytes, base, source);
    const layered = parsed.ok ? layersFor(parsed.value, bytes, source) : parsed;
    if (!layered.ok) {
      note(base);
      status.lastChecksum = base;
      return invalid(base, layered.errors);
    }
    const { matched } = layered.value;
    const checksum = layeredChecksum(bytes, matched);
    note(checksum);
    status.lastChecksum = checksum;
    // What is recorded as applied (last-applied-osc.yaml, the rollback target): the layered OSC.
    const applied = matched.length > 0 ? new TextEncoder().encode(stringify(layered.value.osc)) : bytes;
    const resolved = await desiredForNode(layered.value.osc, source, {
      files: deps.files,
      hostName: deps.hostName,
      readSecret,
      images: deps.images,
      log,
      signal: stopping.signal,
      provenance: layered.value.provenance,
    });
    await secretRefs.keepOnly(secretRefsOf(layered.value.osc, deps.hostName));
    if (!resolved.ok) {
      const wait = await invalid(checksum, resolved.errors);
      return resolved.retry ? retryWait("an image could not be fetched") : wait;
    }
    const desired = resolved.value;
    const state = await deps.store.read();
    const selfUpdateProblem = await checkSelfUpdate(desired, {
      files: deps.files,
      selfBinary: deps.selfBinary,
      configDir: deps.configDir,
      ...(state.owned.files[deps.selfBinary] ? { installed: state.owned.files[deps.selfBinary]?.sha256 } : {}),
    });
    if (selfUpdateProblem) return invalid(checksum, [selfUpdateProblem]);
    const inPlaceWork = await inPlace.work(layered.value.osc, checksum, source);
    if (!inPlaceWork.ok) return invalid(checksum, inPlaceWork.errors);
    const inPlaceUpdate = hasInPlaceChanges(inPlaceWork.value);
    if (inPlaceUpdate) {
      const waiting = inPlace.awaitDrain(inPlaceWork.value);
      if (waiting) return holdInPlace(checksum, "InPlaceUpdatePending", waiting);
    }
    if (!rollout.ok) return invalid(checksum, rollout.errors);
    const settings = rollout.value;
    // Only a valid OSC starts the reconciliation delay: an invalid one changes nothing on the node, this
    // record included (the bad-input corpus hashes the state directory too).
    await noteFirstSeen(checksum);

    const current = deps.node.current();
    const identity = current?.metadata?.name ?? deps.hostName;
    const gates = gatesFor({ checksum, stateApplied: state.lastApplied?.checksum, nodeApplied: nodeAppliedChecksum(current), serial: isSerialRollout(secret) });
    const hold = firstHold(gates, {
      delayLeftMs: gates.delay ? delayRemaining(current, checksum) : 0,
      coolOffLeftMs: gates.serial ? serialCoolOffLeft((await serialState()).gaveUp, checksum, bootClock(), settings.serialHoldLimitMs) : 0,
    });
    if (hold) {
      log.info(hold.message, { checksum, remainingMs: Math.round(hold.ms) });
      return { atMs: now() + hold.ms, why: hold.why };
    }
    // One planning pass: the plan the admission weighs is the plan applied (an unfinished apply of this OSC
    // resumes its persisted plan; the rollout state keeps what its admission weighed).
    const planned = state.progress?.checksum === checksum ? undefined : await planForNode({ desired, checksum, owned: state.owned, files: deps.files, systemd: deps.systemd, selfUnit: deps.selfUnit });
    if (gates.admit) {
      const wait = await admit({ checksum, base, revision: layered.value.revision, kind: inPlaceUpdate ? "in-place" : gates.kind === "current" ? "drift" : "osc" }, toWeigh(planned?.plan, state.progress, checksum), settings);
      if (wait) return wait;
    }
    if (inPlaceUpdate) await inPlace.begin(checksum, inPlaceWork.value);
    if (gates.kind === "current" && !leftoverLeaseChecked && isSerialRollout(secret)) {
      // A crash between a successful apply and the release would hold up the rollout until the
      // lease expires: give back a lease this node still holds.
      leftoverLeaseChecked = true;
      await serialGate(identity).release();
    }
    const gate = gates.serial ? serialGate(identity) : undefined;
    if (gate) {
      const decision = await gate.acquire();
      if (!decision.held) {
        log.info("another node is applying this OSC (serial rollout)", { holder: decision.holder, retryAfterMs: decision.retryAfterMs });
        // Jittered, so that waiting nodes do not all ask at the same instant.
        return { atMs: now() + decision.retryAfterMs * (0.5 + Math.random() / 2), why: "serial lease may be free" };
      }
    }

    const started = now();
    const startedBoot = bootClock();
    // Unit jobs can take minutes: keep the 600 s lease fresh while applying.
    const renewal = gate
      ? setInterval(() => gate.renew().catch((err: unknown) => log.warn("could not renew the serial lease", { error: describeError(err) })), 60_000)
      : undefined;
    const outcome = await applyDesired(desired, checksum, applied, {
      files: deps.files,
      systemd: deps.systemd,
      store: deps.store,
      log,
      selfUnit: deps.selfUnit,
      ...(planned ? { planned } : {}),
    }).finally(() => clearInterval(renewal));
    executed = outcome.executed;
    log.info(outcome.complete ? "OSC applied" : "OSC apply incomplete", {
      checksum,
      steps: outcome.executed.length,
      failures: outcome.failures.length,
      resumed: outcome.resumed,
      durationMs: now() - started,
      // The process's CPU (every thread: the runtime's compiler and GC too) since the reconcile began:
      // with the wall time above, whether a slow one worked or waited (for the CPU, systemd, the disk).
      cpuMs: cpuMsSince(cpuAtStart),
      restarted: outcome.executed.flatMap((s) => (s.kind === "restart" ? [s.unit] : [])),
    });
    if (!outcome.complete) {
      status.lastResult = "failed";
      status.lastError = outcome.failures.map((f) => `${describeStep(f.step)}: ${f.error}`).join("; ");
      // Under its admission the retry stays gated, and the gate's timeout runs on (a unit that never comes up fails it).
      if (gates.admit) await deps.rollout.applied({ complete: false, error: status.lastError });
      // The hold first: an agent killed while it reports must not lose it.
      const hold = gate ? holdAfterFailure((await serialState()).hold, checksum, startedBoot, status.lastError) : undefined;
      if (hold) await saveSerial({ ...(await serialState()), hold });
      await reportFailure(deps.node.current(), checksum, outcome);
      if (gate && hold && giveUpSerialLease(hold, bootClock(), settings.serialHoldLimitMs)) return giveUpLease(gate, identity, hold, settings.serialHoldLimitMs);
      return retryWait("a failed apply"); // the serial lease stays ours: the rollout stops here
    }
    if (hasInPlaceChanges(inPlaceWork.value)) {
      // As gardener-node-agent: with the agent's own restart under way (its configuration changed with a
      // kubelet minor version, say), the rest of the in-place update is left to its next start.
      if (outcome.restartingSelf) return inPlaceInterrupted(checksum, "the agent restarts itself after this apply");
      const wait = await finishInPlace(checksum, inPlaceWork.value, layered.value.osc.status?.inPlaceUpdates?.osUpdate);
      if (wait) return wait;
    }
    // The gate starts now; it runs in the rollout controller, which says when a rollback is to be applied.
    if (gates.admit) await deps.rollout.applied({ complete: true });
    failures = 0;
    const held = await serialState();
    if (held.hold || held.gaveUp) await saveSerial({ version: 1 });
    status.lastResult = "applied";
    status.lastError = undefined;
    for (const step of outcome.executed) if (step.kind === "restart") restarts.inc({ unit: step.unit });
    appliedChecksum = checksum;
    // Released after reporting, so the next node starts once this one shows the OSC as applied.
    // The Node as it is now: it may have registered (or its watch synced) while the apply ran.
    await reportSuccess(deps.node.current(), { base, checksum }, desired, outcome).finally(() => gate?.release());
    // Housekeeping after the report: the Node says the OSC is applied as soon as it is.
    await oscParser.keep(base);
    await pruneImages(desired);
    if (resolved.waitingFor.length > 0) {
      log.info("applied without the registries still waiting for their readiness probe", { registries: resolved.waitingFor });
      return { atMs: now() + registryProbeRetryMs, why: "registry readiness probe" };
    }
    return periodic();
  }

  /**
   * What the node's rollout says of this OSC's apply: undefined to apply it now, else the wait (held back,
   * waiting for a slot, its gate running) — or the rollback the rollout asks for first.
   */
  async function admit(w: Omit<Work, "disruption">, plan: Plan | undefined, settings: RolloutSettings): Promise<Wait | undefined> {
    const disruption = plan ? disruptionOf(plan, settings.disruptiveUnits) : { units: [], paths: [] };
    // A no-op re-check asks nothing of the rollout, unless it has work of its own under way.
    if (disruption.units.length === 0 && disruption.paths.length === 0 && (plan?.steps.length ?? 0) === 0 && !(await deps.rollout.state()).current) return undefined;
    const decision = await deps.rollout.offer({ ...w, disruption });
    if (decision.do === "apply") return decision.target === "last-good" ? rollBack(w.checksum) : undefined;
    status.lastResult = "held";
    status.lastError = decision.do === "hold" ? decision.message : `OSC ${w.checksum.slice(0, 12)}: the health gate of this node's last change runs`;
    return decision.do === "hold" ? { atMs: now() + decision.retryAfterMs, why: decision.reason } : periodic();
  }

  /** Applies the node's last good OSC again after `failed` failed its gate (under the same slot; its gate follows). */
  async function rollBack(failed: string): Promise<Wait> {
    const back = await deps.rollout.lastGood();
    if (!back) throw new Error(`rolling back from OSC ${failed.slice(0, 12)}: no last good OSC is kept (${lastGoodOscPath})`);
    const source = `the last good OSC ${back.checksum.slice(0, 12)} (${lastGoodOscPath})`;
    const parsed = parseOscBytes(back.osc, source);
    if (!parsed.ok) throw new Error(`rolling back: ${parsed.errors.join("; ")}`);
    const resolved = await desiredForNode(parsed.value, source, { files: deps.files, hostName: deps.hostName, readSecret, images: deps.images, log, signal: stopping.signal });
    if (!resolved.ok) throw new Error(`rolling back: ${resolved.errors.join("; ")}`);
    log.warn("rolling back to the last good OSC", { failed, to: back.checksum });
    const outcome = await applyDesired(resolved.value, back.checksum, back.osc, { files: deps.files, systemd: deps.systemd, store: deps.store, log, selfUnit: deps.selfUnit });
    executed = outcome.executed;
    const error = outcome.failures.map((f) => `${describeStep(f.step)}: ${f.error}`).join("; ");
    await deps.rollout.applied({ complete: outcome.complete, ...(error ? { error } : {}) });
    status.lastResult = "failed";
    status.lastError = `OSC ${failed.slice(0, 12)} failed its health gate; rolled back to ${back.checksum.slice(0, 12)}`;
    if (!outcome.complete) {
      await reportFailure(deps.node.current(), back.checksum, outcome);
      return retryWait("a failed rollback");
    }
    await reportSuccess(deps.node.current(), { base: back.base, checksum: back.checksum }, resolved.value, outcome);
    return periodic();
  }

  /**
   * Gives up the serial lease an apply kept failing under for longer than the hold limit, and says so
   * on the Node: the pool's rollout goes on with the next node, and this node asks again after as long.
   */
  async function giveUpLease(gate: SerialGate, identity: string, hold: SerialHold, limitMs: number): Promise<Wait> {
    await gate.release();
    const at = bootClock();
    await saveSerial({ version: 1, gaveUp: { checksum: hold.checksum, at } });
    serialGivenUp.inc();
    const heldFor = formatElapsed(elapsedBetween(hold.since, at));
    const message =
      `${identity} held the serial lease kube-system/${deps.secretName} for ${heldFor} (hold limit ${formatDuration(limitMs)}) ` +
      `and failed ${hold.failures} apply attempt(s) of OSC ${hold.checksum.slice(0, 12)}; gave it up so the next node can go on, ` +
      `asking again in ${formatDuration(limitMs)}. Last error: ${hold.lastError}`;
    log.warn("gave up the serial lease: the apply kept failing past the hold limit", { holder: identity, checksum: hold.checksum, failures: hold.failures, heldFor });
    const current = deps.node.current();
    if (current) await deps.events.record({ node: nodeRef(current), type: "Warning", reason: "SerialLeaseGivenUp", message });
    return { atMs: now() + limitMs, why: "serial lease cool-off over" };
  }


  /** An in-place update that waits (for the drain, or for the machine to restart): held, and said in the condition. */
  async function holdInPlace(checksum: string, reason: string, why: string): Promise<Wait> {
    status.lastResult = "held";
    status.lastError = why;
    log.info("the in-place update waits", { checksum, why });
    const current = deps.node.current();
    if (current) await setCondition(current, "False", reason, `OSC ${checksum.slice(0, 12)}: ${why}`);
    return periodic();
  }

  /**
   * An in-place update this process leaves unfinished because the agent stops: no failure (nothing is told
   * to machine-controller-manager); it is recorded as pending, and the next start finishes it.
   */
  function inPlaceInterrupted(checksum: string, why: string): Wait {
    status.lastResult = "held";
    status.lastError = `the in-place update is finished when the agent starts again: ${why}`;
    log.info("the in-place update is left to the agent's next start", { checksum, why });
    return periodic();
  }

  /**
   * After the apply of an in-place update: the rest of it. A failure is reported, the OSC not reported as
   * applied, and retried — unless it is final (an OS update that failed is not tried again for the same
   * version, as gardener-node-agent: the next OSC change wakes the controller).
   */
  async function finishInPlace(checksum: string, work: InPlaceChanges, osUpdate: OsUpdate | null | undefined): Promise<Wait | undefined> {
    const outcome = await inPlace.finish(checksum, work, osUpdate);
    if (outcome && "waiting" in outcome) return holdInPlace(checksum, "InPlaceUpdateRestartPending", outcome.waiting);
    if (outcome && "stopped" in outcome) return inPlaceInterrupted(checksum, outcome.stopped);
    if (!outcome) return undefined;
    status.lastResult = "failed";
    status.lastError = outcome.failed;
    log.error("the in-place update failed", { checksum, error: outcome.failed, final: outcome.final });
    const current = deps.node.current();
    const { reported } = note(checksum);
    if (current && !reported.has(`in-place/${outcome.failed}`)) {
      if (outcome.final) reported.add(`in-place/${outcome.failed}`);
      await deps.events.record({ node: nodeRef(current), type: "Warning", reason: "InPlaceUpdateFailed", message: outcome.failed });
      await setCondition(current, "False", "InPlaceUpdateFailed", `OSC ${checksum.slice(0, 12)}: ${outcome.failed}`);
    }
    return outcome.final ? periodic() : retryWait("a failed in-place update");
  }

  function serialGate(identity: string) {
    return createSerialGate({
      kube: deps.kube,
      secret: { name: deps.secretName, namespace: "kube-system", uid: secret?.metadata?.uid ?? "" },
      identity,
      log,
      // A waiting node looks again within seconds, so a released lease is taken up quickly; the
      // cost is a few GETs per waiting node during a rollout, none otherwise.
      maxRetryAfterMs: 5_000,
    });
  }

  function delayRemaining(current: V1Node | undefined, checksum: string): number {
    const delay = parseDelay(current?.metadata?.annotations?.[annotations.reconciliationDelay]);
    if ("unparsable" in delay) log.warn("ignoring an unparsable reconciliation delay", { annotation: annotations.reconciliationDelay, value: delay.unparsable });
    if (delay.ms === 0 || firstSeen?.checksum !== checksum) return 0;
    return delayLeft(delay.ms, elapsedBetween(firstSeen, bootClock()));
  }

  /** Records when this node first saw `checksum` (kept in the state dir, so an agent restart keeps the time). */
  async function noteFirstSeen(checksum: string): Promise<void> {
    if (firstSeen?.checksum === checksum) return;
    const saved = await delayStarts.read().catch((err: unknown) => {
      log.warn("could not read when the OSC was first seen; counting from now", { path: delayStartPath, error: describeError(err) });
      return undefined;
    });
    if (saved?.checksum === checksum) {
      firstSeen = saved;
      return;
    }
    firstSeen = { version: 1, checksum, ...bootClock() };
    await delayStarts.write(firstSeen);
  }

  /** What the Node says is applied: the effective checksum where overlays apply, else the base one. */
  function nodeAppliedChecksum(current: V1Node | undefined): string | undefined {
    const a = current?.metadata?.annotations ?? {};
    return a[effectiveChecksumAnnotation] ?? a[annotations.appliedChecksum];
  }

  /**
   * The OSC with the Secret's overlays that match this Node's labels (none before the Node is known), and
   * the Secret's revision: osc.yaml and every overlay, what the pool's rollout admits and stops.
   */
  function layersFor(osc: OperatingSystemConfig, bytes: Uint8Array, source: string): Result<Layered & { revision: string }> {
    const data: Record<string, Uint8Array> = {};
    for (const [key, encoded] of Object.entries(secret?.data ?? {})) {
      if (!key.startsWith("overlay")) continue;
      const decoded = decodeBase64(encoded);
      if (!decoded) return { ok: false, errors: [`${source}: data["${key}"] is not valid base64`] };
      data[key] = decoded;
    }
    const overlays = parseOverlays(data, source);
    if (!overlays.ok) return overlays;
    layeredSecret = overlays.value.length > 0;
    const layered = layerOsc(osc, overlays.value, deps.node.current()?.metadata?.labels ?? {}, source);
    return layered.ok ? { ok: true, value: { ...layered.value, revision: layeredChecksum(bytes, overlays.value) } } : layered;
  }

  // Extracted files the applied OSC no longer uses would fill the disk over many updates.
  async function pruneImages(desired: Desired): Promise<void> {
    const keep = new Set(desired.files.flatMap((f) => (f.content instanceof Uint8Array ? [] : [f.sha256])));
    await deps.images.prune(keep).catch((err: unknown) => log.warn("could not prune the image cache", { error: describeError(err) }));
  }

  async function invalid(checksum: string, errors: string[]): Promise<Wait> {
    status.lastResult = "invalid";
    status.lastError = errors.join("; ");
    // The node keeps its last good state; the Secret's next change wakes the controller again.
    log.error("the OSC is invalid; nothing was changed on the node", { checksum, errors });
    const current = deps.node.current();
    // Once per problem, not per checksum: the checksum is osc.yaml's, and a Secret whose overlays or
    // rollout annotations change keeps it, so a new problem there would otherwise never be reported.
    const reported = note(checksum).reported;
    const key = `invalid/${errors.join("\n")}`;
    if (current && !reported.has(key)) {
      reported.add(key);
      await deps.events.record({ node: nodeRef(current), type: "Warning", reason: "OSCInvalid", message: errors.join("\n") });
      await setCondition(current, "False", "Invalid", `OSC ${checksum.slice(0, 12)} is invalid; the node keeps its last good state: ${errors.join("; ")}`);
    }
    return periodic();
  }

  async function reportFailure(current: V1Node | undefined, checksum: string, outcome: ApplyOutcome): Promise<void> {
    if (!current) return;
    for (const f of outcome.failures) {
      await deps.events.record({ node: nodeRef(current), type: "Warning", reason: "OSCApplyFailed", message: `${describeStep(f.step)}: ${f.error}` });
    }
    await setCondition(current, "False", "ApplyFailed", `applying OSC ${checksum.slice(0, 12)}: ${outcome.failures.map((f) => describeStep(f.step)).join("; ")}`);
  }

  async function reportSuccess(current: V1Node | undefined, ids: Checksums, desired: Desired, outcome: ApplyOutcome): Promise<void> {
    const { checksum } = ids;
    const { reported } = note(checksum);
    for (const u of desired.unsupported) {
      if (current && !reported.has(`unsupported/${u}`)) {
        reported.add(`unsupported/${u}`);
        await deps.events.record({ node: nodeRef(current), type: "Warning", reason: "OSCUnsupported", message: u });
      }
    }
    // Kubelet registers the Node only once the first OSC started it: the Node's arrival wakes this
    // controller again, and that run reports what the apply did, from the state it persisted.
    if (!current) return;
    const name = current.metadata?.name as string;
    const wanted = await nodeMetadata(ids, desired);
    const have = { ...current.metadata?.labels, ...current.metadata?.annotations };
    const firstReport = (have[effectiveChecksumAnnotation] ?? have[annotations.appliedChecksum]) !== checksum;
    // A no-op re-check costs no API request (null: a key that must be absent). The patched Node, as the
    // server answered, is what the condition below is patched against, without reading it again.
    let patched: V1Node | undefined;
    if (Object.entries({ ...wanted.labels, ...wanted.annotations }).some(([k, v]) => (have[k] ?? null) !== v)) {
      patched = await patchNodeMetadata(deps.kube, name, wanted);
    }
    const done = outcome.executed.length > 0 || outcome.resumed ? summaryOf(outcome.executed) : firstReport ? await persistedSummary(checksum) : undefined;
    if (done) {
      await deps.events.record({
        node: nodeRef(current),
        type: "Normal",
        reason: "OSCApplied",
        message: `Applied OSC ${checksum.slice(0, 12)}: ${done.steps} step(s)${done.restarted.length ? `, restarted ${done.restarted.join(", ")}` : ""}`,
      });
    }
    await setCondition(patched ?? current, "True", "Applied", `OSC ${checksum.slice(0, 12)} is applied`, patched !== undefined);
  }

  // What the apply of `checksum` did, as it was recorded (possibly by this agent before it restarted itself).
  async function persistedSummary(checksum: string): Promise<{ steps: number; restarted: string[] } | undefined> {
    const last = (await deps.store.read()).lastApplied;
    return last?.checksum === checksum && last.steps !== undefined ? { steps: last.steps, restarted: last.restarted ?? [] } : undefined;
  }

  async function nodeMetadata(ids: Checksums, desired: Desired) {
    const controlPlane = desired.files.some((f) => f.path === apiServerManifest);
    const zone = await deps.files.read(paths.zone).catch(() => undefined);
    const zoneName = zone ? new TextDecoder().decode(zone).trim() : "";
    return {
      annotations: { [annotations.appliedChecksum]: ids.base, [effectiveChecksumAnnotation]: ids.checksum === ids.base ? null : ids.checksum },
      labels: {
        [labels.kubernetesVersion]: deps.kubernetesVersion,
        // The pool a disruption budget counts (Gardener's kubelet sets the same label on its nodes).
        [poolLabel]: deps.secretName,
        [controlPlane ? labels.controlPlane : labels.worker]: "",
        ...(zoneName ? { [labels.zone]: zoneName } : {}),
      },
    };
  }

  /** `fresh`: `current` is the server's answer to this agent's own write just now (see patchNodeConditionIfChanged). */
  async function setCondition(current: V1Node, value: "True" | "False", reason: string, message: string, fresh = false): Promise<void> {
    await patchNodeConditionIfChanged(deps.kube, current, { type: conditionType, status: value, reason, message }, { fresh }).catch((err: unknown) =>
      log.warn("could not set the Node condition", { condition: conditionType, error: describeError(err) }),
    );
  }

  return {
    synced,
    firstReconcile,
    between,
    onReconciled: (listener) => {
      reconciledListeners.add(listener);
      return () => void reconciledListeners.delete(listener);
    },
    stop: async () => {
      stopped = true;
      const finished = passes.stop();
      stopping.abort(new Error("the agent is stopping"));
      if (timer) clearTimeout(timer);
      unsubscribe();
      unsubscribeRollout();
      await secretWatch.stop();
      await secretRefs.stop();
      await finished;
    },
  };
}
