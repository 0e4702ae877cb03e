// Time for durations: every wait, timeout, backoff and "how long since" in the agent is measured on the
// monotonic clock, which NTP steps and an operator's `date -s` do not move. The wall clock (Date.now) is
// kept for facts shared with others: timestamps sent to the API server or written for people, lease
// renewTimes compared with other nodes' clocks, certificate validity, maintenance windows.

/** Milliseconds on this process's monotonic clock: only differences between two readings mean anything. */
export const monotonicMs = (): number => performance.now();

/** setTimeout as a promise that resolves early when `signal` aborts. */
export function abortableSleep(ms: number, signal: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    const done = () => {
      clearTimeout(timer);
      signal.removeEventListener("abort", done);
      resolve();
    };
    const timer = setTimeout(done, ms);
    signal.addEventListener("abort", done);
    if (signal.aborted) done();
  });
}

/** The delay before retry number `failures` (1, 2, …): doubling from initialMs, capped, jittered to 50–100 %. */
export function backoffDelay(failures: number, b: { initialMs: number; maxMs: number }, random: number): number {
  const ceiling = Math.min(b.maxMs, b.initialMs * 2 ** Math.max(0, failures - 1));
  return ceiling / 2 + (ceiling / 2) * random;
}
