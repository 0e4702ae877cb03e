// The kinds of loop the controllers run, one implementation each, so that the next controller is
// wired in a few lines (as gardener-node-agent's controllers share controller-runtime's):
//   - serializer: async operations one at a time, in call order (state read-modify-write, a Lease's
//     renew and release, events that must not race);
//   - singleFlight: a level-triggered reconcile: a trigger during a pass asks for one more pass
//     afterwards, never for two at once;
//   - every: a periodic tick, with a wake-up that runs the next tick at once;
//   - later: one pending wake-up (a requeue or retry after a delay), moved or cancelled as a whole.
// The work each one runs must handle its own errors: a loop only sequences and spaces it.
import { monotonicMs } from "./time.ts";

export type Serializer = {
  /** Runs `op` once every operation queued before it has settled, whatever their outcome. */
  run<T>(op: () => Promise<T>): Promise<T>;
  /** Resolves once every operation queued so far has settled. */
  idle(): Promise<void>;
};

export function serializer(): Serializer {
  let tail: Promise<unknown> = Promise.resolve();
  return {
    run<T>(op: () => Promise<T>): Promise<T> {
      const result = tail.then(op);
      tail = result.catch(() => undefined);
      return result;
    },
    idle: () => tail.then(() => undefined),
  };
}

export type SingleFlight = {
  /** Runs a pass now, or once more after the one in flight (with the latest reason). */
  trigger(why: string): void;
  /**
   * Runs `fn` when no pass is in flight, and starts none while it runs; a trigger meanwhile runs its pass
   * after it. Rejects once stopped.
   */
  exclusive<T>(fn: () => Promise<T>): Promise<T>;
  /** No pass starts after this; resolves once the one in flight has finished. */
  stop(): Promise<void>;
};

export function singleFlight(pass: (why: string) => Promise<void>): SingleFlight {
  let running: Promise<void> | undefined;
  let again: string | undefined;
  let stopped = false;
  const trigger = (why: string) => {
    if (stopped) return;
    if (running) {
      again = why;
      return;
    }
    running = (async () => {
      for (let next: string | undefined = why; next !== undefined && !stopped; ) {
        again = undefined;
        await pass(next);
        next = again;
      }
    })().finally(() => {
      running = undefined;
    });
  };
  const exclusive = async <T>(fn: () => Promise<T>): Promise<T> => {
    while (running) await running;
    if (stopped) throw new Error("stopping: no more passes");
    let release = () => {};
    running = new Promise<void>((done) => (release = done));
    try {
      return await fn();
    } finally {
      running = undefined;
      release();
      const next = again;
      again = undefined;
      if (next !== undefined) trigger(next);
    }
  };
  return {
    trigger,
    exclusive,
    stop: async () => {
      stopped = true;
      await running;
    },
  };
}

export type Loop = { wake(): void; stop(): Promise<void> };

export type EveryOptions = {
  /** Wait an interval before the first tick (default: tick at once). */
  firstAfterInterval?: boolean;
  /** A steady cadence: the time a tick took counts towards the interval (default: a full interval between ticks). */
  steady?: boolean;
  /**
   * The first tick waits for `until` to settle, for at most `maxMs` (a stop ends the wait, a wake-up does
   * not: the tick then runs at once): work that is to go first at the agent's start.
   */
  firstAfter?: FirstAfter;
};

export type FirstAfter = { until: Promise<unknown>; maxMs: number };

/**
 * Runs `tick` every `intervalMs`. A wake-up during a tick is not lost: the pause after it is skipped. A
 * tick that failed may return a shorter pause (a retry), so one failure, say of the API server during an
 * outage, does not stand for a whole interval after its cause is gone.
 */
export function every(intervalMs: number, tick: () => Promise<number | void>, opts: EveryOptions = {}): Loop {
  let stopped = false;
  let woken = false;
  let interrupt: (() => void) | undefined;
  let endFirstWait: (() => void) | undefined;
  const waitFirst = (f: FirstAfter) =>
    new Promise<void>((resolve) => {
      const timer = setTimeout(() => endFirstWait?.(), f.maxMs);
      endFirstWait = () => {
        clearTimeout(timer);
        endFirstWait = undefined;
        resolve();
      };
      f.until.then(endFirstWait, endFirstWait);
    });
  const pause = (ms: number) =>
    new Promise<void>((resolve) => {
      if (woken || stopped) return resolve();
      const timer = setTimeout(resolve, ms);
      interrupt = () => {
        clearTimeout(timer);
        resolve();
      };
    });
  const loop = (async () => {
    if (opts.firstAfter && !stopped) await waitFirst(opts.firstAfter);
    if (opts.firstAfterInterval) await pause(intervalMs);
    while (!stopped) {
      woken = false;
      interrupt = undefined;
      const started = monotonicMs();
      const retryInMs = await tick();
      const regular = opts.steady ? Math.max(0, intervalMs - (monotonicMs() - started)) : intervalMs;
      if (!stopped) await pause(typeof retryInMs === "number" ? Math.min(retryInMs, regular) : regular);
    }
  })();
  const wake = () => {
    woken = true;
    interrupt?.();
  };
  return {
    wake,
    stop: async () => {
      stopped = true;
      endFirstWait?.();
      wake();
      await loop;
    },
  };
}

export type Later = {
  /** Runs the callback once after `ms`, instead of any wake-up set before. */
  in(ms: number): void;
  /** Whether a wake-up is pending. */
  pending(): boolean;
  cancel(): void;
};

/** One pending wake-up for `fn` (a controller's requeue: "reconcile again after X"). */
export function later(fn: () => void): Later {
  let timer: ReturnType<typeof setTimeout> | undefined;
  const cancel = () => {
    if (timer) clearTimeout(timer);
    timer = undefined;
  };
  return {
    in(ms) {
      cancel();
      timer = setTimeout(() => {
        timer = undefined;
        fn();
      }, Math.max(0, ms));
    },
    pending: () => timer !== undefined,
    cancel,
  };
}
