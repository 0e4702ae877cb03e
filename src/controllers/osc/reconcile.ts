// One reconcile of the OSC controller, in three stages over the controller's context: resolve what the
// Secret asks of this node (`resolve`), pass the gates before anything changes (`passGates`: Gardener's
// reconciliation delay and serial lease, trellis's rollout admission), and apply the admitted plan and
// report it (`applyAndReport`). Each stage either hands the next one what it found or says when to
// reconcile again. The controller's wiring is controller.ts.
import type { V1Secret } from "@kubernetes/client-node";
import { stringify } from "yaml";
import { decodeBase64 } from "../../api/base64.ts";
import { type Desired, oscChecksum, secretRefsOf } from "../../api/desired.ts";
import type { InPlaceChanges } from "../../api/in-place-state.ts";
import { type Layered, layeredChecksum, layerOsc, type Overlay, parseOverlays } from "../../api/layers.ts";
import type { OperatingSystemConfig } from "../../api/osc.ts";
import { oscDataKey } from "../../api/paths.ts";
import type { Plan } from "../../api/plan.ts";
import type { Result } from "../../api/result.ts";
import { parseRolloutSettings, type RolloutSettings } from "../../api/rollout.ts";
import type { AgentState, Owned } from "../../api/state.ts";
import { applyDesired } from "../../apply/apply.ts";
import { desiredForNode, type RegistryWait } from "../../apply/desired-for-node.ts";
import { planForNode } from "../../apply/observe.ts";
import { checkSelfUpdate } from "../../apply/self-update.ts";
import { coreV1 } from "../../kube/api.ts";
import { isSerialRollout, type SerialGate } from "../../kube/serial-gate.ts";
import { describeError } from "../../log.ts";
import { every } from "../../loops.ts";
import { carriesOf } from "../../plan/disruption.ts";
import { hasInPlaceChanges, removingCpuManagerState } from "../../plan/in-place.ts";
import { endsInPlace } from "../in-place.ts";
import { describeStep } from "../../plan/render.ts";
import { awaitRegistries, awaitStaticPods } from "./before-report.ts";
import { noted, type OscContext, periodic, result, retryWait, type Wait, withoutData } from "./context.ts";
import { delayRemaining, nodeAppliedChecksum, noteFirstSeen } from "./delay.ts";
import { firstHold, type Gates, gatesFor, giveUpSerialLease, holdAfterFailure, serialCoolOffLeft } from "./gates.ts";
import { finishInPlace, holdInPlace, inPlaceInterrupted } from "./in-place.ts";
import { invalid, labelRoleAndZone, reportFailure, reportSuccess } from "./report.ts";
import { recognizeApplied } from "./recorded.ts";
import { admit, rollBackPending, toWeigh } from "./rollout.ts";
import { giveUpLease, saveSerial, serialGate, serialIdentity, serialState } from "./serial.ts";

/** Unit jobs can take minutes: the serial lease (600 s) is renewed this often while an apply runs under it. */
const serialRenewMs = 60_000;

/** What the Secret asks of this node, resolved. */
type Resolved = {
  secret: V1Secret;
  base: string;
  checksum: string;
  layered: Layered & { revision: string };
  /**
   * What is recorded as applied (last-applied-osc.yaml, the rollback target): the layered OSC. Undefined
   * when osc.yaml's bytes were let go of: this OSC is recorded already.
   */
  applied: Uint8Array | undefined;
  desired: Desired;
  /** Registries applied without, as their readiness probe has not answered yet. */
  waitingFor: RegistryWait[];
  state: AgentState;
  inPlaceWork: InPlaceChanges;
  settings: RolloutSettings;
};

/**
 * What the gates decided: the plan to apply (undefined: resume this OSC's unfinished one), the serial lease
 * held, if any, and whether the apply runs on the rollout's word (`admitted`: the rollout hears how it ended).
 */
type Passed = { gates: Gates; identity: string; admitted: boolean; planned?: { plan: Plan; owned: Owned }; gate?: SerialGate };

