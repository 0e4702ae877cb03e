// Keeps kubelet and containerd alive, as gardener-node-agent's health check does: every syncPeriod
// kubelet's /healthz is asked and containerd is called on its socket; a component that has failed
// continuously for its threshold is restarted through systemd and a Warning event says how long it
// failed and why. The failure clock then starts over, so the restarted component gets a full
// threshold to come back before it is restarted again. A component whose unit is not on the node
// (kubelet before it is installed) or is masked is skipped, not counted as failing.
//
// It also watches the Node's Ready condition: kubelet flapping between NotReady and Ready
// readinessFlaps times within readinessFlapWindow makes one Warning event per window.
// (gardener-node-agent reboots the node then; trellis reports and leaves the decision to people.)
// And, like gardener-node-agent's kubelet check, it restores the Node's InternalIP should kubelet lose
// it (internal-ip.ts), looking at every update of the Node and at every check.
import type { V1Node } from "@kubernetes/client-node";
import type { NodeAgentConfiguration } from "../api/agent-config.ts";
import { formatDuration, formatElapsed } from "../api/duration.ts";
import { containerdVersion, defaultContainerdSocket } from "../host/containerd.ts";
import type { Systemd } from "../host/systemd.ts";
import type { Kube } from "../kube/client.ts";
import { type EventRecorder, nodeRef } from "../kube/events.ts";
import { describeError, type Logger } from "../log.ts";
import type { Registry } from "../metrics.ts";
import { createInternalIpKeeper } from "./internal-ip.ts";
import type { Controller, NodeSource, StatusBoard } from "./types.ts";
import { every, type FirstAfter, singleFlight } from "../loops.ts";
import { monotonicMs } from "../time.ts";

export const defaultKubeletHealthz = "http://127.0.0.1:10248/healthz";

export type HealthControllerDeps = {
  systemd: Systemd;
  kube: Kube;
  nodes: NodeSource;
  events: EventRecorder;
  metrics: Registry;
  status: StatusBoard;
  log: Logger;
  config: NodeAgentConfiguration["controllers"]["healthCheck"];
  kubeletHealthzUrl?: string;
  containerdSocket?: string;
  /** Limit for one probe: a component that does not answer in time is failing (default 5 s). */
  probeTimeoutMs?: number;
  /** The monotonic clock thresholds and flap windows are measured by. */
  clock?: () => number;
  /** The first check waits for this (the agent's start: the OSC's first reconcile goes first). */
  firstAfter?: FirstAfter;
  /** This host's addresses (default: its interfaces'), for the InternalIP kubelet lost. */
  hostAddresses?: () => readonly string[];
};

type Component = "kubelet" | "containerd";

// One component's check and what it has seen so far.
type Check = {
  component: Component;
  unit: string;
  /** Event reason of a restart. */
  reason: string;
  thresholdMs: number;
  /** Resolves with what the component answered; rejects with why it is not healthy. */
  probe: () => Promise<string>;
  state: "unknown" | "healthy" | "failing" | "not installed";
  answer?: string;
  /** When the current run of failures began; undefined while healthy, and again after a restart. */
  failingSince?: number;
  lastError?: string;
  restarts: number;
  lastRestart?: { at: string; error?: string };
  /** Why the check itself could not run (e.g. systemd unreachable); cleared by the next good run. */
  checkError?: string;
};

const update = (c: Check, patch: Partial<Check>): void => void Object.assign(c, patch);

// Units that are not there to restart: the component is not installed (yet), or deliberately masked.
const absent = new Set(["not-found", "masked"]);

