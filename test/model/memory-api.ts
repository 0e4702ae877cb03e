// The model's Kubernetes API as the agents see it: the store (memory-store.ts) behind a network the
// scheduler controls. Every request a client sends waits in a queue until the scheduler delivers it (or
// the client's process dies, or it times out), so two agents' requests interleave in any order a real API
// server could serve them. A machine can be cut off (its requests fail as unreachable, its watches break)
// and a delivered request can lose its answer (done on the server, an error for the client).
//
// Clients are owners (clock.ts): "<machine>.<incarnation>" for an agent process. Two ways in:
// - `leaseApi(owner, namespace)`: the LeaseApi port of src/kube/lease-api.ts, directly, with its errors
//   as KubeErrors — what the new protocol code runs against;
// - memory-http.ts: client-node's HTTP library routed here, for today's code (src/kube/slots.ts, ...).
import type { V1Lease } from "@kubernetes/client-node";
import { KubeError } from "../../src/kube/errors.ts";
import type { LeaseApi, LeaseWatch } from "../../src/kube/lease-api.ts";
import type { WatchEvent } from "../../src/kube/watch.ts";
import { type VirtualClock, machineOf } from "./clock.ts";
import { ApiError, type Change, type KObject, MemoryStore, parseSelector } from "./memory-store.ts";

/** A request that never reached the server or whose answer was lost; `code` as Node's errors carry it. */
export class NetworkError extends Error {
  override name = "NetworkError";
  constructor(
    readonly code: "EHOSTUNREACH" | "ECONNRESET" | "ETIMEDOUT",
    message: string,
  ) {
    super(message);
  }
}

/** Something the scheduler can deliver now. */
export type Delivery = { kind: "request" | "event" | "notice"; id: number; owner: string; what: string };

type Pending = { id: number; owner: string; what: string; since: number; expired?: boolean; exec: () => unknown; resolve: (v: unknown) => void; reject: (e: unknown) => void };
type Notice = { id: number; owner: string; what: string; run: () => void };

export type ApiStats = { requests: number; conflicts: number; notFound: number; unreachable: number; lost: number; timedOut: number };

export class MemoryApi {
  readonly stats: ApiStats = { requests: 0, conflicts: 0, notFound: 0, unreachable: 0, lost: 0, timedOut: 0 };
  private readonly pending = new Map<number, Pending>();
  private readonly notices = new Map<number, Notice>();
  private readonly watches = new Set<LeaseWatchSession>();
  private readonly cut = new Set<string>();
  private ids = 0;

  constructor(
    readonly store: MemoryStore,
    readonly clock: VirtualClock,
    readonly opts: { requestTimeoutMs: number; random: () => number },
  ) {}

  reachable(machine: string): boolean {
    return !this.cut.has(machine);
  }
  /** Cuts `machine` off the API server: requests fail as unreachable, watches break until it is back. */
  partition(machine: string): void {
    this.cut.add(machine);
    this.breakWatches(machine);
  }
  heal(machine: string): void {
    this.cut.delete(machine);
  }
  /** The watch connections of `machine` break (they resume from their last version, or relist). */
  breakWatches(machine: string): void {
    for (const w of this.watches) if (machineOf(w.owner) === machine) w.broken();
  }

  /** Queues `exec` (run against the store when delivered) for `owner`; settles with its result or error. */
  request<T>(owner: string, what: string, exec: () => T): Promise<T> {
    return new Promise<T>((resolve, reject) => {
      const id = ++this.ids;
      this.pending.set(id, { id, owner, what, since: this.clock.mono, exec, resolve: resolve as (v: unknown) => void, reject });
    });
  }
  /** Queues a push to `owner` (a watched object changed) that arrives once its machine reaches the API. */
  notify(owner: string, what: string, run: () => void): void {
    const id = ++this.ids;
    this.notices.set(id, { id, owner, what, run });
  }

  deliveries(): Delivery[] {
    const out: Delivery[] = [];
    for (const p of this.pending.values()) out.push({ kind: "request", id: p.id, owner: p.owner, what: p.what });
    for (const n of this.notices.values()) if (this.reachable(machineOf(n.owner))) out.push({ kind: "notice", id: n.id, owner: n.owner, what: n.what });
    for (const w of this.watches) if (w.ready() && this.reachable(machineOf(w.owner))) out.push({ kind: "event", id: w.id, owner: w.owner, what: `watch event for ${w.owner}` });
    return out;
  }