export async function reconcile(ctx: OscContext, why: string): Promise<Wait> {
  ctx.state.status.reconciles++;
  const cpuAtStart = process.cpuUsage();
  // The Secret's list may come before the Node's at the start: what the Node says (its applied checksum,
  // its reconciliation delay, its labels that overlays pick by) is known before anything is decided.
  if (ctx.state.secret && !ctx.deps.node.current()) await ctx.deps.node.listed;
  if (!ctx.state.startedWithSecret && ctx.state.secret) {
    ctx.state.startedWithSecret = true;
    const recognized = await recognizeApplied(ctx, () => cpuMsSince(cpuAtStart));
    if (recognized) return recognized;
  }
  if (!ctx.deps.node.current()) ctx.state.ranWithoutNode = true;
  const r = await resolve(ctx, why);
  if ("wait" in r) return r.wait;
  const passed = await passGates(ctx, r);
  if ("wait" in passed) return passed.wait;
  return applyAndReport(ctx, r, passed, cpuAtStart);
}

async function resolve(ctx: OscContext, why: string): Promise<Resolved | { wait: Wait }> {
  const { deps, state } = ctx;
  const secret = state.secret;
  if (!secret) {
    // A gate that failed while the Secret cannot be read (an agent restarted after its change cut the node off
    // from the API server) still rolls back: the last good OSC is on disk.
    if ((await deps.rollout.pending()).do === "apply") return { wait: await rollBackPending(ctx) };
    result(ctx, "waiting");
    ctx.log.info("waiting for the OSC Secret", { secret: `kube-system/${deps.secretName}`, why });
    return { wait: periodic(ctx) };
  }
  const source = `Secret kube-system/${deps.secretName}`;
  // The rollout settings first: requested restarts go through them even while the OSC is invalid or cannot be resolved.
  const rollout = parseRolloutSettings(secret.metadata?.annotations, source);
  if (rollout.ok) deps.rollout.observe({ secretUid: secret.metadata?.uid ?? "", settings: rollout.value });
  // osc.yaml's bytes, or (let go of once its OSC was applied) its checksum alone.
  let bytes: Uint8Array | undefined;
  let base: string;
  if (state.letGo === undefined) {
    const encoded = secret.data?.[oscDataKey];
    if (encoded === undefined) return { wait: await invalid(ctx, "missing", [`${source}: has no data["${oscDataKey}"]`]) };
    bytes = decodeBase64(encoded);
    if (!bytes) return { wait: await invalid(ctx, "undecodable", [`${source}: data["${oscDataKey}"] is not valid base64`]) };
    // Gardener's checksum: of the bytes as they are, never of a re-encoded text. The Node's
    // checksum/cloud-config-data names it; with overlays matching this node, what the node applies has
    // a checksum of its own (`checksum`), for everything else.
    base = oscChecksum(bytes);
  } else base = state.letGo;
  const refuse = async (errors: string[]) => {
    noted(ctx, base);
    state.status.lastChecksum = base;
    return { wait: await invalid(ctx, base, errors) };
  };
  const parsed = await ctx.parser.parse(bytes, base, source);
  if (!parsed) return readSecretAgain(ctx, why, "its kept parse cannot be read");
  if (!parsed.ok) return refuse(parsed.errors);
  // Before anything can hold the OSC back or fail it, as gardener-node-agent does.
  await labelRoleAndZone(ctx, parsed.value);
  const layered = layersFor(ctx, secret, parsed.value, { base, bytes }, source);
  if (!layered.ok) return refuse(layered.errors);
  const { matched } = layered.value;
  const checksum = checksumWith({ base, bytes }, matched);
  noted(ctx, checksum);
  state.status.lastChecksum = checksum;
  const applied = matched.length > 0 ? new TextEncoder().encode(stringify(layered.value.osc)) : bytes;
  // Read once for this reconcile: its one writer, the apply, runs after resolving.
  const agentState = await deps.store.read();
  // The bytes are recorded when this OSC is applied (again: a rollback recorded another since).
  if (!applied && agentState.lastApplied?.checksum !== checksum) return readSecretAgain(ctx, why, "it is to be recorded as applied");
  const resolved = await desiredForNode(layered.value.osc, source, {
    files: deps.files,
    hostName: deps.hostName,
    readSecret: (name) => ctx.secretRefs.read(name),
    images: deps.images,
    log: ctx.log,
    signal: ctx.stopping,
    provenance: layered.value.provenance,
    ignored: parsed.ignored,
  });
  await ctx.secretRefs.keepOnly(secretRefsOf(layered.value.osc, deps.hostName));
  if (!resolved.ok) {
    const wait = await invalid(ctx, checksum, resolved.errors);
    return { wait: resolved.retry ? retryWait(ctx, "an image could not be fetched, or containerd did not say its version") : wait };
  }
  const selfUpdateProblem = await checkSelfUpdate(resolved.value, {
    files: deps.files,
    selfBinary: deps.selfBinary,
    configDir: deps.configDir,
    log: ctx.log,
    ...(agentState.owned.files[deps.selfBinary] ? { installed: agentState.owned.files[deps.selfBinary]?.sha256 } : {}),
  });
  if (selfUpdateProblem) return { wait: await invalid(ctx, checksum, [selfUpdateProblem]) };
  const inPlaceWork = await ctx.inPlace.work(layered.value.osc, checksum, source);
  if (!inPlaceWork.ok) return { wait: await invalid(ctx, checksum, inPlaceWork.errors) };
  if (hasInPlaceChanges(inPlaceWork.value)) {
    const waiting = ctx.inPlace.awaitDrain(inPlaceWork.value);
    if (waiting) return { wait: await holdInPlace(ctx, checksum, "InPlaceUpdatePending", waiting) };
  }
  if (!rollout.ok) return { wait: await invalid(ctx, checksum, rollout.errors) };
  return { secret, base, checksum, layered: layered.value, applied, desired: resolved.value, waitingFor: resolved.waitingFor, state: agentState, inPlaceWork: inPlaceWork.value, settings: rollout.value };
}

