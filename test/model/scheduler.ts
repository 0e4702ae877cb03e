// One schedule: a seeded run of a pool under a fault profile. At each step the scheduler picks one thing
// that can happen now — a queued request delivered (or failed), a watch event or Secret push handed over,
// a due timer fired (an agent's next reconcile, a renewal, a kubelet heartbeat, the node-lifecycle
// controller, a fault) — or lets virtual time pass. After the step the code it woke runs until it waits
// again (the microtask queue drained), and the invariants are checked. After `steps` steps the faults
// stop, and the pool gets `quietMs` of virtual time to finish before the final invariants are judged.
//
// A seed reproduces a schedule exactly: the scheduler's choices and the code's Math.random come from
// seeded streams, and nothing waits on real time or I/O.
import { prng } from "../harness/prng.ts";
import { installGlobals } from "./clock.ts";
import type { Driver } from "./driver.ts";
import { FaultInjector, type Profile } from "./faults.ts";
import { endChecks, finished } from "./invariants.ts";
import type { ApiStats } from "./memory-api.ts";
import type { Violation } from "./truth.ts";
import { defaultWorld, World, type WorldConfig } from "./world.ts";

export type ScheduleOptions = {
  driver: Driver;
  profile: Profile;
  seed: number;
  /** Steps with faults; the quiet time after them has its own cap. */
  steps: number;
  quietMs?: number;
  world?: Partial<WorldConfig>;
  /** Keep the whole trace (ScheduleResult.trace). */
  dump?: boolean;
  /** Called with the world at the end (debugging a schedule). */
  inspect?: (w: World) => void;
};

export type ScheduleResult = {
  seed: number;
  profile: string;
  steps: number;
  virtualMs: number;
  config: WorldConfig;
  violations: Violation[];
  counts: Partial<Record<Violation["invariant"], number>>;
  api: ApiStats;
  revisions: number;
  trace?: string[];
};

/** The chance that a step lets time pass although something could happen (a slow answer, a busy node). */
const lingerChance = 0.03;
const quietStepCap = 40_000;

// The real setImmediate: it runs after the microtask queue is empty.
const realSetImmediate = setImmediate;
const drained = () => new Promise<void>((resolve) => realSetImmediate(resolve));

export async function runSchedule(o: ScheduleOptions): Promise<ScheduleResult> {
  const rng = prng(o.seed);
  const code = prng(Math.imul(o.seed ^ 0x5bd1e995, 0x27d4eb2d));
  const config: WorldConfig = { ...defaultWorld, budget: rng.pick(o.profile.budgets), ...o.profile.world(rng), ...o.world };
  const world = new World(o.driver, config, rng, code.next);
  const faults = new FaultInjector(world, o.profile);
  if (o.dump) world.trace.keepAll();
  const restoreGlobals = o.driver.globals === false ? () => undefined : installGlobals(world.clock, code.next);
  let steps = 0;
  try {
    world.boot();
    faults.start();
    while (steps < o.steps && (await step(world, o.profile.loseAnswer))) steps++;
    faults.stop();
    world.quiesce();
    const until = world.clock.mono + (o.quietMs ?? 20 * 60_000);
    const holdingSince = new Map<string, number>();
    for (let quiet = 0; world.clock.mono < until && quiet < quietStepCap; quiet++, steps++) {
      if (!(await step(world, 0))) break;
      const holders = new Set(world.driver.holders(world.store, world.pool()));
      for (const h of holders) if (!holdingSince.has(h)) holdingSince.set(h, world.clock.mono);
      for (const h of holdingSince.keys()) if (!holders.has(h)) holdingSince.delete(h);
      if (quiet % 64 === 63 && finished(world)) break;
    }
    endChecks(world, holdingSince);
    o.inspect?.(world);
  } finally {
    restoreGlobals();
  }
  return {
    seed: o.seed,
    profile: o.profile.name,
    steps,
    virtualMs: world.clock.mono,
    config,
    violations: world.truth.violations,
    counts: world.truth.counts,
    api: world.api.stats,
    revisions: world.revisions.length,
    ...(o.dump ? { trace: world.trace.tail(Number.POSITIVE_INFINITY) } : {}),
  };
}

/** One step; false when nothing can ever happen again. */
async function step(w: World, loseAnswer: number): Promise<boolean> {
  w.step++;
  const deliveries = w.api.deliveries();
  const timers = w.clock.due();
  const n = deliveries.length + timers.length;
  if (n === 0 || w.rng.chance(lingerChance)) {
    const next = w.clock.nextDue();
    if (n > 0) w.clock.advanceTo(w.clock.mono + 1 + w.rng.int(250));
    else if (next !== undefined) w.clock.advanceTo(next);
    else return false;
    w.api.expire();
  } else {
    const i = w.rng.int(n);
    const d = deliveries[i];
    const t = timers[i - deliveries.length];
    w.clock.current = d?.owner ?? t?.owner;
    if (d) w.api.deliver(d, { loseAnswer: loseAnswer > 0 && w.rng.chance(loseAnswer) });
    else if (t) w.clock.fire(t);
    await drained();
    w.clock.current = undefined;
  }
  w.truth.settle();
  w.truth.check(w.deadHolders());
  return true;
}