export function startHealthController(deps: HealthControllerDeps): Controller {
  const log = deps.log.with({ controller: "health" });
  const now = deps.clock ?? monotonicMs;
  const { config } = deps;
  const timeoutMs = deps.probeTimeoutMs ?? 5_000;
  const failuresTotal = deps.metrics.counter("trellis_health_check_failures_total", "Failed health checks of kubelet and containerd, by component.");
  const restartsTotal = deps.metrics.counter("trellis_health_restarts_total", "Restarts of kubelet or containerd after failing for their threshold, by component.");

  const checks: Check[] = [
    {
      component: "kubelet",
      unit: "kubelet.service",
      reason: "KubeletUnhealthy",
      thresholdMs: config.kubeletFailureThreshold,
      probe: () => kubeletHealthz(deps.kubeletHealthzUrl ?? defaultKubeletHealthz, timeoutMs),
      state: "unknown",
      restarts: 0,
    },
    {
      component: "containerd",
      unit: "containerd.service",
      reason: "ContainerdUnhealthy",
      thresholdMs: config.containerdFailureThreshold,
      probe: async () => `version ${(await containerdVersion(deps.containerdSocket ?? defaultContainerdSocket, timeoutMs)).version}`,
      state: "unknown",
      restarts: 0,
    },
  ];

  // Both series exist from the start, at 0, so a dashboard sees "no failures" rather than nothing.
  for (const c of checks) {
    failuresTotal.inc({ component: c.component }, 0);
    restartsTotal.inc({ component: c.component }, 0);
  }

  async function runCheck(c: Check): Promise<void> {
    let error: string;
    try {
      const answer = await c.probe();
      if (c.state === "failing") log.info(`${c.component} is healthy again`);
      update(c, { state: "healthy", answer, failingSince: undefined, lastError: undefined });
      return;
    } catch (err) {
      error = describeError(err);
    }
    const unit = await deps.systemd.unitStatus(c.unit);
    if (absent.has(unit.loadState)) {
      if (c.state !== "not installed") log.info(`${c.unit} is ${unit.loadState}: not checking ${c.component}`);
      update(c, { state: "not installed", failingSince: undefined, lastError: undefined, answer: undefined });
      return;
    }
    failuresTotal.inc({ component: c.component });
    const at = now();
    if (c.failingSince === undefined) log.warn(`${c.component} health check failed`, { error, restartAfter: formatDuration(c.thresholdMs) });
    c.failingSince ??= at;
    update(c, { state: "failing", lastError: error, answer: undefined });
    if (at - c.failingSince >= c.thresholdMs) await restart(c, at - c.failingSince, error);
  }

  async function restart(c: Check, failedForMs: number, error: string): Promise<void> {
    // Whatever the outcome, the clock starts over: a restarted component gets a full threshold to
    // come back, and a restart that failed is not retried every syncPeriod.
    c.failingSince = undefined;
    const why = `${c.component} has been failing its health check for ${formatElapsed(failedForMs)} (threshold ${formatDuration(c.thresholdMs)}); last error: ${error}`;
    log.warn(`restarting ${c.unit}`, { why });
    let message: string;
    try {
      await deps.systemd.restart(c.unit);
      restartsTotal.inc({ component: c.component });
      c.restarts++;
      c.lastRestart = { at: new Date().toISOString() };
      message = `${why}. Restarted ${c.unit}.`;
    } catch (err) {
      c.lastRestart = { at: new Date().toISOString(), error: describeError(err) };
      message = `${why}. Restarting ${c.unit} failed: ${describeError(err)}`;
      log.error(`could not restart ${c.unit}`, { error: err });
    }
    const node = deps.nodes.current();
    if (node) await deps.events.record({ node: nodeRef(node), type: "Warning", reason: c.reason, message });
  }

  // ---- the Node's InternalIP: one look at a time, at the Node as it is then
  const internalIp = createInternalIpKeeper({ ...deps, log });
  const addresses = singleFlight(async () => {
    const node = deps.nodes.current();
    if (!node) return;
    await internalIp.look(node).catch((err: unknown) => log.error("could not look at the Node's addresses", { error: describeError(err) }));
  });

  // ---- readiness flapping: NotReady → Ready transitions of the Node, from every Node update
  let wasReady = readyOf(deps.nodes.current());
  let becameReady: number[] = [];
  let flapReportedAt: number | undefined;
  const unsubscribe = deps.nodes.subscribe((node) => {
    addresses.trigger("node updated");
    const ready = readyOf(node);
    if (ready === undefined) return; // kubelet has not reported yet
    if (wasReady === false && ready) noteBecameReady(node);
    wasReady = ready;
  });

  function noteBecameReady(node: V1Node): void {
    const at = now();
    becameReady = [...becameReady.filter((t) => at - t < config.readinessFlapWindow), at];
    report();
    if (becameReady.length < config.readinessFlaps) return;
    if (flapReportedAt !== undefined && at - flapReportedAt < config.readinessFlapWindow) return; // once per window
    flapReportedAt = at;
    const message =
      `The Node went from NotReady to Ready ${becameReady.length} times within ${formatDuration(config.readinessFlapWindow)} ` +
      `(threshold ${config.readinessFlaps}): kubelet's readiness is flapping.`;
    log.warn("kubelet readiness is flapping", { transitions: becameReady.length, window: formatDuration(config.readinessFlapWindow) });
    void deps.events.record({ node: nodeRef(node), type: "Warning", reason: "KubeletReadinessFlapping", message });
  }

  function report(): void {
    const at = now();
    const view = (c: Check) => ({
      state: c.state,
      ...(c.answer !== undefined && { answer: c.answer }),
      ...(c.failingSince !== undefined && { failingFor: formatElapsed(at - c.failingSince) }),
      ...(c.lastError !== undefined && { lastError: c.lastError }),
      restarts: c.restarts,
      ...(c.lastRestart && { lastRestart: c.lastRestart }),
      ...(c.checkError !== undefined && { checkError: c.checkError }),
    });
    const line = (c: Check) =>
      c.checkError !== undefined
        ? `${c.component}: cannot check (${c.checkError})`
        : c.state === "failing"
          ? `${c.component} failing${c.failingSince !== undefined ? ` for ${formatElapsed(at - c.failingSince)}` : ""}`
          : `${c.component} ${c.state}`;
    deps.status.set("health", {
      // The controller is doing its job unless it cannot check or its restart failed; a failing
      // kubelet that it is handling is reported in the details, not as the agent being unwell.
      ok: checks.every((c) => c.checkError === undefined && c.lastRestart?.error === undefined),
      summary: checks.map(line).join(", "),
      kubelet: view(checks[0] as Check),
      containerd: view(checks[1] as Check),
      readiness: { becameReadyInWindow: becameReady.filter((t) => at - t < config.readinessFlapWindow).length, window: formatDuration(config.readinessFlapWindow) },
      ...(internalIp.remembered() !== undefined && { internalIP: internalIp.remembered() }),
    });
  }

  const loop = every(config.syncPeriod, async () => {
    addresses.trigger("health check");
    await Promise.all(
      checks.map((c) =>
        runCheck(c).then(
          () => void (c.checkError = undefined),
          (err: unknown) => {
            c.checkError = describeError(err);
            log.error(`could not check ${c.component}`, { error: err });
          },
        ),
      ),
    );
    report();
  }, { firstAfter: deps.firstAfter });

  return {
    stop: async () => {
      unsubscribe();
      await loop.stop();
      await addresses.stop();
    },
  };
}

/** kubelet's health endpoint: healthy is HTTP 200 within the timeout, as gardener-node-agent counts it. */
export async function kubeletHealthz(url: string, timeoutMs: number): Promise<string> {
  let res: Response;
  try {
    res = await fetch(url, { signal: AbortSignal.timeout(timeoutMs), redirect: "manual" });
  } catch (err) {
    const timedOut = err instanceof Error && err.name === "TimeoutError";
    throw new Error(`GET ${url}: ${timedOut ? `no answer within ${timeoutMs} ms` : describeError(err)}`, { cause: err });
  }
  const body = (await res.text().catch(() => "")).trim().slice(0, 200);
  if (res.status !== 200) throw new Error(`GET ${url}: HTTP ${res.status}${body ? `: ${body}` : ""}`);
  return body;
}

/** true/false from the Node's Ready condition (Unknown counts as not ready); undefined when it has none. */
function readyOf(node: V1Node | undefined): boolean | undefined {
  const c = node?.status?.conditions?.find((x) => x.type === "Ready");
  return c ? c.status === "True" : undefined;
}

