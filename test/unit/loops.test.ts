// The controllers' loop primitives (src/loops.ts).
import { describe, expect, test } from "bun:test";
import { every, later, serializer, singleFlight } from "../../src/loops.ts";

/** Resolves once `cond` holds (polled: the loops run on timers). */
async function until(cond: () => boolean): Promise<void> {
  while (!cond()) await Bun.sleep(1);
}

/** A promise and its resolver, to hold an operation in flight. */
function gate() {
  let open!: () => void;
  const opened = new Promise<void>((r) => (open = r));
  return { opened, open };
}

describe("serializer", () => {
  test("runs operations one at a time in call order, a failure does not stop the ones after it", async () => {
    const ops = serializer();
    const log: string[] = [];
    const first = gate();
    const a = ops.run(async () => {
      log.push("a start");
      await first.opened;
      log.push("a end");
      throw new Error("a failed");
    });
    const b = ops.run(async () => {
      log.push("b");
      return 2;
    });
    await Promise.resolve();
    expect(log).toEqual(["a start"]);
    first.open();
    expect(await a.catch((e: Error) => e.message)).toBe("a failed");
    expect(await b).toBe(2);
    await ops.idle();
    expect(log).toEqual(["a start", "a end", "b"]);
  });
});

describe("singleFlight", () => {
  test("triggers during a pass make one more pass afterwards, with the latest reason", async () => {
    const whys: string[] = [];
    let hold = gate();
    const passes = singleFlight(async (why) => {
      whys.push(why);
      await hold.opened;
    });
    passes.trigger("one");
    passes.trigger("two");
    passes.trigger("three");
    const first = hold;
    hold = gate();
    first.open();
    await until(() => whys.length === 2);
    hold.open();
    await passes.stop();
    expect(whys).toEqual(["one", "three"]);
  });
  test("nothing runs after stop, and stop waits for the pass in flight", async () => {
    const whys: string[] = [];
    const hold = gate();
    let finished = false;
    const passes = singleFlight(async (why) => {
      whys.push(why);
      await hold.opened;
      finished = true;
    });
    passes.trigger("one");
    const stopped = passes.stop();
    passes.trigger("two");
    hold.open();
    await stopped;
    expect({ whys, finished }).toEqual({ whys: ["one"], finished: true });
  });
});

describe("every", () => {
  // Found by test/chaos/scenarios/apiserver-down.ts: the unit check failed during an outage, and /readyz
  // stayed 503 for up to a whole syncPeriod (1 min) after the API server was back.
  test("a tick that asks for a shorter pause (a retry after a failure) gets it", async () => {
    const paused: number[] = [];
    let last = performance.now();
    const loop = every(60_000, async () => {
      const now = performance.now();
      paused.push(now - last);
      last = now;
      return 20;
    });
    try {
      await until(() => paused.length >= 3);
      expect(paused.slice(1, 3).every((ms) => ms >= 15 && ms < 1_000)).toBe(true);
    } finally {
      await loop.stop();
    }
  });

  test("ticks at once, then every interval; a wake-up runs the next tick at once", async () => {
    let ticks = 0;
    const loop = every(60_000, async () => void ticks++);
    await until(() => ticks === 1);
    loop.wake();
    await until(() => ticks === 2);
    await loop.stop();
    expect(ticks).toBe(2);
  });
  test("firstAfterInterval waits before the first tick", async () => {
    let ticks = 0;
    const loop = every(60_000, async () => void ticks++, { firstAfterInterval: true });
    await Bun.sleep(10);
    expect(ticks).toBe(0);
    await loop.stop();
    expect(ticks).toBe(0);
  });
  test("firstAfter: the first tick waits for the promise, not for a wake-up; a stop ends the wait", async () => {
    let ticks = 0;
    const first = gate();
    const loop = every(60_000, async () => void ticks++, { firstAfter: { until: first.opened, maxMs: 60_000 } });
    loop.wake();
    await Bun.sleep(20);
    expect(ticks).toBe(0);
    first.open();
    await until(() => ticks === 1);
    await loop.stop();
    const never = every(60_000, async () => void ticks++, { firstAfter: { until: new Promise(() => {}), maxMs: 60_000 } });
    const stopping = performance.now();
    await never.stop();
    expect(performance.now() - stopping).toBeLessThan(1_000);
    expect(ticks).toBe(1);
  });
  test("firstAfter: at most maxMs, and a rejected promise ends the wait too", async () => {
    let ticks = 0;
    const slow = every(60_000, async () => void ticks++, { firstAfter: { until: new Promise(() => {}), maxMs: 30 } });
    await until(() => ticks === 1);
    await slow.stop();
    const failed = every(60_000, async () => void ticks++, { firstAfter: { until: Promise.reject(new Error("x")), maxMs: 60_000 } });
    await until(() => ticks === 2);
    await failed.stop();
  });
  test("steady: the tick's own time counts towards the interval", async () => {
    const starts: number[] = [];
    const loop = every(
      300,
      async () => {
        starts.push(performance.now());
        await Bun.sleep(200);
      },
      { steady: true },
    );
    await until(() => starts.length === 3);
    await loop.stop();
    const gaps = starts.slice(1).map((t, i) => t - (starts[i] as number));
    for (const g of gaps) expect(g).toBeLessThan(450); // a full pause after each tick would make 500
  });
});

describe("later", () => {
  test("one pending wake-up: setting it again replaces it, cancel drops it", async () => {
    const fired: number[] = [];
    let n = 0;
    const w = later(() => fired.push(++n));
    w.in(5);
    w.in(30); // replaces the first
    expect(w.pending()).toBe(true);
    await until(() => fired.length === 1);
    expect(w.pending()).toBe(false);
    w.in(1);
    w.cancel();
    expect(w.pending()).toBe(false);
    // A later wake-up of its own fires after the cancelled one would have.
    let probed = false;
    later(() => (probed = true)).in(20);
    await until(() => probed);
    expect(fired).toEqual([1]);
  });
});
