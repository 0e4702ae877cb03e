// The simulated agents of a scale run, many to a process, each with its own user and its own Lease
// traffic against the real API server:
//   - trellis: the real pool protocol (src/kube/pool-leases.ts poolMember, src/kube/pool-leader.ts
//     startPoolLeader, over src/kube/lease-api.ts) driven in the order src/controllers/rollout/controller.ts
//     drives it; the apply and the gate's settle time are timers;
//   - gardener-node-agent's serial rollout: its reconciler's Lease logic re-enacted request for request
//     (Gardener's pkg/nodeagent/controller/operatingsystemconfig, cited line by line below).
import type { V1Lease } from "@kubernetes/client-node";
import type { Budget } from "../../../src/api/rollout.ts";
import type { Kube } from "../../../src/kube/client.ts";
import { KubeError } from "../../../src/kube/errors.ts";
import type { LeaseApi, LeaseWatch } from "../../../src/kube/lease-api.ts";
import { microTime, timeOf } from "../../../src/kube/micro-time.ts";
import { startPoolLeader } from "../../../src/kube/pool-leader.ts";
import { type PoolRef, poolMember, readTicket, secretOwner } from "../../../src/kube/pool-leases.ts";
import { type Watcher, type WatchEvent, type WatchStats, watchObjects } from "../../../src/kube/watch.ts";
import { createLogger, type Logger } from "../../../src/log.ts";
import { serializer, singleFlight } from "../../../src/loops.ts";
import { admitted } from "../../../src/rollout/pool.ts";
import { monotonicMs } from "../../../src/time.ts";

/** Counts by key ("PUT ticket conflict", "event leader", "warn: …"), shared by every agent of a phase. */
export type Tally = Map<string, number>;
export const bump = (t: Tally, key: string, n = 1) => void t.set(key, (t.get(key) ?? 0) + n);

/** What a node went through, on the bench's monotonic clock (ms). */
export type Timeline = { requested?: number; granted?: number; settled?: number; released?: number };

/** A Lease's part in the protocols, from its name. */
export function leaseRole(secret: string): (name: string) => string {
  return (name) => {
    if (name === `${secret}-slots`) return "record";
    if (name === `${secret}-leader`) return "leader";
    if (name.startsWith(`${secret}-node-`)) return "ticket";
    return name === secret ? "serial" : "other";
  };
}

export type WatchRecord = { role: string; watch: LeaseWatch };

/** The tally's key for the bytes of the answers to writes. */
export const writeAnswerBytes = "bytes written-answers";

/**
 * The Lease port with every call counted by the Lease's role and the outcome, and every watch kept for its
 * statistics. kube-apiserver's apiserver_response_sizes covers GET and LIST only, so the answers to
 * writes are counted here ("bytes written-answers"): the object as returned, or the Status of a refusal
 * (`statusBytes`, as measured for this pool's names).
 */
export function countedLeases(api: LeaseApi, tally: Tally, roleOf: (name: string) => string, watches: WatchRecord[], statusBytes: number): LeaseApi {
  const outcome = (err: unknown) => (err instanceof KubeError ? (err.status === 429 ? "429" : err.reason) : "error");
  const counted = async <T>(what: string, op: () => Promise<T>): Promise<T> => {
    const write = !what.startsWith("GET");
    try {
      const r = await op();
      bump(tally, `${what} ok`);
      if (write) bump(tally, writeAnswerBytes, JSON.stringify(r).length);
      return r;
    } catch (err) {
      bump(tally, `${what} ${outcome(err)}`);
      if (write) bump(tally, writeAnswerBytes, statusBytes);
      throw err;
    }
  };
  return {
    get: (name) => counted(`GET ${roleOf(name)}`, () => api.get(name)),
    create: (body) => counted(`POST ${roleOf(body.metadata?.name ?? "")}`, () => api.create(body)),
    replace: (body) => counted(`PUT ${roleOf(body.metadata?.name ?? "")}`, () => api.replace(body)),
    watch(selector, onEvent) {
      const role = "name" in selector ? roleOf(selector.name) : "pool";
      const watch = api.watch(selector, (e) => {
        bump(tally, `event ${role}`);
        return onEvent(e);
      });
      watches.push({ role, watch });
      return watch;
    },
  };
}

