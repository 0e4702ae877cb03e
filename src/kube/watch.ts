// A resumable watch of the agent's own objects: LIST them, deliver them, WATCH from the list's
// resourceVersion, resume from the last version seen (events and bookmarks) when the server ends the
// watch or the connection breaks, and LIST again only when the server says that version is gone (410).
// The handler is awaited for each event, in order, and the stream is not read meanwhile: nothing is
// lost, repeated or reordered, and a slow handler delays the next event instead of piling them up.
// (After a 410 the relist delivers the current state: versions the server no longer has are skipped.)
//
// Transport: a streaming GET through client-node's HTTP library (http.ts) rather than client-node's
// Watch class, which calls its callback synchronously (no awaiting the handler), drops lines it cannot
// parse without a word, throws away the Status body of a refused watch (the reason behind a 403 or
// 410), and aborts any watch that is quiet for 30 s (a watch of one object is quiet for minutes).
import type { Logger } from "../log.ts";
import type { Kube } from "./client.ts";
import { explainKubeError, KubeError } from "./errors.ts";
import { kubeGet, statusError } from "./http.ts";
import { abortableSleep, backoffDelay, monotonicMs } from "../time.ts";

export type KubeObject = {
  kind?: string;
  apiVersion?: string;
  metadata?: { name?: string; namespace?: string; uid?: string; resourceVersion?: string };
};
export type WatchEvent<T> = { type: "ADDED" | "MODIFIED" | "DELETED"; object: T };

export type Backoff = {
  /** First retry delay; doubles per consecutive failure up to maxMs. Each delay is jittered to 50–100 %. */
  initialMs: number;
  maxMs: number;
  /**
   * The cap while the server cannot be reached at all (refused, no answer): such an attempt costs the
   * server nothing, and a node must be back within seconds of its API server, not up to maxMs later.
   */
  unreachableMaxMs: number;
  /** A watch that stayed open this long counts as healthy and resets the doubling. */
  resetAfterMs: number;
};
const defaultBackoff: Backoff = { initialMs: 500, maxMs: 30_000, unreachableMaxMs: 4_000, resetAfterMs: 60_000 };

/**
 * The largest watch event line (and list answer) read. kube-apiserver takes request bodies up to 3 MiB
 * and etcd stores values up to 1.5 MiB, so a real object's JSON stays well below this; a line that grows
 * past it is a broken or hostile stream, which must not grow the agent's memory for as long as it sends.
 */
export const defaultMaxEventBytes = 16 << 20;

/** An event line or list answer over the limit: the watch fails, and restarts with a fresh list. */
export class EventTooLargeError extends KubeError {
  override name = "EventTooLargeError";
}

export type WatchStats = {
  /** LIST requests sent (the first one and every relist). */
  lists: number;
  /** WATCH requests sent. */
  watches: number;
  /** Watches resumed from the last resourceVersion after the previous one ended without error. */
  restarts: number;
  /** 410 Gone answers (HTTP status or ERROR event): each is followed by a relist. */
  gone: number;
  /** Failed requests and broken or silent streams, other than 410; each is retried with backoff. */
  errors: number;
  /** Events handed to the handler, and how many of those calls threw. */
  events: number;
  handlerErrors: number;
  bookmarks: number;
};

export type WatchOptions<T> = {
  kube: Kube;
  /** Collection path, e.g. /api/v1/namespaces/kube-system/secrets. */
  path: string;
  /**
   * One of the two is required: the agent reads only its own objects (e.g. metadata.name=osc-abc), or its
   * pool's rollout Leases by their label.
   */
  fieldSelector?: string;
  labelSelector?: string;
  log: Logger;
  /** Awaited, one event at a time. A handler that throws is logged and counted; the watch goes on. */
  onEvent: (e: WatchEvent<T>) => void | Promise<void>;
  /**
   * What the watch keeps of each object between events: for a relist to compare (its metadata), and to
   * deliver as DELETED when the object is gone. All of it by default; a handler that holds a large object
   * only as long as it needs it (the OSC Secret's data) says what the watch may keep.
   */
  remember?: (o: T) => T;
  backoff?: Partial<Backoff>;
  /** The server ends each watch after a random time in this range, so that many nodes do not reconnect in step. */
  timeoutSeconds?: { min: number; max: number };
  /** A request or stream that makes no progress for this long is abandoned and retried. The server sends a bookmark about once a minute. */
  idleTimeoutMs?: number;
  /** A longer event line or list answer fails the watch (default defaultMaxEventBytes). */
  maxEventBytes?: number;
  random?: () => number;
  now?: () => number;
  sleep?: (ms: number, signal: AbortSignal) => Promise<void>;
};

