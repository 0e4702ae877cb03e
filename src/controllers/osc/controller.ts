// The OperatingSystemConfig controller's wiring (Gardener's add.go): what it watches — the OSC Secret (by
// name only), the Secrets its secretRef files name, the agent's Node, the node's rollout — which changes
// wake it, and how its reconciles are run: level-triggered and single-flight (src/loops.ts), each one
// reading the latest Secret, never the event that woke it; a trigger during a reconcile runs one more
// afterwards; every reconcile ends by saying when to run again (a change, every syncPeriod for drift
// repair, a retry with backoff, a hold's end). The reconcile itself: reconcile.ts.
//
// Rollout controls: Gardener's reconciliation delay and serial lease (delay.ts, serial.ts, decided in
// gates.ts), and trellis's fleet rollouts (rollout.ts, src/controllers/rollout/): held back on a paused
// node, outside the canary or the maintenance windows, or without a disruption slot; gated on the node's
// health afterwards, rolled back if the Secret asks for it.
import type { V1Secret } from "@kubernetes/client-node";
import { paths } from "../../api/paths.ts";
import type { Step } from "../../api/plan.ts";
import { readBootClock } from "../../host/boot-clock.ts";
import { nodeRef } from "../../kube/events.ts";
import { watchSecretRefs } from "../../kube/secret-refs.ts";
import { watchObjects } from "../../kube/watch.ts";
import { describeError } from "../../log.ts";
import { later, singleFlight } from "../../loops.ts";
import { monotonicMs } from "../../time.ts";
import { createInPlaceUpdater, readyForUpdate } from "../in-place.ts";
import { type OscContext, type OscControllerDeps, result, retryWait, type Wait, withoutData } from "./context.ts";
import { createOscParser } from "./parse.ts";
import { reconcile } from "./reconcile.ts";
import { annotations, reportStatus } from "./report.ts";

export type { OscControllerDeps } from "./context.ts";
export { annotations, conditionType, labels } from "./report.ts";

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

