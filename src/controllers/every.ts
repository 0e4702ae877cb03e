// The periodic loop of the checking controllers: run a tick now and then every interval, with a
// wake-up to run the next tick at once. A wake-up during a tick is not lost: the pause after it is
// skipped. A tick that failed may ask for a shorter pause (a retry), so one failure, say of the API
// server during an outage, does not stand for a whole interval after the cause is gone.
export type Loop = { wake(): void; stop(): Promise<void> };

/** `tick` must handle its own errors: the loop only sequences and spaces the ticks. It returns the pause
 *  before the next tick when that is not `intervalMs`. */
export function every(intervalMs: number, tick: () => Promise<number | void>): Loop {
  let stopped = false;
  let woken = false;
  let interrupt: (() => void) | undefined;
  const pause = (ms: number) =>
    new Promise<void>((resolve) => {
      if (woken) return resolve();
      const timer = setTimeout(resolve, ms);
      interrupt = () => {
        clearTimeout(timer);
        resolve();
      };
    });
  const loop = (async () => {
    while (!stopped) {
      woken = false;
      const next = await tick();
      if (!stopped) await pause(typeof next === "number" ? Math.min(next, intervalMs) : intervalMs);
      interrupt = undefined;
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
      wake();
      await loop;
    },
  };
}