export type Watcher = {
  /** Resolves when the first LIST has been delivered (failed lists are retried until then); rejects if stop() comes first. */
  synced: Promise<void>;
  /** Ends the watch; resolves once the handler call in progress, if any, has returned. */
  stop(): Promise<void>;
  stats(): WatchStats;
};

export function watchObjects<T extends KubeObject>(opts: WatchOptions<T>): Watcher {
  if (!opts.fieldSelector && !opts.labelSelector) throw new Error(`watching ${opts.path}: a field or label selector is required (trellis reads only its own objects)`);
  const { kube, path, onEvent } = opts;
  const selectors: Record<string, string> = {
    ...(opts.fieldSelector ? { fieldSelector: opts.fieldSelector } : {}),
    ...(opts.labelSelector ? { labelSelector: opts.labelSelector } : {}),
  };
  const backoff = { ...defaultBackoff, ...opts.backoff };
  const timeouts = opts.timeoutSeconds ?? { min: 240, max: 360 };
  const idleTimeoutMs = opts.idleTimeoutMs ?? 150_000;
  const maxEventBytes = opts.maxEventBytes ?? defaultMaxEventBytes;
  const random = opts.random ?? Math.random;
  const now = opts.now ?? monotonicMs;
  const sleep = opts.sleep ?? abortableSleep;
  const target = `${path}?${Object.entries(selectors).map(([k, v]) => `${k}=${v}`).join("&")}`;
  const log = opts.log.with({ watch: path, ...selectors });

  const stopper = new AbortController();
  const counters: WatchStats = { lists: 0, watches: 0, restarts: 0, gone: 0, errors: 0, events: 0, handlerErrors: 0, bookmarks: 0 };
  const known = new Map<string, T>();
  let resourceVersion: string | undefined;
  let failures = 0;
  let lastReason: KubeError["reason"] | undefined;
  let openedAt: number | undefined;

  let markSynced!: () => void;
  let abandonSync!: (err: Error) => void;
  const synced = new Promise<void>((resolve, reject) => {
    markSynced = resolve;
    abandonSync = reject;
  });
  // A caller that never awaits `synced` must not get an unhandled rejection when it stops early;
  // whoever does await it still sees the rejection.
  synced.catch(() => undefined);

  async function deliver(event: WatchEvent<T>): Promise<void> {
    if (stopper.signal.aborted) return;
    const key = keyOf(event.object);
    if (event.type === "DELETED") known.delete(key);
    else known.set(key, opts.remember ? opts.remember(event.object) : event.object);
    counters.events++;
    try {
      await onEvent(event);
    } catch (err) {
      counters.handlerErrors++;
      log.error("watch handler failed", { type: event.type, object: key, err: err instanceof Error ? err : String(err) });
    }
  }

  /** One request's worth of cancellation: the caller's stop, or no progress for idleTimeoutMs. */
  function attempt(what: string) {
    const ctl = new AbortController();
    const signal = AbortSignal.any([stopper.signal, ctl.signal]);
    let idle = false;
    return {
      signal,
      done: () => ctl.abort(),
      async progress<R>(p: Promise<R>): Promise<R> {
        const timer = setTimeout(() => {
          idle = true;
          ctl.abort();
        }, idleTimeoutMs);
        try {
          return await p;
        } finally {
          clearTimeout(timer);
        }
      },
      explain(err: unknown): KubeError {
        if (idle) return new KubeError(`${what}: no answer from ${kube.server} for ${idleTimeoutMs / 1000} s`, "unreachable", undefined, { cause: err });
        return explainKubeError(err, { server: kube.server, caSource: kube.caSource, what });
      },
    };
  }

  async function list(): Promise<string> {
    counters.lists++;
    const what = `listing ${target}`;
    const a = attempt(what);
    let body: { kind?: string; apiVersion?: string; metadata?: { resourceVersion?: string }; items?: T[] };
    try {
      const res = await a.progress(kubeGet(kube, path, selectors, a.signal));
      const stream = res.body;
      if (!stream) throw new KubeError(`${what}: the answer has no body`, "other");
      const text = await readBounded(stream, maxEventBytes, what, a.progress);
      if (res.status !== 200) throw statusError(kube, what, res.status, text);
      body = JSON.parse(text);
    } catch (err) {
      throw a.explain(err);
    } finally {
      a.done();
    }
    const rv = body.metadata?.resourceVersion;
    if (!rv) throw new KubeError(`${what}: the answer has no resourceVersion`, "other");
    // List items carry no kind/apiVersion; give them the ones watch events have, so handlers see one shape.
    const kind = body.kind?.replace(/List$/, "");
    const items = (body.items ?? []).map((item) => ({ ...item, kind: item.kind ?? kind, apiVersion: item.apiVersion ?? body.apiVersion }));
    for (const event of relistEvents(known, items)) await deliver(event);
    return rv;
  }

  /** Streams one watch to its end; throws a KubeError (reason "gone" for 410) when it fails. */
  async function watch(from: string): Promise<void> {
    counters.watches++;
    const what = `watching ${target} from resourceVersion ${from}`;
    const a = attempt(what);
    const timeoutSeconds = timeouts.min + Math.floor(random() * (timeouts.max - timeouts.min + 1));
    const query = { ...selectors, watch: "true", resourceVersion: from, allowWatchBookmarks: "true", timeoutSeconds: String(timeoutSeconds) };
    try {
      const res = await a.progress(kubeGet(kube, path, query, a.signal));
      if (res.status !== 200) throw statusError(kube, what, res.status, await a.progress(res.text()));
      const stream = res.body;
      if (!stream) throw new KubeError(`${what}: the answer has no body`, "other");
      openedAt = now();
      const reader = stream.getReader();
      const splitter = new LineSplitter(maxEventBytes, (size) => new EventTooLargeError(`${what}: an event line is longer than ${size} bytes`, "other"));
      let lines = 0;
      for (;;) {
        const chunk = await a.progress(reader.read());
        if (chunk.done) break;
        lines += await handleLines(splitter.push(chunk.value), what);
      }
      if (splitter.rest().trim() !== "") throw new KubeError(`${what}: the stream ended inside an event`, "other");
      // client-go's rule: a watch the server closes at once without a word is a failure, or a
      // misbehaving server (or proxy) would have us reconnect in a tight loop.
      if (lines === 0 && now() - openedAt < 1_000) throw new KubeError(`${what}: the server closed the watch at once`, "other");
    } catch (err) {
      throw a.explain(err);
    } finally {
      a.done();
    }
  }

  // Its own function: a loop over the lines in watch() kept the last one (a whole event, 1.3 MiB of the
  // OSC Secret's) alive in that function's suspended frame for as long as the watch waited for the next.
  async function handleLines(lines: string[], what: string): Promise<number> {
    let handled = 0;
    for (const line of lines) {
      if (line.trim() === "") continue;
      handled++;
      await handleLine(line, what);
    }
    return handled;
  }

  async function handleLine(line: string, what: string): Promise<void> {
    let decoded: WatchLine<T>;
    try {
      decoded = decodeWatchLine<T>(line);
    } catch (err) {
      throw new KubeError(`${what}: ${err instanceof Error ? err.message : String(err)}`, "other", undefined, { cause: err });
    }
    if (decoded.type === "ERROR") throw statusError(kube, what, decoded.code, decoded.status);
    resourceVersion = decoded.resourceVersion;
    if (decoded.type === "BOOKMARK") counters.bookmarks++;
    else await deliver({ type: decoded.type, object: decoded.object });
  }

  function settleBackoff(): void {
    if (openedAt !== undefined && now() - openedAt >= backoff.resetAfterMs) failures = 0;
    openedAt = undefined;
  }

  async function run(): Promise<void> {
    while (!stopper.signal.aborted) {
      try {
        if (resourceVersion === undefined) {
          resourceVersion = await list();
          if (stopper.signal.aborted) break;
          log.info("watch listed", { objects: known.size, resourceVersion });
          markSynced();
        }
        await watch(resourceVersion);
        settleBackoff();
        counters.restarts++;
        log.debug("watch ended; resuming", { resourceVersion });
      } catch (err) {
        if (stopper.signal.aborted) break;
        settleBackoff();
        const e = explainKubeError(err, { server: kube.server, caSource: kube.caSource, what: `watching ${target}` });
        const reason = outageReason(e);
        const retry = nextRetry({ failures, reason: lastReason }, { reason, retryAfterMs: e.retryAfterMs }, backoff, random());
        failures = retry.failures;
        lastReason = reason;
        const delayMs = retry.delayMs;
        if (e instanceof EventTooLargeError) {
          // Resuming would replay the same event: a fresh list delivers the object once it is within bounds again.
          counters.errors++;
          resourceVersion = undefined;
          log.warn("watch failed; listing again", { err: e, retryInMs: Math.round(delayMs) });
        } else if (e.reason === "gone") {
          counters.gone++;
          resourceVersion = undefined;
          log.info("watch resourceVersion gone; listing again", { err: e, retryInMs: Math.round(delayMs) });
        } else {
          counters.errors++;
          log.warn("watch failed; retrying", { err: e, resourceVersion, retryInMs: Math.round(delayMs) });
        }
        await sleep(delayMs, stopper.signal);
      }
    }
    abandonSync(new Error(`watching ${target}: stopped before the first list completed`));
  }

  const running = run();
  return {
    synced,
    stats: () => ({ ...counters }),
    async stop() {
      stopper.abort();
      await running;
    },
  };
}

