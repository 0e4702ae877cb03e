// src/controllers/every.ts: the periodic loop of the checking controllers.
import { expect, test } from "bun:test";
import { every } from "../../src/controllers/every.ts";
import { waitFor } from "../harness/exec.ts";

test("a tick runs at once, then after the interval; a wake-up runs the next one at once", async () => {
  let ticks = 0;
  const loop = every(60_000, async () => {
    ticks++;
  });
  try {
    await waitFor("the first tick", () => ticks === 1, 2_000, 5);
    loop.wake();
    await waitFor("the tick a wake-up asked for", () => ticks === 2, 2_000, 5);
  } finally {
    await loop.stop();
  }
});

// Found by test/chaos/scenarios/apiserver-down.ts: the unit check failed during an outage, and /readyz
// stayed 503 for up to a whole syncPeriod (1 min) after the API server was back.
test("a tick that asks for a shorter pause (a retry after a failure) gets it", async () => {
  const paused: number[] = [];
  let last = performance.now();
  const loop = every(60_000, async () => {
    const now = performance.now();
    paused.push(now - last);
    last = now;
    return paused.length < 3 ? 20 : 120_000;
  });
  try {
    await waitFor("three ticks 20 ms apart", () => paused.length >= 3, 2_000, 5);
    expect(paused.slice(1, 3).every((ms) => ms >= 15 && ms < 1_000)).toBe(true);
  } finally {
    await loop.stop();
  }
});