export function startOscController(deps: OscControllerDeps): OscController {
  const log = deps.log.with({ controller: "osc" });
  const stopping = new AbortController();
  let stopped = false;
  const reconciledListeners = new Set<(executed: readonly Step[]) => void>();
  const secretRefs = watchSecretRefs({ kube: deps.kube, log, onChange: (name) => passes.trigger(`secret ${name} (secretRef) changed`) });
  const ctx: OscContext = {
    deps,
    log,
    now: deps.clock ?? monotonicMs,
    bootClock: deps.bootClock ?? readBootClock,
    stopping: stopping.signal,
    state: { startedWithSecret: false, ranWithoutNode: false, failures: 0, leftoverLeaseChecked: false, layeredSecret: false, executed: [], status: { synced: false, nodeCheckPending: false, reconciles: 0 } },
    inPlace: createInPlaceUpdater({ ...deps, log, signal: stopping.signal }),
    parser: createOscParser({ files: deps.files, path: paths.parsedOsc, log }),
    secretRefs,
    metrics: {
      restarts: deps.metrics.counter("trellis_unit_restarts_total", "Units restarted by OSC applies, by unit."),
      serialGivenUp: deps.metrics.counter("trellis_serial_lease_given_up_total", "Serial leases this node gave up after its apply kept failing past the hold limit."),
      notActedOn: deps.metrics.gauge(
        "trellis_osc_not_acted_on",
        "Parts of the OSC last applied that are not acted on as written (fields Gardener's type does not have, entries a later one replaces, drop-ins systemd does not read); the OSCUnsupported event, the Node condition and trellis plan name them.",
      ),
    },
  };
  const reconciles = deps.metrics.counter("trellis_reconcile_total", "OSC reconciles by result (applied, failed, invalid, waiting, error).");
  const duration = deps.metrics.histogram("trellis_reconcile_duration_seconds", "Time of one OSC reconcile.", [0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60]);
  deps.metrics.collect("trellis_applied_osc_info", "1, labelled with the checksum of the OSC last applied completely.", () =>
    ctx.state.appliedChecksum ? [{ labels: { checksum: ctx.state.appliedChecksum }, value: 1 }] : [],
  );

  let reconciled: () => void = () => {};
  const firstReconcile = new Promise<void>((done) => (reconciled = done));
  let next: Wait = { atMs: 0, why: "" };
  const requeue = later(() => passes.trigger(next.why));
  const reconcileOnce = async (why: string): Promise<void> => {
    const started = ctx.now();
    ctx.state.executed = [];
    const wait = await reconcile(ctx, why).catch(async (err: unknown) => {
      const error = describeError(err);
      result(ctx, "failed", error);
      log.error("reconcile failed", { error });
      const current = deps.node.current();
      if (current) await deps.events.record({ node: nodeRef(current), type: "Warning", reason: "OSCReconcileError", message: error });
      return retryWait(ctx, "reconcile error");
    });
    duration.observe((ctx.now() - started) / 1000);
    reconciles.inc({ result: ctx.state.status.lastResult ?? "error" });
    reportStatus(ctx);
    reconciled();
    if (!stopped) {
      next = wait;
      requeue.in(wait.atMs - ctx.now());
    }
    for (const listener of reconciledListeners) listener(ctx.state.executed);
  };
  const passes = singleFlight(reconcileOnce);
  const trigger = passes.trigger;
  // The drift check compares the node with what the last apply recorded: during an apply the two
  // differ by design, so it runs only between reconciles, as a pass of the same single flight.
  const between = <T>(fn: (reconcile: (why: string) => Promise<boolean>) => Promise<T>): Promise<T> =>
    passes.exclusive(() =>
      fn(async (why) => {
        await reconcileOnce(why);
        return ctx.state.status.lastResult === "applied";
      }),
    );

  const secretWatch = watchObjects<V1Secret>({
    kube: deps.kube,
    path: "/api/v1/namespaces/kube-system/secrets",
    fieldSelector: `metadata.name=${deps.secretName}`,
    log,
    remember: withoutData,
    onEvent: (e) => {
      ctx.state.secret = e.type === "DELETED" ? undefined : e.object;
      ctx.state.letGo = undefined;
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
  const synced = secretWatch.synced.then(() => {
    ctx.state.status.synced = true;
    // No Secret in the first list: one reconcile says so (waiting), and it counts as the first one.
    if (!ctx.state.secret) trigger("no OSC Secret yet");
  });
  // Rejected only when the agent stops before the first list arrived (the API server unreachable):
  // whoever awaits `synced` sees that, but the stop itself must not end in an unhandled rejection.
  synced.catch(() => undefined);

  const unsubscribe = deps.node.subscribe(nodeChanges(ctx, trigger));
  // The rollout asks for a reconcile when its answer changed: a slot was granted, a gate failed and the node rolls back.
  const unsubscribeRollout = deps.rollout.onChange(() => trigger("rollout decision changed"));
  // A node that applied before kubelet registered it reports once the Node exists: a reconcile again when
  // one ran without the Node (one that comes after sees it).
  void deps.node.found.then(() => ctx.state.ranWithoutNode && trigger("node found"));

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
      requeue.cancel();
      unsubscribe();
      unsubscribeRollout();
      await secretWatch.stop();
      await secretRefs.stop();
      await finished;
    },
  };
}

/**
 * Kubelet updates the Node all the time: what concerns this controller is the reconciliation delay, the
 * in-place update's drain, and the labels when the Secret has overlays (they pick by label).
 */
function nodeChanges(ctx: OscContext, trigger: (why: string) => void) {
  const first = ctx.deps.node.current();
  let delayAnnotation = first?.metadata?.annotations?.[annotations.reconciliationDelay];
  let labelsSeen = JSON.stringify(first?.metadata?.labels ?? {});
  let drained = readyForUpdate(first);
  return (n: NonNullable<typeof first>) => {
    if (readyForUpdate(n) !== drained) {
      drained = !drained;
      trigger("in-place update condition changed");
    }
    const value = n.metadata?.annotations?.[annotations.reconciliationDelay];
    const labelsNow = JSON.stringify(n.metadata?.labels ?? {});
    const labelsChanged = labelsNow !== labelsSeen;
    labelsSeen = labelsNow;
    if (ctx.state.layeredSecret && labelsChanged) trigger("node labels changed (the Secret has overlays)");
    if (value === delayAnnotation) return;
    delayAnnotation = value;
    trigger("reconciliation delay changed");
  };
}