/**
 * Splits a byte stream into UTF-8 lines (without their "\n"). A line longer than maxBytes is refused as
 * soon as that many bytes of it arrived, with the error tooLong makes; nothing past it is kept.
 */
export class LineSplitter {
  private parts: Uint8Array[] = [];
  private pending = 0;
  private readonly decoder = new TextDecoder();

  constructor(
    private readonly maxBytes: number,
    private readonly tooLong: (maxBytes: number) => Error,
  ) {}

  /** The lines `chunk` completes. */
  push(chunk: Uint8Array): string[] {
    const lines: string[] = [];
    let start = 0;
    for (let nl = chunk.indexOf(10, start); nl >= 0; nl = chunk.indexOf(10, start)) {
      this.add(chunk.subarray(start, nl));
      lines.push(this.rest());
      this.parts = [];
      this.pending = 0;
      start = nl + 1;
    }
    this.add(chunk.subarray(start));
    return lines;
  }

  /** The unfinished line so far. */
  rest(): string {
    return this.decoder.decode(this.parts.length === 1 ? this.parts[0] : Buffer.concat(this.parts));
  }

  private add(part: Uint8Array): void {
    this.pending += part.length;
    if (this.pending > this.maxBytes) throw this.tooLong(this.maxBytes);
    // Copied: a stream may reuse a chunk's memory once it was handed on.
    if (part.length > 0) this.parts.push(part.slice());
  }
}

