// Time for durations: every wait, timeout, backoff and "how long since" in the agent is measured on the
// monotonic clock, which NTP steps and an operator's `date -s` do not move. The wall clock (Date.now) is
// kept for facts shared with others: timestamps sent to the API server or written for people, lease
// renewTimes compared with other nodes' clocks, certificate validity, maintenance windows.

/** Milliseconds on this process's monotonic clock: only differences between two readings mean anything. */
export const monotonicMs = (): number => performance.now();