/** osc.yaml's checksum, or (held only while they are needed) its bytes. */
type OscYaml = { base: string; bytes: Uint8Array | undefined };

/** The checksum of osc.yaml with `overlays`: its own without any (a Secret with overlays keeps its bytes). */
function checksumWith(osc: OscYaml, overlays: readonly Overlay[]): string {
  if (overlays.length === 0) return osc.base;
  if (!osc.bytes) throw new Error("osc.yaml's bytes were let go of while the Secret has overlays");
  return layeredChecksum(osc.bytes, overlays);
}

/**
 * The Secret read from the API server, its data needed again, and this reconcile's resolving begun over
 * with it (the Secret then holds its data, this time resolves with its bytes). A failed read is this
 * reconcile's error, retried.
 */
async function readSecretAgain(ctx: OscContext, why: string, needed: string): Promise<Resolved | { wait: Wait }> {
  const name = ctx.deps.secretName;
  ctx.log.info("reading the OSC Secret again", { secret: `kube-system/${name}`, why: needed });
  ctx.state.secret = await coreV1(ctx.deps.kube).readNamespacedSecret({ name, namespace: "kube-system" });
  ctx.state.letGo = undefined;
  return resolve(ctx, why);
}

/**
 * The OSC with the Secret's overlays that match this Node's labels (none before the Node is known), and
 * the Secret's revision: osc.yaml and every overlay, what the pool's rollout admits and stops.
 */
function layersFor(ctx: OscContext, secret: V1Secret, osc: OperatingSystemConfig, yaml: OscYaml, source: string): Result<Layered & { revision: string }> {
  const data: Record<string, Uint8Array> = {};
  for (const [key, encoded] of Object.entries(secret.data ?? {})) {
    if (!key.startsWith("overlay")) continue;
    const decoded = decodeBase64(encoded);
    if (!decoded) return { ok: false, errors: [`${source}: data["${key}"] is not valid base64`] };
    data[key] = decoded;
  }
  const overlays = parseOverlays(data, source);
  if (!overlays.ok) return overlays;
  ctx.state.layeredSecret = overlays.value.length > 0;
  const layered = layerOsc(osc, overlays.value, ctx.deps.node.current()?.metadata?.labels ?? {}, source);
  return layered.ok ? { ok: true, value: { ...layered.value, revision: checksumWith(yaml, overlays.value) } } : layered;
}