/** A whole answer as text, refused (EventTooLargeError) once it grows past maxBytes. */
async function readBounded(stream: ReadableStream<Uint8Array>, maxBytes: number, what: string, progress: <R>(p: Promise<R>) => Promise<R>): Promise<string> {
  const reader = stream.getReader();
  const parts: Uint8Array[] = [];
  let size = 0;
  for (;;) {
    const chunk = await progress(reader.read());
    if (chunk.done) return new TextDecoder().decode(Buffer.concat(parts));
    size += chunk.value.length;
    if (size > maxBytes) {
      await reader.cancel();
      throw new EventTooLargeError(`${what}: the answer is longer than ${maxBytes} bytes`, "other");
    }
    parts.push(chunk.value);
  }
}

export type WatchLine<T> =
  | { type: "BOOKMARK"; resourceVersion: string }
  | { type: "ERROR"; code: number; status: unknown }
  | { type: WatchEvent<T>["type"]; object: T; resourceVersion: string };

/** One line of a watch stream. Throws when it is not a watch event: the stream cannot be trusted past it. */
export function decodeWatchLine<T extends KubeObject>(line: string): WatchLine<T> {
  let event: { type?: unknown; object?: (T & { code?: unknown }) | null };
  try {
    event = JSON.parse(line);
  } catch {
    throw new Error(`unreadable event ${JSON.stringify(line.slice(0, 200))}`);
  }
  const { type, object } = event;
  // An ERROR's object is a Status; a code-less one is still a failure, of the server.
  if (type === "ERROR") return { type, code: typeof object?.code === "number" ? object.code : 500, status: object };
  const resourceVersion = object?.metadata?.resourceVersion;
  if (!object || !resourceVersion) throw new Error(`${String(type)} event without a resourceVersion`);
  if (type === "BOOKMARK") return { type, resourceVersion };
  if (type === "ADDED" || type === "MODIFIED" || type === "DELETED") return { type, object, resourceVersion };
  throw new Error(`unknown event type ${JSON.stringify(type)}`);
}

