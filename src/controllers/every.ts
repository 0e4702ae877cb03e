// The periodic loop of the checking controllers: run a tick now and then every interval, with a
// wake-up to run the next tick at once. A wake-up during a tick is not lost: the pause after it is
// skipped.
export type Loop = { wake(): void; stop(): Promise<void> };

/** `tick` must handle its own errors: the loop only sequences and spaces the ticks. */
export function every(intervalMs: number, tick: () => Promise<void>): Loop {
  let stopped = false;
  let woken = false;
  let interrupt: (() => void) | undefined;
  const pause = () =>
    new Promise<void>((resolve) => {
      if (woken) return resolve();
      const timer = setTimeout(resolve, intervalMs);
      interrupt = () => {
        clearTimeout(timer);
        resolve();
      };
    });
  const loop = (async () => {
    while (!stopped) {
      woken = false;
      await tick();
      if (!stopped) await pause();
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