async function passGates(ctx: OscContext, r: Resolved): Promise<Passed | { wait: Wait }> {
  const { deps } = ctx;
  const { checksum } = r;
  // Only a valid OSC starts the reconciliation delay: an invalid one changes nothing on the node, this
  // record included (the bad-input corpus hashes the state directory too).
  await noteFirstSeen(ctx, checksum);
  const current = deps.node.current();
  const identity = serialIdentity(deps.hostName);
  const serial = isSerialRollout(r.secret);
  const gates = gatesFor({ checksum, stateApplied: r.state.lastApplied?.checksum, nodeApplied: nodeAppliedChecksum(current), serial });
  const hold = firstHold(gates, {
    delayLeftMs: gates.delay ? delayRemaining(ctx, current, checksum) : 0,
    coolOffLeftMs: gates.serial ? serialCoolOffLeft((await serialState(ctx)).gaveUp, checksum, ctx.bootClock(), r.settings.serialHoldLimitMs) : 0,
  });
  if (hold) {
    ctx.log.info(hold.message, { checksum, remainingMs: Math.round(hold.ms) });
    return { wait: { atMs: ctx.now() + hold.ms, why: hold.why } };
  }
  // One planning pass: the plan the admission weighs is the plan applied (an unfinished apply of this OSC
  // resumes its persisted plan; the rollout state keeps what its admission weighed).
  const planned = r.state.progress?.checksum === checksum ? undefined : await planForNode({ desired: r.desired, checksum, owned: r.state.owned, files: deps.files, systemd: deps.systemd, selfUnit: deps.selfUnit });
  const inPlaceUpdate = hasInPlaceChanges(r.inPlaceWork);
  let admitted = false;
  if (gates.admit) {
    const kind = inPlaceUpdate ? "in-place" : gates.kind === "current" ? "drift" : "osc";
    const admission = await admit(ctx, { checksum, base: r.base, revision: r.layered.revision, kind, carries: carriesOf(r.desired) }, toWeigh(planned?.plan, r.state.progress, checksum), r.settings);
    if ("wait" in admission) return admission;
    admitted = admission.admitted;
  }
  if (inPlaceUpdate) await ctx.inPlace.begin(checksum, r.inPlaceWork);
  if (serial && !gates.serial && !ctx.state.leftoverLeaseChecked) {
    // A crash between the report of a successful apply and the release would hold up the rollout until
    // the lease expires: give back a lease this node still holds.
    ctx.state.leftoverLeaseChecked = true;
    await serialGate(ctx, identity).release();
  }
  const gate = gates.serial ? serialGate(ctx, identity) : undefined;
  if (gate) {
    const decision = await gate.acquire();
    if (!decision.held) {
      ctx.log.info("another node is applying this OSC (serial rollout)", { holder: decision.holder, retryAfterMs: decision.retryAfterMs });
      // Jittered, so that waiting nodes do not all ask at the same instant.
      return { wait: { atMs: ctx.now() + decision.retryAfterMs * (0.5 + Math.random() / 2), why: "serial lease may be free" } };
    }
  }
  return { gates, identity, admitted, ...(planned ? { planned } : {}), ...(gate ? { gate } : {}) };
}