/**
 * How a failure counts for the retry: an API server answering 500/502/503/504 (it cannot reach etcd, or is
 * starting) or 429 (its watch cache is initializing again after etcd was away; it asks for a retry
 * after a second) is an outage like one that cannot be reached at all: retried every few seconds, and
 * its first other answer ends the outage. Found by the etcd-down chaos scenario: after 20 s without
 * etcd the 504s' backoff delayed a Secret change by 15 s, after 5 minutes the 429s' by 14 s.
 */
export function outageReason(e: KubeError): KubeError["reason"] {
  return e.reason === "unreachable" || (e.status !== undefined && [429, 500, 502, 503, 504].includes(e.status)) ? "unreachable" : e.reason;
}

/**
 * The retry after a failed list or watch that follows `prev.failures` failures in a row, the last for
 * `prev.reason`. The first answer from a server that could not be reached starts the doubling over: the
 * outage is over, and what a restarting API server answers first (a 403 before its RBAC cache is filled,
 * a 410 for a resourceVersion from before) must not wait out the backoff the outage built up. A server
 * that cannot be reached is tried again at least every unreachableMaxMs. A server that names an earlier
 * retry than the backoff's ceiling (kube-apiserver's watch cache, initializing again after a short etcd
 * outage, answers 429 with a retry after 1 to 3 s, growing with the outage's length up to 30 s) is tried
 * then, spread by up to a fifth so a pool does not come back in step; a later one than the ceiling is not
 * waited for, as with any outage.
 */
export function nextRetry(prev: { failures: number; reason?: KubeError["reason"] }, failure: { reason: KubeError["reason"]; retryAfterMs?: number }, b: Backoff, random: number): { failures: number; delayMs: number } {
  const { reason, retryAfterMs } = failure;
  const outageOver = prev.reason === "unreachable" && reason !== "unreachable";
  const n = reason === "gone" || outageOver ? 1 : prev.failures + 1;
  const maxMs = reason === "unreachable" ? Math.min(b.unreachableMaxMs, b.maxMs) : b.maxMs;
  if (retryAfterMs !== undefined && retryAfterMs < maxMs) return { failures: n, delayMs: Math.min(maxMs, retryAfterMs * (1 + random / 5)) };
  return { failures: n, delayMs: backoffDelay(n, { initialMs: b.initialMs, maxMs }, random) };
}

/**
 * What a relist means to a handler that saw `known`: DELETED for objects that vanished (or were
 * replaced by a new object of the same name), ADDED for new ones, MODIFIED for changed ones, and
 * nothing for an object it already has in this version, so a relist never repeats an event.
 */
export function relistEvents<T extends KubeObject>(known: ReadonlyMap<string, T>, items: readonly T[]): WatchEvent<T>[] {
  const current = new Map(items.map((item) => [keyOf(item), item]));
  const events: WatchEvent<T>[] = [];
  for (const [key, old] of known) {
    const item = current.get(key);
    if (!item || item.metadata?.uid !== old.metadata?.uid) events.push({ type: "DELETED", object: old });
  }
  for (const item of items) {
    const old = known.get(keyOf(item));
    if (!old || old.metadata?.uid !== item.metadata?.uid) events.push({ type: "ADDED", object: item });
    else if (old.metadata?.resourceVersion !== item.metadata?.resourceVersion) events.push({ type: "MODIFIED", object: item });
  }
  return events;
}

function keyOf(o: KubeObject): string {
  return `${o.metadata?.namespace ?? ""}/${o.metadata?.name ?? ""}`;
}