/** The list, watch and restart counts of the watches, by role (src/kube/watch.ts keeps them), and how many watchers were created. */
export function watchStats(watches: WatchRecord[]): Record<string, WatchStats & { created: number }> {
  const out: Record<string, WatchStats & { created: number }> = {};
  for (const { role, watch } of watches) {
    if (!("stats" in watch)) continue;
    const s = (watch as Watcher).stats();
    const o = (out[role] ??= { created: 0, lists: 0, watches: 0, restarts: 0, gone: 0, errors: 0, events: 0, handlerErrors: 0, bookmarks: 0 });
    o.created++;
    for (const k of Object.keys(s) as (keyof WatchStats)[]) o[k] += s[k];
  }
  return out;
}

/** A logger that counts its lines by level and message (the protocol's own account of leaderships, passes, failures) and keeps the first warnings. */
export function tallyLogger(tally: Tally, warnings: string[]): Logger {
  return createLogger({
    level: "info",
    write: (line, level) => {
      bump(tally, `${level}: ${(JSON.parse(line) as { msg: string }).msg}`);
      if (level !== "info" && warnings.length < 30) warnings.push(line.slice(0, 600));
    },
  });
}

export type SimAgent = { readonly node: string; readonly timeline: Timeline; stop(): Promise<void> };
export type TrellisAgent = SimAgent & { start(): Promise<void>; roll(revision: string): Promise<void> };

/**
 * One trellis agent's side of a rollout, in the controller's order (src/controllers/rollout/controller.ts):
 * its ticket when it starts; on new work the request, then the watch of its ticket (watchTicket) and the
 * campaign while it waits (syncPool); on the grant a read of the record to confirm it, the request once more (syncPool on the step to
 * holding: a read, nothing changes) and no more campaigning; the apply and the settle time; then the
 * release (syncPool once the state is idle). The watches stay open afterwards, as the controller's do, so
 * the next rollout finds them open.
 */
export function trellisAgent(o: { api: LeaseApi; ref: PoolRef; budget: () => Budget; applyMs: number; settleMs: number; log: Logger; tally: Tally }): TrellisAgent {
  const { api, ref } = o;
  const member = poolMember(api, ref);
  const leader = startPoolLeader({ api, ref, log: o.log, budget: o.budget, clock: monotonicMs, wallNow: () => new Date() });
  // The controller steps every event inside one serializer; so does this.
  const writer = serializer();
  let ticket: LeaseWatch | undefined;
  let revision: string | undefined;
  let phase: "idle" | "waiting" | "holding" = "idle";
  let holding: Promise<void> = Promise.resolve();
  let timeline: Timeline = {};
  let stopped = false;
  const failed = (what: string) => (err: unknown) => bump(o.tally, `failed: ${what}: ${err instanceof KubeError ? err.reason : String(err)}`);
  const request = (rev: string) => member.request({ revision: rev, reason: "osc", since: new Date().toISOString() });

  async function hold(): Promise<void> {
    await Bun.sleep(o.applyMs + o.settleMs);
    timeline.settled = monotonicMs();
    await writer.run(async () => {
      await member.release().catch(failed("release"));
      phase = "idle";
      leader.campaign(false);
      timeline.released = monotonicMs();
    });
  }

  async function ask(rev: string): Promise<void> {
    const t = await request(rev);
    if (!ticket && t) ticket = api.watch({ name: member.ticketName }, onTicket);
    leader.campaign(true);
  }

  const onTicket = (e: WatchEvent<V1Lease>) =>
    writer
      .run(async () => {
        const t = e.type === "DELETED" ? undefined : readTicket(e.object, member.ticketName);
        if (phase !== "waiting" || revision === undefined || !admitted(t) || t?.grant?.revision !== revision) return;
        // The controller's onTicket: the record decides, not the ticket (one read of the record per grant).
        const held = await member.holding(t?.grant?.shard ?? 0);
        if (held?.revision !== revision) return bump(o.tally, "grant not on the record: ignored");
        phase = "holding";
        timeline.granted = monotonicMs();
        // The OSC controller applies outside the ticket's handler (the watch goes on meanwhile), and applies
        // even when this read failed: the gate's next look steps the state machine again.
        holding = hold();
        await request(revision).catch(failed("request on the grant"));
        leader.campaign(false);
      })
      .catch((err: unknown) => {
        failed("grant")(err);
        // The controller's ticketRetry: a grant whose handling failed (the record out of reach to check it) is
        // read again until handled, else the node would wait for ever with its slot taken.
        setTimeout(() => {
          if (stopped) return;
          void api.get(member.ticketName).then(
            (lease) => lease && onTicket({ type: "MODIFIED", object: lease }),
            failed("grant re-read"),
          );
        }, 5_000);
      });

  return {
    node: ref.node.name,
    get timeline() {
      return timeline;
    },
    start: () => member.ensureTicket(),
    async roll(rev) {
      revision = rev;
      phase = "waiting";
      timeline = { requested: monotonicMs() };
      // A request that failed is made again by the OSC controller's next attempt (its offer fails with it).
      for (let attempt = 1; !stopped; attempt++) {
        const asked = await writer.run(() => ask(rev)).then(
          () => true,
          (err: unknown) => {
            failed("request")(err);
            return false;
          },
        );
        if (asked) return;
        await Bun.sleep(Math.min(10_000, 500 * 2 ** attempt));
      }
    },
    async stop() {
      stopped = true;
      await leader.stop();
      await ticket?.stop();
      await holding;
    },
  };
}