async function applyAndReport(ctx: OscContext, r: Resolved, p: Passed, cpuAtStart: ReturnType<typeof process.cpuUsage>): Promise<Wait> {
  const { deps, log } = ctx;
  const { checksum, base } = r;
  const started = ctx.now();
  const startedBoot = ctx.bootClock();
  const gate = p.gate;
  const renewal = gate ? every(serialRenewMs, () => gate.renew().catch((err: unknown) => log.warn("could not renew the serial lease", { error: describeError(err) })), { firstAfterInterval: true }) : undefined;
  const outcome = await applyDesired(r.desired, checksum, r.applied, {
    files: deps.files,
    systemd: deps.systemd,
    store: deps.store,
    log,
    selfUnit: deps.selfUnit,
    ...(p.planned ? { planned: p.planned } : {}),
    ...(r.inPlaceWork.cpuManagerPolicy ? { amend: removingCpuManagerState } : {}),
  }).finally(() => renewal?.stop());
  ctx.state.executed = outcome.executed;
  log.info(outcome.complete ? "OSC applied" : "OSC apply incomplete", {
    checksum,
    steps: outcome.executed.length,
    failures: outcome.failures.length,
    resumed: outcome.resumed,
    durationMs: ctx.now() - started,
    // The process's CPU (every thread: the runtime's compiler and GC too) since the reconcile began:
    // with the wall time above, whether a slow one worked or waited (for the CPU, systemd, the disk).
    cpuMs: cpuMsSince(cpuAtStart),
    restarted: outcome.executed.flatMap((s) => (s.kind === "restart" ? [s.unit] : [])),
  });
  if (!outcome.complete) {
    const error = outcome.failures.map((f) => `${describeStep(f.step)}: ${f.error}`).join("; ");
    result(ctx, "failed", error);
    // Under its admission the retry stays gated, and the gate's timeout runs on (a unit that never comes up fails it).
    if (p.admitted) await deps.rollout.applied({ complete: false, error, checksum });
    // The hold first: an agent killed while it reports must not lose it.
    const hold = gate ? holdAfterFailure((await serialState(ctx)).hold, checksum, startedBoot, error) : undefined;
    if (hold) await saveSerial(ctx, { ...(await serialState(ctx)), hold });
    await reportFailure(ctx, deps.node.current(), checksum, outcome);
    if (gate && hold && giveUpSerialLease(hold, ctx.bootClock(), r.settings.serialHoldLimitMs)) return giveUpLease(ctx, gate, p.identity, hold, r.settings.serialHoldLimitMs);
    return retryWait(ctx, "a failed apply"); // the serial lease stays ours: the rollout stops here
  }
  // The report waits (before-report.ts) as gardener-node-agent's does: for the probed registries before
  // the in-place update is finished, for the static pods after it. The serial lease stays ours meanwhile.
  const registries = await awaitRegistries(ctx, checksum, r.waitingFor);
  if (registries) return registries;
  if (endsInPlace(r.layered.osc, nodeAppliedChecksum(deps.node.current()), checksum)) {
    // As gardener-node-agent: with the agent's own restart under way (its configuration changed with a
    // kubelet minor version, say), the rest of the in-place update is left to its next start.
    if (outcome.restartingSelf) return inPlaceInterrupted(ctx, checksum, "the agent restarts itself after this apply");
    const wait = await finishInPlace(ctx, checksum, r.inPlaceWork, r.layered.osc.status?.inPlaceUpdates?.osUpdate);
    if (wait) return wait;
  }
  const staticPods = await awaitStaticPods(ctx, checksum, r.desired);
  if (staticPods) return staticPods;
  // The gate starts now; it runs in the rollout controller, which says when a rollback is to be applied.
  if (p.admitted) await deps.rollout.applied({ complete: true, checksum });
  else await deps.rollout.baseline({ checksum, base });
  ctx.state.failures = 0;
  const held = await serialState(ctx);
  if (held.hold || held.gaveUp) await saveSerial(ctx, { version: 1 });
  result(ctx, "applied");
  for (const step of outcome.executed) if (step.kind === "restart") ctx.metrics.restarts.inc({ unit: step.unit });
  ctx.state.appliedChecksum = checksum;
  // The Node as it is now: it may have registered (or its watch synced) while the apply ran.
  const node = deps.node.current();
  await reportSuccess(ctx, node, { base, checksum }, r.desired, outcome);
  // Released once the Node shows the OSC as applied, as gardener-node-agent releases it: the next node
  // starts then. A node kubelet has not registered yet keeps it until it reports (the Node's arrival wakes
  // this controller), as one whose report failed does until its retry.
  if (node) await gate?.release();
  // Housekeeping after the report: the Node says the OSC is applied as soon as it is.
  await ctx.parser.keep(base);
  letGoOfData(ctx, r);
  await pruneImages(ctx, r.desired);
  return periodic(ctx);
}

/**
 * Once its OSC is applied and its parse kept, the Secret's data is not held (1.3 MiB for the 1 MiB OSC, on
 * every node for as long as the OSC stays): a re-check reads the kept parse, a change brings the Secret
 * anew. Kept while the Secret has overlays (their bytes make the checksum), and when the watch delivered
 * another version meanwhile.
 */
function letGoOfData(ctx: OscContext, r: Resolved): void {
  if (ctx.state.secret !== r.secret || ctx.state.layeredSecret || r.checksum !== r.base || ctx.parser.kept() !== r.base) return;
  ctx.state.secret = withoutData(r.secret);
  ctx.state.letGo = r.base;
}

const cpuMsSince = (from: ReturnType<typeof process.cpuUsage>) => {
  const d = process.cpuUsage(from);
  return Math.round((d.user + d.system) / 1000);
};

// Extracted files the applied OSC no longer uses would fill the disk over many updates.
async function pruneImages(ctx: OscContext, desired: Desired): Promise<void> {
  const keep = new Set(desired.files.flatMap((f) => (f.content instanceof Uint8Array ? [] : [f.sha256])));
  await ctx.deps.images.prune(keep).catch((err: unknown) => ctx.log.warn("could not prune the image cache", { error: describeError(err) }));
}
