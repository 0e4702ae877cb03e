// The model's agent for the new design: the real startRollout (src/controllers/rollout/controller.ts) on
// every machine, and through it the real state machine (src/rollout/machine.ts, persisted in rollout.json
// on the machine's disk), the pool's tickets, record and leader (src/kube/pool-leases.ts, pool-leader.ts)
// over the model's LeaseApi port, the gate's looks (src/controllers/health-gate.ts over the simulated
// systemd and Node) and the rollout's Node condition (report.ts, patched through client-node).
//
// Around it, the OSC controller's part in a rollout, transcribed from src/controllers/osc/ (line numbers as
// of commit 5ea12ae: controller.ts the wiring, reconcile.ts the stages, rollout.ts admit and rollBack) with
// what is not the rollout's left out: Secret parsing, image resolution and the plan
// (the world hands over what a node applies, and Host.restarts is the plan's restarts), the reconciliation
// delay and the serial lease (not set in the model), in-place updates, self-updates, events, the OSC's own
// condition. Applies are the machine's (Host.apply: atomic and complete), so `applied` is always complete.
import type { V1Node } from "@kubernetes/client-node";
import { paths } from "../../src/api/paths.ts";
import { parseRolloutSettings, poolLabel } from "../../src/api/rollout.ts";
import { effectiveChecksumAnnotation } from "../../src/api/layers.ts";
import { nodeAppliedChecksum } from "../../src/controllers/osc/delay.ts";
import { gatesFor } from "../../src/controllers/osc/gates.ts";
import { type Decision, type Rollout, startRollout } from "../../src/controllers/rollout/controller.ts";
import type { NodeSource } from "../../src/controllers/types.ts";
import type { BootClockReading } from "../../src/host/boot-clock.ts";
import { patchNodeMetadata } from "../../src/kube/node.ts";
import type { Fields, Logger } from "../../src/log.ts";
import { describeError } from "../../src/log.ts";
import { singleFlight } from "../../src/loops.ts";
import { countsAsDisruptive } from "../../src/plan/disruption.ts";
import { decodePool, decodeTicket, grantAnnotation, holdersAnnotation, type PoolRecord, requestAnnotation, slotsLabel, slotsLeaseName, type Ticket, ticketLabel } from "../../src/rollout/pool.ts";
import { nodeTicketName } from "../../src/kube/pool-leases.ts";
import type { Work } from "../../src/rollout/machine.ts";
import { backoffDelay } from "../../src/time.ts";
import type { AgentEnv, Driver } from "./driver.ts";
import { type Content, parseContent } from "./osc-model.ts";

/** When to reconcile again, on the monotonic clock (osc/context.ts:50). */
type Wait = { atMs: number; why: string };

/** The agent's default controllers.operatingSystemConfig.syncPeriod (src/api/agent-config.ts). */
const syncPeriodMs = 10 * 60_000;
/** systemdUnitCheck.stuckThreshold's default, which cli/run.ts:129 passes to startRollout. */
const stuckThresholdMs = 5 * 60_000;
/** The gate looks once a second (startRollout's default, stated). */
const lookEveryMs = 1_000;
const appliedChecksumAnnotation = "checksum/cloud-config-data";

export function newDriver(): Driver {
  return {
    name: "new (src/rollout, src/kube/pool-*, src/controllers/rollout)",
    // loops.ts `every` and `later` (the gate's looks, the leader's renewals, the ticket's re-read) sleep on
    // the global setTimeout, and report.ts stamps conditions with new Date(): the run swaps them for virtual ones.
    globals: true,
    start: (env) => startNewAgent(env),
    describeLease: (lease) => {
      const a = lease.metadata?.annotations ?? {};
      const rev = (json: string | undefined, key: string) => (json ? String((JSON.parse(json) as Record<string, unknown>)[key]).slice(0, 8) : undefined);
      if (lease.metadata?.labels?.[ticketLabel]) {
        const request = rev(a[requestAnnotation], "revision");
        const grant = a[grantAnnotation] ? `${rev(a[grantAnnotation], "revision")}${(JSON.parse(a[grantAnnotation]) as { stopped?: string }).stopped ? " stopped" : ""}` : undefined;
        return request || grant ? `asks ${request ?? "-"}, granted ${grant ?? "-"}` : "asks nothing";
      }
      if (a[holdersAnnotation] === undefined) return undefined;
      const record = decodePool(a, "record");
      if (!record.ok) return "unreadable";
      const holders = record.value.holders.map((h) => `${h.node}@${h.revision.slice(0, 8)}`).join(" ") || "none";
      return `holders ${holders}${record.value.failed ? `, failed ${record.value.failed.revision.slice(0, 8)}` : ""}`;
    },
    stopped: (store, pool) => {
      const failed = records(store, pool)[0]?.failed;
      return failed && { revision: failed.revision, node: failed.node, ...(failed.changes ? { changes: failed.changes } : {}) };
    },
    holders: (store, pool) =>
      records(store, pool)
        .flatMap((r) => r.holders)
        // A holder gives its slot back on its ticket (it asks for nothing); the leader drops it from the record later.
        .filter((h) => ticketOf(store, pool, h.node)?.request !== undefined)
        .map((h) => h.node),
  };
}

