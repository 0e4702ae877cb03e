// The model's agent for today's code (5822692): the real startRollout (src/controllers/rollout.ts), and
// through it the real slots (src/kube/slots.ts), safeToReclaim, health gate and rollout state file, all
// talking client-node to the model's API server. Around them, the OSC controller's decisions as
// src/controllers/osc.ts made them then, transcribed (line numbers of 5822692's osc.ts) with what is not
// the rollout's left out: Secret parsing and image resolution (the world hands over what a node applies),
// the serial lease and the reconciliation delay (not set in the model), in-place updates, self-updates,
// events and the OSC conditions (cosmetic). The apply is the machine's (Host.apply: complete, its unit
// restarts recorded by the world as they happen).
import type { V1Node } from "@kubernetes/client-node";
import type { AgentEnv, Driver } from "./driver.ts";
import { type Checksums, loadOldCode, oldCommit, type OldCode, type OldSettings } from "./old-code.ts";
import { type Content, parseContent } from "./osc-model.ts";

/** When to reconcile again, on the monotonic clock (osc.ts:122). */
type Wait = { atMs: number; why: string };

/** osc.ts:127 */
const gateLookMs = 1_000;
/** The agent's default controllers.operatingSystemConfig.syncPeriod (src/api/agent-config.ts). */
const syncPeriodMs = 10 * 60_000;
/** systemdUnitCheck.stuckThreshold's default, which cli/run.ts:129 passes to startRollout. */
const stuckThresholdMs = 5 * 60_000;
const appliedChecksumAnnotation = "checksum/cloud-config-data";

export function oldDriver(): Driver {
  let code: OldCode | undefined;
  return {
    name: `old (${oldCommit})`,
    prepare: async () => {
      code ??= await loadOldCode();
    },
    start: (env) => {
      if (!code) throw new Error("oldDriver: prepare() first");
      startOldAgent(code, env);
    },
    holders: (store, pool) => {
      if (!code) throw new Error("oldDriver: prepare() first");
      return store
        .list("leases", pool.namespace, `${code.slotPoolLabel}=${pool.secretName}`)
        .items.map((l) => (l.spec as { holderIdentity?: string } | undefined)?.holderIdentity ?? "")
        .filter((h) => h !== "");
    },
  };
}