  /** Delivers one; `loseAnswer`: the server does the work but the client sees a broken connection. */
  deliver(d: Delivery, opts: { loseAnswer?: boolean } = {}): void {
    if (d.kind === "notice") {
      const n = this.notices.get(d.id);
      this.notices.delete(d.id);
      n?.run();
      return;
    }
    if (d.kind === "event") {
      for (const w of this.watches) if (w.id === d.id) w.deliverOne();
      return;
    }
    const p = this.pending.get(d.id);
    if (!p) return;
    this.pending.delete(d.id);
    this.stats.requests++;
    if (p.expired) {
      this.stats.timedOut++;
      return p.reject(new NetworkError("ETIMEDOUT", `${p.what}: no answer in time`));
    }
    if (!this.reachable(machineOf(p.owner))) {
      this.stats.unreachable++;
      return p.reject(new NetworkError("EHOSTUNREACH", `${p.what}: no route to the API server`));
    }
    let result: unknown;
    try {
      result = p.exec();
    } catch (err) {
      if (err instanceof ApiError && err.code === 409) this.stats.conflicts++;
      if (err instanceof ApiError && err.code === 404) this.stats.notFound++;
      return p.reject(err);
    }
    if (opts.loseAnswer) {
      this.stats.lost++;
      return p.reject(new NetworkError("ECONNRESET", `${p.what}: the connection broke before the answer arrived`));
    }
    p.resolve(result);
  }

  /**
   * Marks the requests that have waited longer than the client's time limit: delivering one then fails it
   * (as its owner: the failure's handling runs in that process, on its machine's clock).
   */
  expire(): void {
    for (const p of this.pending.values()) if (this.clock.mono - p.since >= this.opts.requestTimeoutMs) p.expired = true;
  }

  /** The process `owner` died: its requests and pushes are never answered, its watches end. */
  dropOwner(owner: string): void {
    for (const [id, p] of this.pending) if (p.owner === owner) this.pending.delete(id);
    for (const [id, n] of this.notices) if (n.owner === owner) this.notices.delete(id);
    for (const w of this.watches) if (w.owner === owner) w.end();
  }

  /** The LeaseApi port for `owner`'s Leases in `namespace`, with the same concurrency as the real one. */
  leaseApi(owner: string, namespace: string): LeaseApi {
    const store = this.store;
    const call = <T>(what: string, exec: () => T) => this.request(owner, what, exec).catch((err: unknown) => Promise.reject(toKubeError(err, what)));
    return {
      get: (name) =>
        call(`reading Lease ${namespace}/${name}`, () => wire(store.get("leases", namespace, name)) as V1Lease).catch((err: unknown) =>
          err instanceof KubeError && err.reason === "not-found" ? undefined : Promise.reject(err),
        ),
      create: (body) => {
        const sent = wire(body);
        return call(`creating Lease ${namespace}/${body.metadata?.name}`, () => wire(store.create("leases", namespace, sent)) as V1Lease);
      },
      replace: (body) => {
        const sent = wire(body);
        const name = body.metadata?.name as string;
        return call(`updating Lease ${namespace}/${name}`, () => wire(store.replace("leases", namespace, name, sent)) as V1Lease);
      },
      watch: (selector, onEvent) => {
        const session = new LeaseWatchSession(this, ++this.ids, owner, namespace, selector, onEvent as (e: WatchEvent<V1Lease>) => void | Promise<void>);
        this.watches.add(session);
        session.connect();
        return session.handle();
      },
    };
  }

  /** @internal */
  forget(w: LeaseWatchSession): void {
    this.watches.delete(w);
  }
}

/** What a body looks like after a trip over the wire (Dates as their JSON strings, no shared references). */
function wire<T>(x: T): KObject {
  return JSON.parse(JSON.stringify(x)) as KObject;
}

export function toKubeError(err: unknown, what: string): KubeError {
  if (err instanceof KubeError) return err;
  if (err instanceof ApiError) {
    const reason = err.code === 404 ? "not-found" : err.code === 409 ? "conflict" : err.code === 410 ? "gone" : "http";
    return new KubeError(`${what}: ${err.message}`, reason, err.code);
  }
  if (err instanceof NetworkError) return new KubeError(`${what}: cannot reach the API server (${err.code})`, "unreachable", undefined, { cause: err });
  return new KubeError(`${what}: ${err instanceof Error ? err.message : String(err)}`, "other", undefined, { cause: err });
}

/**
 * One LeaseApi watch: LIST, then changes after the list's version, each handler call awaited before the
 * next event is offered; a broken connection resumes from the last delivered version after a backoff,
 * a version the store no longer has (410) lists again and delivers the difference.
 */
class LeaseWatchSession {
  private readonly known = new Map<string, V1Lease>();
  private readonly queue: { rv: number; event: WatchEvent<V1Lease> }[] = [];
  private rv: number | undefined;
  private attached: (() => void) | undefined;
  private busy = false;
  private ended = false;
  private retry: number | undefined;
  private failures = 0;
  private markSynced!: () => void;
  private abandon!: (e: Error) => void;
  private readonly synced = new Promise<void>((resolve, reject) => {
    this.markSynced = resolve;
    this.abandon = reject;
  });
  private readonly matches: (o: KObject | undefined) => boolean;