/** The serial Lease as gardener-node-agent finds it after an earlier serial rollout: there, and free. */
export function freeSerialLease(secret: { name: string; uid: string }): V1Lease {
  return { apiVersion: "coordination.k8s.io/v1", kind: "Lease", metadata: { name: secret.name, namespace: "kube-system", ownerReferences: [secretOwner(secret)] }, spec: {} };
}

export type GnaAgent = SimAgent & { start(): Promise<void>; roll(): void };

/**
 * gardener-node-agent's serial OSC rollout for one node, as its code does it (Gardener master,
 * b312835d1784c3628983205c05452b2eaa95b645, pkg/nodeagent/controller/operatingsystemconfig):
 *   - add.go:99-122: every agent keeps an informer on the Lease named after the OSC Secret (kube-system,
 *     field selector metadata.name): a LIST, then a WATCH that client-go's reflector reopens every 5-10 min
 *     (tools/cache/reflector.go: minWatchTimeout 5 min × (1 + rand)); reads of the Lease come from it;
 *   - add.go:233-236: with serial on, a changed Secret is reconciled at once on every node (no jitter);
 *   - add.go:154-191 (LeasePredicate): a Lease update reconciles this node again only when another
 *     instance released the Lease (holderIdentity now empty) and this node is not up to date;
 *   - reconciler.go:184-189: an up-to-date node "releases" through an elector that never read the Lease
 *     (serial.go:168-170: not held by it as far as it knows): no request;
 *   - reconciler.go:194-203: reload from the informer; held by another and renewed within its duration:
 *     requeue when it expires (600 s: never within a run), no request;
 *   - reconciler.go:208-210 and serial.go:141-166: else take or renew it with one Update (Create when the
 *     informer has none) of the Lease as cached; a 409 is an error: the workqueue retries after
 *     5 ms × 2^(failures-1) (client-go util/workqueue/default_rate_limiters.go
 *     DefaultTypedControllerRateLimiter; one item per agent, so its 10 qps bucket never binds), reading
 *     the informer again, until it succeeds (Forget) or finds the Lease held;
 *   - reconciler.go:397 and serial.go:168-179: once applied (and the Node annotated), one Update that
 *     clears holderIdentity, durations and times.
 * client-go retries a 429 itself after its Retry-After (rest/request.go, up to 10 times): so does this.
 * The Node's annotation, Events and the OSC work are outside the comparison (both agents do those alike):
 * "applied" is a timer of the same length as trellis's apply plus settle time.
 */