function startOldAgent(code: OldCode, env: AgentEnv): void {
  const now = env.mono;
  const source = `Secret kube-system/${env.secretName}`;
  const rollout = code.startRollout({
    kube: env.kube,
    files: env.files,
    systemd: env.host.systemd,
    store: env.host.stateStore,
    events: { record: async () => undefined },
    node: { current: () => env.nodes.current(), subscribe: () => () => undefined, found: new Promise<V1Node>(() => undefined), listed: Promise.resolve() },
    status: { set: () => undefined, snapshot: () => ({}) },
    log: env.log,
    secretName: env.secretName,
    stuckThresholdMs,
    now: env.wall,
    clock: env.mono,
  });

  // osc.ts:154, 215-221
  let failures = 0;
  // For the trace: a refusal is noted when its reason changes, not at every retry.
  let lastRefusal: string | undefined;
  const periodic = (): Wait => ({ atMs: now() + syncPeriodMs, why: "periodic re-check" });
  const retryWait = (why: string): Wait => {
    failures++;
    return { atMs: now() + code.backoffDelay(failures, { initialMs: 1000, maxMs: 256_000 }, 1), why: `retry after ${why}` };
  };

  // osc.ts:165-202: single flight, the next pass on a timer replaced after each pass.
  let timer: number | undefined;
  const schedule = (wait: Wait) => {
    env.clearTimer(timer);
    timer = env.setTimer(() => passes.trigger(wait.why), Math.max(0, wait.atMs - now()));
  };
  const reconcileOnce = async (why: string): Promise<void> => {
    const wait = await reconcile(why).catch((err: unknown) => {
      env.note(`reconcile failed: ${err instanceof Error ? err.message.slice(0, 160) : String(err)}`);
      return retryWait("reconcile error");
    });
    schedule(wait);
  };
  const passes = code.singleFlight(reconcileOnce);
  // osc.ts:232-243: every Secret event triggers a reconcile.
  env.secret.subscribe(() => passes.trigger("secret changed"));
  passes.trigger("start");

  /** osc.ts:286-458, the rollout's part. */
  async function reconcile(_why: string): Promise<Wait> {
    const secret = env.secret.current();
    if (!secret) return periodic(); // :289-292 waiting for the Secret
    // :301-311 base and effective checksum; overlays picked by the labels of the Node as last seen (:641).
    const { base, checksum, content, bytes } = secret.layered(env.nodes.current()?.metadata?.labels ?? {});
    // :344-346 (an invalid Secret changes nothing on the node)
    const parsed = code.parseRolloutSettings(secret.annotations, source);
    if (!parsed.ok) return periodic();
    const settings = parsed.value;
    // :351
    rollout.observe({ secretUid: secret.uid, checksum, settings });
    // :331 state.lastApplied?.checksum; :353-354
    const stateApplied = env.host.lastApplied();
    const ongoing = await continueRollout({ base, checksum }, bytes, stateApplied, settings);
    if (ongoing) return ongoing;

    // :356-366; the model sets no reconciliation delay and no serial rollout, so no hold.
    const current = env.nodes.current();
    const gates = code.gatesFor({ checksum, stateApplied, nodeApplied: nodeAppliedChecksum(current), serial: false });
    // :367-382
    let gatedUnits: string[] = [];
    if (gates.admit) {
      const disrupted = settings.budget || settings.windows ? disruptedUnits(content, settings) : [];
      const admission = await rollout.admit({ secretUid: secret.uid, checksum, disrupted, settings });
      if (!admission.go) {
        if (admission.reason !== lastRefusal) env.note(`${checksum.slice(0, 8)} waits: ${admission.reason}: ${admission.message.slice(0, 140)}`);
        lastRefusal = admission.reason;
        return { atMs: now() + admission.retryAfterMs, why: admission.reason };
      }
      lastRefusal = undefined;
      if (settings.budget && disrupted.length > 0) {
        await rollout.gated(checksum, disrupted);
        gatedUnits = disrupted;
      }
    }
    // :405-411 applyDesired (the model's applies complete), :441 failures = 0
    await env.host.apply(content, checksum);
    failures = 0;
    // :450 reportSuccess with the Node as it is now
    await reportSuccess(env.nodes.current(), { base, checksum });
    // :454-455
    if (gatedUnits.length > 0) return { atMs: now() + gateLookMs, why: "health gate" };
    if (settings.budget) await rollout.applied({ base, checksum }, bytes);
    return periodic();
  }

  /** osc.ts:468-500 */
  async function continueRollout(ids: Checksums, osc: Uint8Array, applied: string | undefined, settings: OldSettings): Promise<Wait | undefined> {
    const { checksum } = ids;
    const g = (await rollout.state()).gate;
    if (!g || g.checksum !== checksum) return undefined;
    if (g.phase === "blocked" || g.phase === "failed") return periodic();
    const lastGood = g.phase === "rolled-back" ? await rollout.lastGood(checksum) : undefined;
    if (g.phase === "gating" && applied !== checksum) return undefined;
    if (g.phase === "rolled-back" && lastGood && applied !== lastGood.checksum) return rollBack(checksum, lastGood, settings);
    const t = await rollout.tick(settings);
    if (!t) return undefined;
    if (t.result === "pending") return { atMs: now() + gateLookMs, why: "health gate" };
    if (t.result === "passed") {
      await rollout.passed(ids, osc);
      env.note(`gate of ${checksum.slice(0, 8)} passed${g.phase === "rolled-back" ? " (rolled back)" : ""}`);
      return periodic();
    }
    const back = g.phase === "gating" && settings.rollback ? await rollout.lastGood(checksum) : undefined;
    env.note(`gate of ${checksum.slice(0, 8)} failed (${t.check.slice(0, 80)})${back ? `; rolling back to ${back.checksum.slice(0, 8)}` : ""}`);
    await rollout.failed(t.check, back !== undefined);
    return back ? rollBack(checksum, back, settings) : periodic();
  }

  /** osc.ts:502-522 */
  async function rollBack(_failed: string, back: { checksum: string; base: string; osc: Uint8Array }, settings: OldSettings): Promise<Wait> {
    const content = parseContent(back.osc);
    await rollout.gated(back.checksum, disruptedUnits(content, settings), true);
    await env.host.apply(content, back.checksum);
    await reportSuccess(env.nodes.current(), { base: back.base, checksum: back.checksum });
    return { atMs: now() + gateLookMs, why: "health gate of the rollback" };
  }

  /** disruptedUnits(planForNode(...).plan, patterns) (osc.ts:371, :509-510): the plan's restarts and stops that count. */
  function disruptedUnits(content: Content, settings: OldSettings): string[] {
    return env.host.restarts(content).filter((u) => code.countsAsDisruptive(u, settings.disruptiveUnits));
  }

  /** osc.ts:624-627 */
  function nodeAppliedChecksum(n: V1Node | undefined): string | undefined {
    const a = n?.metadata?.annotations ?? {};
    return a[code.effectiveChecksumAnnotation] ?? a[appliedChecksumAnnotation];
  }

  /** osc.ts:676-708 and :716-730, the Node metadata part: the checksums (and the pool label) patched when they differ. */
  async function reportSuccess(current: V1Node | undefined, ids: Checksums): Promise<void> {
    if (!current) return;
    const wanted = {
      annotations: { [appliedChecksumAnnotation]: ids.base, [code.effectiveChecksumAnnotation]: ids.checksum === ids.base ? null : ids.checksum },
      labels: { [code.poolLabel]: env.secretName },
    };
    const have: Record<string, string> = { ...current.metadata?.labels, ...current.metadata?.annotations };
    if (Object.entries({ ...wanted.labels, ...wanted.annotations }).some(([k, v]) => (have[k] ?? null) !== v)) {
      await code.patchNodeMetadata(env.kube, current.metadata?.name as string, wanted);
    }
  }
}
