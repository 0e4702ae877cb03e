// The OperatingSystemConfig controller: watches the OSC Secret (by name only) and the agent's Node,
// and reconciles the node to the OSC — on every change, every syncPeriod (drift repair), and on retry
// after a failure. Level-triggered and single-flight: each reconcile reads the latest Secret, never
// the event that woke it, and a trigger during a reconcile runs one more afterwards.
//
// Rollout controls from the control plane: the Node annotation reconciliation-delay holds an updated
// OSC back for that long after it was first seen, and a Secret annotated serial applies one node at a
// time through a Lease. A node whose apply fails keeps the serial lease, so a bad change stops there
// instead of rolling on to the next node. trellis's own fleet rollouts (rollout.trellis.dev/ settings,
// src/controllers/rollout.ts) hold an update back on a paused node, outside the canary, outside the
// maintenance windows or without a free disruption slot, and gate a disruptive change on the node's
// health afterwards, rolling back if the Secret asks for it.
import { CoreV1Api, type V1Node, type V1Secret } from "@kubernetes/client-node";
import { decodeBase64 } from "../api/base64.ts";
import { type Desired, parseOscBytes, sha256Hex } from "../api/desired.ts";
import { parseGoDuration } from "../api/duration.ts";
import { oscDataKey, paths } from "../api/paths.ts";
import { type ApplyOutcome, applyDesired, summaryOf } from "../apply/apply.ts";
import { desiredForNode, type SecretData } from "../apply/desired-for-node.ts";
import { checkSelfUpdate } from "../apply/self-update.ts";
import type { StateStore } from "../apply/state-store.ts";
import type { Files } from "../host/files.ts";
import type { ImageStore } from "../host/registry/store.ts";
import type { Systemd } from "../host/systemd.ts";
import { apiClient, type Kube } from "../kube/client.ts";
import { explainKubeError } from "../kube/errors.ts";
import { type EventRecorder, nodeRef } from "../kube/events.ts";
import { patchNodeConditionIfChanged, patchNodeMetadata } from "../kube/node.ts";
import { createSerialGate, isSerialRollout } from "../kube/serial-gate.ts";
import { watchObjects } from "../kube/watch.ts";
import type { NodeSource, StatusBoard } from "./types.ts";
import { describeError, type Logger } from "../log.ts";
import type { Registry } from "../metrics.ts";
import { describeStep } from "../plan/render.ts";
import { parseRolloutSettings, poolLabel, type RolloutSettings } from "../api/rollout.ts";
import { planForNode } from "../apply/observe.ts";
import { disruptedUnits } from "../plan/disruption.ts";
import type { Checksums, Rollout } from "./rollout.ts";
import { lastGoodOscPath } from "../api/rollout-state.ts";
import { effectiveChecksumAnnotation, type Layered, layeredChecksum, layerOsc, parseOverlays } from "../api/layers.ts";
import type { OperatingSystemConfig } from "../api/osc.ts";
import type { Result } from "../api/result.ts";
import { stringify } from "yaml";
import { createInPlaceUpdater, type InPlaceUpdaterDeps, type OsUpdate, readyForUpdate } from "./in-place.ts";
import { hasInPlaceChanges } from "../plan/in-place.ts";
import type { InPlaceChanges } from "../api/in-place-state.ts";

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

export type OscControllerDeps = {
  kube: Kube;
  files: Files;
  systemd: Systemd;
  store: StateStore;
  events: EventRecorder;
  node: NodeSource;
  status: StatusBoard;
  metrics: Registry;
  log: Logger;
  secretName: string;
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
  /** What in-place updates need besides (src/controllers/in-place.ts). */
  tokens: InPlaceUpdaterDeps["tokens"];
  certificate: InPlaceUpdaterDeps["certificate"];
  apiServer: InPlaceUpdaterDeps["apiServer"];
  now?: () => number;
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
  stop(): Promise<void>;
};

type Wait = { atMs: number; why: string };

/** A registry mirror waiting for its readiness probe is probed again this often. */
const registryProbeRetryMs = 10_000;
/** How often a running health gate looks at the node. */
const gateLookMs = 1_000;