export function gnaAgent(o: { kube: Kube; api: LeaseApi; secret: { name: string; uid: string }; identity: string; applyMs: number; settleMs: number; log: Logger; tally: Tally; watches: WatchRecord[] }): GnaAgent {
  const { api, identity } = o;
  let cached: V1Lease | undefined;
  let upToDate = false;
  // serial.go's leaderElector.lease: the Lease as this agent last wrote it.
  let mine: V1Lease | undefined;
  let failures = 0;
  let requeue: ReturnType<typeof setTimeout> | undefined;
  let requeueAt = Number.POSITIVE_INFINITY;
  let stopped = false;
  const timeline: Timeline = {};
  const holder = (l: V1Lease | undefined) => l?.spec?.holderIdentity ?? "";
  const queue = singleFlight(reconcile);

  /** The workqueue's AddAfter: a later one does not postpone an earlier one. */
  const addAfter = (ms: number) => {
    const at = monotonicMs() + ms;
    if (stopped || at >= requeueAt) return;
    clearTimeout(requeue);
    requeueAt = at;
    requeue = setTimeout(() => {
      requeueAt = Number.POSITIVE_INFINITY;
      queue.trigger("requeue");
    }, ms);
  };

  const informer = watchObjects<V1Lease>({
    kube: o.kube,
    path: "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases",
    fieldSelector: `metadata.name=${o.secret.name}`,
    log: o.log,
    timeoutSeconds: { min: 300, max: 600 },
    onEvent: (e) => {
      bump(o.tally, "event serial");
      const before = cached;
      cached = e.type === "DELETED" ? undefined : e.object;
      if (e.type === "MODIFIED" && holder(before) !== identity && holder(cached) === "" && !upToDate) queue.trigger("lease released");
    },
  });
  o.watches.push({ role: "serial", watch: informer });

  /** One request, retried on 429 as client-go's REST client does. */
  async function write(op: () => Promise<V1Lease>): Promise<V1Lease> {
    for (let attempt = 1; ; attempt++) {
      try {
        return await op();
      } catch (err) {
        if (!(err instanceof KubeError && err.status === 429) || attempt > 10) throw err;
        await Bun.sleep(err.retryAfterMs ?? 1_000);
      }
    }
  }

  async function reconcile(): Promise<void> {
    // reconciler.go:184-189: up to date, it releases through a fresh elector that never read the Lease: no request.
    if (stopped || upToDate) return;
    const lease = cached;
    const h = holder(lease);
    if (h !== "" && h !== identity) {
      const left = (timeOf(lease?.spec?.renewTime) ?? 0) + (lease?.spec?.leaseDurationSeconds ?? 0) * 1000 - Date.now();
      if (left > 0) return addAfter(left);
    }
    try {
      mine = await write(() => tryAcquireOrRenew(lease));
      failures = 0;
    } catch (err) {
      failures++;
      bump(o.tally, `retry after ${err instanceof KubeError ? err.reason : "error"}`);
      return addAfter(5 * 2 ** (failures - 1));
    }
    timeline.granted ??= monotonicMs();
    await Bun.sleep(o.applyMs + o.settleMs);
    timeline.settled = monotonicMs();
    upToDate = true;
    await release();
  }

  function tryAcquireOrRenew(lease: V1Lease | undefined): Promise<V1Lease> {
    const at = microTime(new Date());
    const body: V1Lease = lease ? structuredClone(lease) : freeSerialLease(o.secret);
    const spec = (body.spec ??= {});
    if (spec.holderIdentity !== identity) {
      spec.holderIdentity = identity;
      spec.leaseDurationSeconds = 600;
      spec.acquireTime = at;
    }
    spec.renewTime = at;
    return body.metadata?.resourceVersion ? api.replace(body) : api.create(body);
  }

  /** A release that fails is not tried again (the next reconcile finds the node up to date): the Lease then runs out after 600 s. */
  async function release(): Promise<void> {
    const held = mine;
    if (!held) return;
    try {
      mine = await write(() => api.replace({ ...held, spec: { ...held.spec, holderIdentity: undefined, leaseDurationSeconds: undefined, acquireTime: undefined, renewTime: undefined } }));
      timeline.released = monotonicMs();
    } catch (err) {
      bump(o.tally, `failed: release: ${err instanceof KubeError ? err.reason : String(err)}`);
    }
  }

  return {
    node: identity,
    timeline,
    start: () => informer.synced,
    roll() {
      timeline.requested = monotonicMs();
      queue.trigger("secret changed");
    },
    async stop() {
      stopped = true;
      clearTimeout(requeue);
      await queue.stop();
      await informer.stop();
    },
  };
}