/**
 * The record's shards as the store has them, shard 0 first. Unreadable is the protocol's own failure (it
 * admits nobody then); the model must not read it as "nobody holds".
 */
function records(store: Parameters<Driver["holders"]>[0], pool: { secretName: string; namespace: string }): PoolRecord[] {
  const shard0 = store.peek("leases", pool.namespace, slotsLeaseName(pool.secretName));
  const others = store.list("leases", pool.namespace, `${slotsLabel}=${pool.secretName}`).items.filter((l) => l.metadata?.name !== slotsLeaseName(pool.secretName));
  return [shard0, ...others].map((lease) => {
    const name = lease?.metadata?.name ?? slotsLeaseName(pool.secretName);
    const r = decodePool(lease?.metadata?.annotations, `Lease ${pool.namespace}/${name}`);
    if (!r.ok) throw new Error(r.errors.join("; "));
    return r.value;
  });
}

/** A node's ticket as the store has it (undefined: none, or unreadable). */
function ticketOf(store: Parameters<Driver["holders"]>[0], pool: { secretName: string; namespace: string }, node: string): Ticket | undefined {
  const name = nodeTicketName(pool.secretName, node);
  const lease = store.peek("leases", pool.namespace, name);
  const r = lease && decodeTicket(node, lease.metadata?.annotations, `Lease ${pool.namespace}/${name}`);
  return r?.ok ? r.value : undefined;
}

/**
 * The agent's logs as lines of the run's trace, each line once until another comes (a look that fails every
 * second while the machine is cut off would fill the trace).
 */
function traceLogger(env: AgentEnv, base: Fields = {}, last: { line?: string } = {}): Logger {
  const line = (level: string, msg: string, fields?: Fields) => {
    const all = { ...base, ...fields };
    const detail = Object.entries(all)
      .filter(([k]) => k !== "controller")
      .map(([k, v]) => `${k}=${typeof v === "string" ? v.slice(0, 100) : JSON.stringify(v)}`)
      .join(" ");
    const text = `${level} ${msg}${detail ? ` (${detail})` : ""}`;
    if (text !== last.line) env.note(text);
    last.line = text;
  };
  return {
    debug: () => undefined,
    info: (m, f) => line("info", m, f),
    warn: (m, f) => line("WARN", m, f),
    error: (m, f) => line("ERROR", m, f),
    with: (fields) => traceLogger(env, { ...base, ...fields }, last),
    setLevel: () => undefined,
  };
}

/** The agent's NodeSource (src/controllers/node-source.ts) over the machine's view of its Node. */
function nodeSource(env: AgentEnv): NodeSource {
  return { current: () => env.nodes.current(), subscribe: (l) => env.nodes.subscribe(l), found: new Promise<V1Node>(() => undefined), listed: Promise.resolve() };
}