export function startOscController(deps: OscControllerDeps): OscController {
  const log = deps.log.with({ controller: "osc" });
  const now = deps.now ?? Date.now;
  const core = apiClient(deps.kube, CoreV1Api);
  let secret: V1Secret | undefined;
  // What this agent noted about the OSC it sees now: when it first saw it (for the delay) and which
  // problems it reported already. Replaced when the OSC changes, so nothing piles up over months.
  let seen: { checksum: string; at: number; reported: Set<string> } | undefined;
  const note = (checksum: string) => (seen?.checksum === checksum ? seen : (seen = { checksum, at: now(), reported: new Set() }));
  let failures = 0;
  let stopped = false;
  // A long image download must not hold up the agent's shutdown.
  const stopping = new AbortController();
  let leftoverLeaseChecked = false;
  const inPlace = createInPlaceUpdater({ ...deps, log, signal: stopping.signal });
  const status: OscControllerStatus = { synced: false, reconciles: 0 };

  // Single flight: `pending` asks for one more run after the current one.
  let running: Promise<void> | undefined;
  let pending = false;
  let timer: ReturnType<typeof setTimeout> | undefined;
  const trigger = (why: string) => {
    if (stopped) return;
    if (running) {
      pending = true;
      return;
    }
    running = (async () => {
      do {
        pending = false;
        const started = now();
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
        schedule(wait);
      } while (pending && !stopped);
      running = undefined;
    })();
  };
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
    const ms = Math.min(1000 * 2 ** Math.min(failures - 1, 8), 5 * 60_000);
    return { atMs: now() + ms, why: `retry after ${why}` };
  };

  const reconciles = deps.metrics.counter("trellis_reconcile_total", "OSC reconciles by result (applied, failed, invalid, waiting, error).");
  const duration = deps.metrics.histogram("trellis_reconcile_duration_seconds", "Time of one OSC reconcile.", [0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60]);
  const restarts = deps.metrics.counter("trellis_unit_restarts_total", "Units restarted by OSC applies, by unit.");
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
      trigger(`secret ${e.type.toLowerCase()}`);
    },
  });
  deps.metrics.collect("trellis_watch_restarts_total", "Watches of the OSC Secret resumed or restarted (reconnects and relists).", () => {
    const st = secretWatch.stats();
    return [{ labels: { watch: "osc-secret" }, value: st.restarts + st.gone + st.errors }];
  }, "counter");
  const synced = secretWatch.synced.then(() => {
    status.synced = true;
  });

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
  // A node that applied before kubelet registered it reports once the Node exists.
  void deps.node.found.then(() => trigger("node found"));

  async function reconcile(why: string): Promise<Wait> {
    status.reconciles++;
    if (!secret) {
      status.lastResult = "waiting";
      log.info("waiting for the OSC Secret", { secret: `kube-system/${deps.secretName}`, why });
      return periodic();
    }
    const source = `Secret kube-system/${deps.secretName}`;
    const encoded = secret.data?.[oscDataKey];
    if (encoded === undefined) return invalid("missing", [`${source}: has no data["${oscDataKey}"]`]);
    const bytes = decodeBase64(encoded);
    if (!bytes) return invalid("undecodable", [`${source}: data["${oscDataKey}"] is not valid base64`]);
    // Gardener's checksum: of the bytes as they are, never of a re-encoded text. The Node's
    // checksum/cloud-config-data names it; with overlays matching this node, what the node applies has
    // a checksum of its own (`checksum`), for everything else.
    const base = sha256Hex(bytes);
    const parsed = parseOscBytes(bytes, source);
    const layered = parsed.ok ? layersFor(parsed.value, source) : parsed;
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
    if (hasInPlaceChanges(inPlaceWork.value)) {
      const waiting = await inPlace.start(checksum, inPlaceWork.value);
      if (waiting) return holdInPlace(checksum, "InPlaceUpdatePending", waiting);
    }
    const rollout = parseRolloutSettings(secret.metadata?.annotations, source);
    if (!rollout.ok) return invalid(checksum, rollout.errors);
    const settings = rollout.value;
    deps.rollout.observe({ secretUid: secret.metadata?.uid ?? "", checksum, settings });
    // A change this node is gating (or failed, or rolled back from) is settled before anything else.
    const ongoing = await continueRollout({ base, checksum }, applied, state.lastApplied?.checksum, settings);
    if (ongoing) return ongoing;

    const current = deps.node.current();
    const isUpdate = state.lastApplied !== undefined && state.lastApplied.checksum !== checksum;
    if (isUpdate) {
      const hold = delayRemaining(current, checksum);
      if (hold > 0) {
        log.info("holding the updated OSC back (reconciliation delay)", { checksum, remainingMs: hold });
        return { atMs: now() + hold, why: "reconciliation delay over" };
      }
    }
    // Paused, outside the canary, outside every window or without a free slot: wait. A disruptive
    // change is recorded for its health gate before it is applied (it may restart this agent).
    let gatedUnits: string[] = [];
    if (isUpdate) {
      const disrupted = settings.budget || settings.windows ? disruptedUnits((await planForNode({ desired, checksum, owned: state.owned, files: deps.files, systemd: deps.systemd, selfUnit: deps.selfUnit })).plan, settings.disruptiveUnits) : [];
      const admission = await deps.rollout.admit({ secretUid: secret.metadata?.uid ?? "", checksum, disrupted, settings });
      if (!admission.go) {
        status.lastResult = "held";
        status.lastError = admission.message;
        return { atMs: admission.retryAtMs, why: admission.reason };
      }
      if (settings.budget && disrupted.length > 0) {
        await deps.rollout.gated(checksum, disrupted);
        gatedUnits = disrupted;
      }
    }
    if (!isUpdate && !leftoverLeaseChecked && isSerialRollout(secret) && current) {
      // A crash between a successful apply and the release would hold up the rollout until the
      // lease expires: give back a lease this node still holds.
      leftoverLeaseChecked = true;
      await serialGate(current).release();
    }
    const serial = isUpdate && isSerialRollout(secret) && current !== undefined;
    const gate = serial ? serialGate(current) : undefined;
    if (gate) {
      const decision = await gate.acquire();
      if (!decision.held) {
        log.info("another node is applying this OSC (serial rollout)", { holder: decision.holder, retryAfterMs: decision.retryAfterMs });
        // Jittered, so that waiting nodes do not all ask at the same instant.
        return { atMs: now() + decision.retryAfterMs * (0.5 + Math.random() / 2), why: "serial lease may be free" };
      }
    }

    const started = now();
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
    }).finally(() => clearInterval(renewal));
    log.info(outcome.complete ? "OSC applied" : "OSC apply incomplete", {
      checksum,
      steps: outcome.executed.length,
      failures: outcome.failures.length,
      resumed: outcome.resumed,
      durationMs: now() - started,
      restarted: outcome.executed.flatMap((s) => (s.kind === "restart" ? [s.unit] : [])),
    });
    if (!outcome.complete) {
      status.lastResult = "failed";
      status.lastError = outcome.failures.map((f) => `${describeStep(f.step)}: ${f.error}`).join("; ");
      await reportFailure(deps.node.current(), checksum, outcome);
      return retryWait("a failed apply"); // the serial lease stays ours: the rollout stops here
    }
    if (hasInPlaceChanges(inPlaceWork.value)) {
      const wait = await finishInPlace(checksum, inPlaceWork.value, layered.value.osc.status?.inPlaceUpdates?.osUpdate);
      if (wait) return wait;
    }
    failures = 0;
    status.lastResult = "applied";
    status.lastError = undefined;
    for (const step of outcome.executed) if (step.kind === "restart") restarts.inc({ unit: step.unit });
    appliedChecksum = checksum;
    await pruneImages(desired);
    // Released after reporting, so the next node starts once this one shows the OSC as applied.
    // The Node as it is now: it may have registered (or its watch synced) while the apply ran.
    await reportSuccess(deps.node.current(), { base, checksum }, desired, outcome).finally(() => gate?.release());
    if (gatedUnits.length > 0) return { atMs: now() + gateLookMs, why: "health gate" };
    if (settings.budget) await deps.rollout.applied({ base, checksum }, applied);
    if (resolved.waitingFor.length > 0) {
      log.info("applied without the registries still waiting for their readiness probe", { registries: resolved.waitingFor });
      return { atMs: now() + registryProbeRetryMs, why: "registry readiness probe" };
    }
    return periodic();
  }

  /**
   * Settles a change this node is gating for `checksum` (the Secret's OSC now): looks at the node's health
   * until the gate passes or fails, rolls back if the Secret says so, or keeps a failed or rolled-back
   * change from being applied again. Undefined: nothing of the kind, reconcile as usual.
   */
  async function continueRollout(ids: Checksums, osc: Uint8Array, applied: string | undefined, settings: RolloutSettings): Promise<Wait | undefined> {
    const { checksum } = ids;
    const g = (await deps.rollout.state()).gate;
    if (!g || g.checksum !== checksum) return undefined;
    if (g.phase === "blocked" || g.phase === "failed") {
      status.lastResult = g.phase === "failed" ? "failed" : "held";
      status.lastError = g.phase === "failed" ? `health gate failed: ${g.failedCheck ?? "?"}` : `failed its health gate here (${g.failedCheck ?? "?"}); rolled back`;
      return periodic();
    }
    const lastGood = g.phase === "rolled-back" ? await deps.rollout.lastGood(checksum) : undefined;
    // The gate looks only at a complete apply: an unfinished one is applied (again) first.
    if (g.phase === "gating" && applied !== checksum) return undefined;
    if (g.phase === "rolled-back" && lastGood && applied !== lastGood.checksum) return rollBack(checksum, lastGood, settings);
    const t = await deps.rollout.tick(settings);
    if (!t) return undefined;
    if (t.result === "pending") {
      status.lastResult = "held";
      status.lastError = `health gate: ${t.check ?? "settling"}`;
      return { atMs: now() + gateLookMs, why: "health gate" };
    }
    if (t.result === "passed") {
      await deps.rollout.passed(ids, osc);
      status.lastResult = g.phase === "gating" ? "applied" : "held";
      status.lastError = undefined;
      return periodic();
    }
    const back = g.phase === "gating" && settings.rollback ? await deps.rollout.lastGood(checksum) : undefined;
    await deps.rollout.failed(t.check, back !== undefined);
    status.lastResult = "failed";
    status.lastError = `health gate failed: ${t.check}`;
    return back ? rollBack(checksum, back, settings) : periodic();
  }

  /** Applies the node's last good OSC again after `failed` failed its gate; that one's gate runs next. */
  async function rollBack(failed: string, back: { checksum: string; base: string; osc: Uint8Array }, settings: RolloutSettings): Promise<Wait> {
    const source = `the last good OSC ${back.checksum.slice(0, 12)} (${lastGoodOscPath})`;
    const parsed = parseOscBytes(back.osc, source);
    if (!parsed.ok) throw new Error(`rolling back: ${parsed.errors.join("; ")}`);
    const resolved = await desiredForNode(parsed.value, source, { files: deps.files, hostName: deps.hostName, readSecret, images: deps.images, log, signal: stopping.signal });
    if (!resolved.ok) throw new Error(`rolling back: ${resolved.errors.join("; ")}`);
    const state = await deps.store.read();
    const { plan } = await planForNode({ desired: resolved.value, checksum: back.checksum, owned: state.owned, files: deps.files, systemd: deps.systemd, selfUnit: deps.selfUnit });
    await deps.rollout.gated(back.checksum, disruptedUnits(plan, settings.disruptiveUnits), true);
    const current = deps.node.current();
    if (current) await deps.events.record({ node: nodeRef(current), type: "Warning", reason: "RolloutRolledBack", message: `OSC ${failed.slice(0, 12)} failed its health gate: going back to the last good OSC ${back.checksum.slice(0, 12)}` });
    log.warn("rolling back to the last good OSC", { failed, to: back.checksum });
    const outcome = await applyDesired(resolved.value, back.checksum, back.osc, { files: deps.files, systemd: deps.systemd, store: deps.store, log, selfUnit: deps.selfUnit });
    if (!outcome.complete) {
      await reportFailure(deps.node.current(), back.checksum, outcome);
      return retryWait("a failed rollback");
    }
    await reportSuccess(deps.node.current(), { base: back.base, checksum: back.checksum }, resolved.value, outcome);
    return { atMs: now() + gateLookMs, why: "health gate of the rollback" };
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

  /** After the apply of an in-place update: the rest of it; a failure is reported and retried, the OSC not reported as applied. */
  async function finishInPlace(checksum: string, work: InPlaceChanges, osUpdate: OsUpdate | null | undefined): Promise<Wait | undefined> {
    const outcome = await inPlace.finish(checksum, work, osUpdate);
    if (outcome && "waiting" in outcome) return holdInPlace(checksum, "InPlaceUpdateRestartPending", outcome.waiting);
    if (!outcome) return undefined;
    status.lastResult = "failed";
    status.lastError = outcome.failed;
    log.error("the in-place update failed", { checksum, error: outcome.failed });
    const current = deps.node.current();
    if (current) {
      await deps.events.record({ node: nodeRef(current), type: "Warning", reason: "InPlaceUpdateFailed", message: outcome.failed });
      await setCondition(current, "False", "InPlaceUpdateFailed", `OSC ${checksum.slice(0, 12)}: ${outcome.failed}`);
    }
    return retryWait("a failed in-place update");
  }

  function serialGate(current: V1Node) {
    return createSerialGate({
      kube: deps.kube,
      secret: { name: deps.secretName, namespace: "kube-system", uid: secret?.metadata?.uid ?? "" },
      identity: current.metadata?.name as string,
      log,
      // A waiting node looks again within seconds, so a released lease is taken up quickly; the
      // cost is a few GETs per waiting node during a rollout, none otherwise.
      maxRetryAfterMs: 5_000,
    });
  }

  function delayRemaining(current: V1Node | undefined, checksum: string): number {
    const text = current?.metadata?.annotations?.[annotations.reconciliationDelay];
    if (!text) return 0;
    const delay = parseGoDuration(text);
    if (delay === undefined || delay < 0) {
      log.warn("ignoring an unparsable reconciliation delay", { annotation: annotations.reconciliationDelay, value: text });
      return 0;
    }
    return note(checksum).at + delay - now();
  }

  /** The OSC with the Secret's overlays that match this Node's labels (none before the Node is known). */
  function layersFor(osc: OperatingSystemConfig, source: string): Result<Layered> {
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
    return layerOsc(osc, overlays.value, deps.node.current()?.metadata?.labels ?? {}, source);
  }

  async function readSecret(name: string): Promise<SecretData | undefined> {
    let s: V1Secret;
    try {
      s = await core.readNamespacedSecret({ name, namespace: "kube-system" });
    } catch (err) {
      const e = explainKubeError(err, { server: deps.kube.server, caSource: deps.kube.caSource, what: `reading Secret kube-system/${name}` });
      if (e.reason !== "not-found") throw e;
      return undefined;
    }
    const data: Record<string, Uint8Array> = {};
    for (const [key, encoded] of Object.entries(s.data ?? {})) {
      const bytes = decodeBase64(encoded);
      if (!bytes) throw new Error(`Secret kube-system/${name}: data["${key}"] is not valid base64`);
      data[key] = bytes;
    }
    return data;
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
    // A no-op re-check costs no API request (null: a key that must be absent).
    if (Object.entries({ ...wanted.labels, ...wanted.annotations }).some(([k, v]) => (have[k] ?? null) !== v)) {
      await patchNodeMetadata(deps.kube, name, wanted);
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
    await setCondition(current, "True", "Applied", `OSC ${checksum.slice(0, 12)} is applied`);
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

  async function setCondition(current: V1Node, value: "True" | "False", reason: string, message: string): Promise<void> {
    await patchNodeConditionIfChanged(deps.kube, current, { type: conditionType, status: value, reason, message }).catch((err: unknown) =>
      log.warn("could not set the Node condition", { condition: conditionType, error: describeError(err) }),
    );
  }

  return {
    synced,
    stop: async () => {
      stopped = true;
      stopping.abort(new Error("the agent is stopping"));
      if (timer) clearTimeout(timer);
      unsubscribe();
      await secretWatch.stop();
      await running;
    },
  };
}
