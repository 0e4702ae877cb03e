// The client-side rate limit of API requests that clientConnection.qps and burst set, as client-go's
// (flowcontrol.NewTokenBucketRateLimiter over golang.org/x/time/rate): a bucket of `burst` tokens, full at
// the start and refilled at `qps` per second; every request (a watch's start too) takes one, and waits
// until it is there. Measured on the monotonic clock: a stepped wall clock must not stall requests.
import { abortableSleep, monotonicMs } from "../time.ts";

export type RateLimit = { qps: number; burst: number };

export type TokenBucket = {
  /** Takes a token: 0 when one was there, else the milliseconds until the one taken is due. */
  take(): number;
  /** Returns a token taken for a request that was abandoned while it waited. */
  giveBack(): void;
};

export function tokenBucket(limit: RateLimit, now: () => number = monotonicMs): TokenBucket {
  let tokens = limit.burst;
  let last = now();
  const refill = () => {
    const t = now();
    tokens = Math.min(limit.burst, tokens + ((t - last) * limit.qps) / 1000);
    last = t;
  };
  return {
    take() {
      refill();
      tokens -= 1;
      return tokens >= 0 ? 0 : (-tokens * 1000) / limit.qps;
    },
    giveBack() {
      refill();
      tokens = Math.min(limit.burst, tokens + 1);
    },
  };
}

/** Resolves when the request may be sent; rejects with the signal's reason if it aborts first. */
export type Throttle = (signal: AbortSignal) => Promise<void>;

/** undefined: no limit, for a qps that is negative (client-go's "no client-side rate limit") or infinite (x/time/rate's). */
export function throttle(limit: RateLimit): Throttle | undefined {
  if (!(limit.qps > 0 && Number.isFinite(limit.qps))) return undefined;
  const bucket = tokenBucket(limit);
  return async (signal) => {
    const waitMs = bucket.take();
    if (waitMs === 0) return;
    await abortableSleep(waitMs, signal);
    if (!signal.aborted) return;
    bucket.giveBack();
    throw signal.reason;
  };
}