  constructor(
    private readonly api: MemoryApi,
    readonly id: number,
    readonly owner: string,
    private readonly namespace: string,
    selector: { name: string } | { labelSelector: string },
    private readonly onEvent: (e: WatchEvent<V1Lease>) => void | Promise<void>,
  ) {
    const labels = "labelSelector" in selector ? parseSelector(selector.labelSelector) : undefined;
    this.matches = (o) => o !== undefined && o.metadata?.namespace === namespace && (labels ? labels(o.metadata?.labels ?? {}) : o.metadata?.name === (selector as { name: string }).name);
    this.synced.catch(() => undefined);
  }

  handle(): LeaseWatch {
    return { synced: this.synced, stop: async () => this.end() };
  }

  ready(): boolean {
    return !this.busy && this.attached !== undefined && this.queue.length > 0;
  }

  connect(): void {
    if (this.ended) return;
    const store = this.api.store;
    const from = this.rv;
    const what = from === undefined ? `listing Leases in ${this.namespace}` : `watching Leases in ${this.namespace} from ${from}`;
    this.api
      .request(this.owner, what, () => {
        // Listing (or reading the backlog) and starting to follow changes are one step: nothing falls between.
        const listed = from === undefined ? store.list("leases", this.namespace) : undefined;
        const backlog = from === undefined ? [] : store.changesSince(from);
        if (backlog === "gone") throw new ApiError(410, "Expired", `too old resource version: ${from}`);
        this.attach();
        for (const c of backlog) this.offer(c);
        return listed;
      })
      .then(
        async (listed) => {
          this.failures = 0;
          if (!listed) return;
          this.busy = true;
          try {
            for (const e of relist(this.known, listed.items.filter((o) => this.matches(o)) as V1Lease[])) await this.handOver(e);
          } finally {
            this.busy = false;
          }
          this.rv = Number(listed.resourceVersion);
          this.markSynced();
        },
        (err: unknown) => {
          this.detach();
          if (err instanceof ApiError && err.code === 410) this.rv = undefined;
          this.again();
        },
      );
  }

  /** Hands the next queued change to the handler; the next one is offered once it returned. */
  deliverOne(): void {
    const next = this.queue.shift();
    if (!next || this.ended) return;
    this.busy = true;
    this.rv = next.rv;
    void this.handOver(next.event).finally(() => {
      this.busy = false;
    });
  }

  broken(): void {
    if (!this.attached || this.ended) return;
    this.detach();
    this.again();
  }

  end(): void {
    this.ended = true;
    this.detach();
    this.api.clock.clearTimer(this.retry);
    this.api.forget(this);
    this.abandon(new Error("the watch was stopped before its first list"));
  }

  private async handOver(e: WatchEvent<V1Lease>): Promise<void> {
    const name = e.object.metadata?.name as string;
    if (e.type === "DELETED") this.known.delete(name);
    else this.known.set(name, e.object);
    try {
      await this.onEvent(e);
    } catch {
      // As watchObjects: a handler that throws does not end the watch.
    }
  }

  private attach(): void {
    this.detach();
    this.attached = this.api.store.subscribe((c) => this.offer(c));
  }
  private detach(): void {
    this.attached?.();
    this.attached = undefined;
    this.queue.length = 0;
  }

  private offer(c: Change): void {
    if (c.resource !== "leases") return;
    const now = c.type !== "DELETED" && this.matches(c.object);
    const before = c.type === "DELETED" ? this.matches(c.object) : this.matches(c.old);
    // As kube-apiserver: an object that stops matching the selector is DELETED for this watch, one that starts ADDED.
    const type = now && before ? "MODIFIED" : now ? "ADDED" : before ? "DELETED" : undefined;
    if (type) this.queue.push({ rv: c.rv, event: { type, object: wire(c.object) as V1Lease } });
  }

  private again(): void {
    if (this.ended) return;
    this.failures++;
    const ceiling = Math.min(4_000, 500 * 2 ** (this.failures - 1));
    this.retry = this.api.clock.setTimer(this.owner, () => this.connect(), ceiling / 2 + (ceiling / 2) * this.api.opts.random());
  }
}

function relist(known: ReadonlyMap<string, V1Lease>, items: readonly V1Lease[]): WatchEvent<V1Lease>[] {
  const byName = new Map(items.map((i) => [i.metadata?.name as string, i]));
  const events: WatchEvent<V1Lease>[] = [];
  for (const [name, old] of known) if (byName.get(name)?.metadata?.uid !== old.metadata?.uid) events.push({ type: "DELETED", object: old });
  for (const item of items) {
    const old = known.get(item.metadata?.name as string);
    const object = wire(item) as V1Lease;
    if (!old || old.metadata?.uid !== item.metadata?.uid) events.push({ type: "ADDED", object });
    else if (old.metadata?.resourceVersion !== item.metadata?.resourceVersion) events.push({ type: "MODIFIED", object });
  }
  return events;
}

export { MemoryStore };