function startNewAgent(env: AgentEnv): void {
  const now = env.mono;
  const log = traceLogger(env);
  const node = nodeSource(env);
  const source = `Secret kube-system/${env.secretName}`;
  // /proc's boot id and time since boot, as the machine's virtual boot gives them.
  const bootClock = (): BootClockReading => ({ bootId: env.boot.id, uptimeMs: env.mono() - env.boot.atMs, wallMs: env.wall() });
  const rollout: Rollout = startRollout({
    kube: env.kube,
    files: env.files,
    systemd: env.host.systemd,
    store: env.host.stateStore,
    // Events are accepted and dropped by the model's API: not sending them spares a client-node request each.
    events: { record: async () => undefined },
    node,
    status: { set: () => undefined, snapshot: () => ({}) },
    log,
    secretName: env.secretName,
    stuckThresholdMs,
    leases: env.leases("kube-system"),
    bootClock,
    clock: env.mono,
    wallNow: () => new Date(env.wall()),
    lookEveryMs,
    // Shards of two holders: the model's pools (k up to 5) spread over several, as a 5,000-node pool's do.
    shardCapacity: 2,
  });

  // osc/controller.ts:58 (state.failures), osc/context.ts:89-96 (periodic, retryWait)
  let failures = 0;
  // For the trace: a decision is noted when it changes, not at every reconcile.
  let lastDecision: string | undefined;
  const periodic = (): Wait => ({ atMs: now() + syncPeriodMs, why: "periodic re-check" });
  const retryWait = (why: string): Wait => {
    failures++;
    return { atMs: now() + backoffDelay(failures, { initialMs: 1000, maxMs: 256_000 }, 1), why: `retry after ${why}` };
  };

  // osc/controller.ts:73-98: single flight, the next pass on a timer replaced after each pass.
  let timer: number | undefined;
  const schedule = (wait: Wait) => {
    env.clearTimer(timer);
    timer = env.setTimer(() => passes.trigger(wait.why), Math.max(0, wait.atMs - now()));
  };
  const reconcileOnce = async (): Promise<void> => {
    const wait = await reconcile().catch((err: unknown) => {
      env.note(`reconcile failed: ${describeError(err).slice(0, 160)}`);
      return retryWait("reconcile error");
    });
    schedule(wait);
  };
  const passes = singleFlight(reconcileOnce);
  // osc/controller.ts:120: every Secret event.
  env.secret.subscribe(() => passes.trigger("secret changed"));
  // osc/controller.ts:136, 168-187: the Node's labels pick the overlays.
  let layeredSecret = false;
  let labelsSeen = JSON.stringify(node.current()?.metadata?.labels ?? {});
  node.subscribe((n) => {
    const labelsNow = JSON.stringify(n.metadata?.labels ?? {});
    const labelsChanged = labelsNow !== labelsSeen;
    labelsSeen = labelsNow;
    if (layeredSecret && labelsChanged) passes.trigger("node labels changed (the Secret has overlays)");
  });
  // osc/controller.ts:138
  rollout.onChange(() => passes.trigger("rollout decision changed"));
  passes.trigger("start");

  /** osc/reconcile.ts:61-256 (reconcile, resolve, passGates, applyAndReport), the rollout's part. */
  async function reconcile(): Promise<Wait> {
    const secret = env.secret.current();
    if (!secret) {
      // reconcile.ts resolve: a rollback the rollout asks for goes on without the Secret (osc/rollout.ts rollBackPending).
      if ((await rollout.pending()).do === "apply") return rollBack((await rollout.state()).current?.work.checksum ?? "?");
      return periodic();
    }
    // reconcile.ts:79-80
    const parsed = parseRolloutSettings(secret.annotations, source);
    if (parsed.ok) rollout.observe({ secretUid: secret.uid, settings: parsed.value });
    // reconcile.ts:90-97, 149: what this node applies (overlays picked by its Node's labels), and the Secret's revision.
    const current = node.current();
    const { base, checksum, content, bytes } = secret.layered(current?.metadata?.labels ?? {});
    layeredSecret = secret.revisionChecksum !== base;
    if (!parsed.ok) return periodic(); // reconcile.ts:129 (invalid: nothing changes on the node)
    const settings = parsed.value;
    // reconcile.ts:161; the model sets no reconciliation delay and no serial rollout, so no hold (:162-169).
    const gates = gatesFor({ checksum, stateApplied: env.host.lastApplied(), nodeApplied: nodeAppliedChecksum(current), serial: false });
    let admitted = false;
    if (gates.admit) {
      // reconcile.ts passGates; the plan's restarts (Host.restarts) and its step count stand for planForNode's.
      const kind = gates.kind === "current" ? "drift" : "osc";
      const admission = await admit({ kind, checksum, base, revision: secret.revisionChecksum }, content, settings.disruptiveUnits);
      if ("wait" in admission) return admission.wait;
      admitted = admission.admitted;
    }
    // reconcile.ts applyAndReport: applyDesired, which records last-applied-osc.yaml with the state (apply.ts).
    await apply(content, bytes, checksum);
    // The rollout hears how the apply ended only when it admitted it (bebcfc6).
    if (admitted) await rollout.applied({ complete: true, checksum });
    else await rollout.baseline({ checksum, base });
    failures = 0;
    // reconcile.ts:247 reportSuccess with the Node as it is now
    await reportSuccess(node.current(), { base, checksum });
    return periodic();
  }

  /** osc/rollout.ts:33-41 */
  async function admit(w: Omit<Work, "disruption">, content: Content, patterns: readonly string[]): Promise<{ admitted: boolean } | { wait: Wait }> {
    // disruptionOf (plan/disruption.ts): the counted units the plan restarts or stops; the model's files are
    // none a running process reads without a restart, so no paths.
    const disruption = { units: env.host.restarts(content).filter((u) => countsAsDisruptive(u, patterns)), paths: [] };
    // changesOf (plan/disruption.ts): one digest per unit or file written, the same on every node for the same change.
    const changes = changedEntries(content);
    // carriesOf (plan/disruption.ts): every unit and file version the node is left with.
    const carries = [...Object.entries(content.units), ...Object.entries(content.files)].map(([k, v]) => `${k}@${v}`);
    // osc/rollout.ts admit: a no-op re-check asks nothing of the rollout, unless an OSC's work is under way there.
    const current = (await rollout.state()).current;
    if (planSteps(content) === 0 && (!current || current.work.kind === "restart")) return { admitted: false };
    const decision = await rollout.offer({ ...w, disruption, carries, ...(changes.length > 0 ? { changes } : {}) });
    noteDecision(w, decision);
    if (decision.do === "apply") return decision.target === "last-good" ? { wait: await rollBack(w.checksum) } : { admitted: true };
    return { wait: decision.do === "hold" ? { atMs: now() + decision.retryAfterMs, why: decision.reason } : periodic() };
  }

  /** osc/rollout.ts:44-65 */
  async function rollBack(failed: string): Promise<Wait> {
    const back = await rollout.lastGood();
    if (!back) throw new Error(`rolling back from OSC ${failed.slice(0, 12)}: no last good OSC is kept`);
    env.note(`rolls back from ${failed.slice(0, 8)} to ${back.checksum.slice(0, 8)}`);
    await apply(parseContent(back.osc), back.osc, back.checksum);
    await rollout.applied({ complete: true, checksum: back.checksum });
    await reportSuccess(node.current(), { base: back.base, checksum: back.checksum });
    return periodic();
  }

  /** applyDesired: the OSC's bytes recorded as applied (paths.appliedOsc, what keepLastGood copies) with the apply. */
  async function apply(content: Content, bytes: Uint8Array, checksum: string): Promise<void> {
    await env.files.writeAtomic(paths.appliedOsc, bytes, 0o600);
    await env.host.apply(content, checksum);
  }

  /** The units and files that differ from what runs, each as name@version: planForNode's write steps. */
  function changedEntries(content: Content): string[] {
    const running = env.host.running();
    const differ = (want: Record<string, string>, have: Record<string, string> | undefined) => Object.entries(want).filter(([k, v]) => have?.[k] !== v).map(([k, v]) => `${k}@${v}`);
    return [...differ(content.units, running?.units), ...differ(content.files, running?.files)];
  }

  /** How many steps planForNode's plan has. */
  const planSteps = (content: Content) => changedEntries(content).length;

  function noteDecision(w: Omit<Work, "disruption">, d: Decision): void {
    const text = d.do === "hold" ? `hold: ${d.reason}` : d.do === "apply" ? `apply ${d.target}` : "wait (gate)";
    const key = `${w.kind} ${w.checksum.slice(0, 8)} ${text}`;
    if (key !== lastDecision) env.note(`${w.kind} ${w.checksum.slice(0, 8)} (rev ${w.revision.slice(0, 8)}): ${text}`);
    lastDecision = key;
  }

  /** osc/report.ts:58-79 and :98-111, the Node metadata part: the checksums (and the pool label) patched when they differ. */
  async function reportSuccess(n: V1Node | undefined, ids: { base: string; checksum: string }): Promise<void> {
    if (!n) return;
    const wanted = {
      annotations: { [appliedChecksumAnnotation]: ids.base, [effectiveChecksumAnnotation]: ids.checksum === ids.base ? null : ids.checksum },
      labels: { [poolLabel]: env.secretName },
    };
    const have: Record<string, string> = { ...n.metadata?.labels, ...n.metadata?.annotations };
    if (Object.entries({ ...wanted.labels, ...wanted.annotations }).some(([k, v]) => (have[k] ?? null) !== v)) {
      await patchNodeMetadata(env.kube, n.metadata?.name as string, wanted);
    }
  }
}
