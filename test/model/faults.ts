// Which faults a run injects, and when: a profile weighs the kinds (a profile that allows only a few
// kinds pins a violation on them), the injector fires at random virtual times and, as the faults that
// matter hit a node in the middle of its change, aims most node faults at a node that is disrupted or
// holds a slot, and most OSC changes at a time when some node is in its gate.
import { units } from "./osc-model.ts";
import type { Machine } from "./machine.ts";
import { type Rng, rolloutKey, type World, type WorldConfig } from "./world.ts";

export type FaultKind =
  | "crash"
  | "death"
  | "revive"
  | "replace-dead"
  | "partition"
  | "break-watches"
  | "clock-jump"
  | "osc-good"
  | "osc-bad-unit"
  | "osc-bad-network"
  | "osc-files"
  | "k-change"
  | "add-node"
  | "remove-node"
  | "pause";

export type Profile = {
  name: string;
  about: string;
  weights: Partial<Record<FaultKind, number>>;
  /** Virtual ms between two faults, uniformly in this range. */
  everyMs: [number, number];
  /** The chance that a delivered request's answer is lost. */
  loseAnswer: number;
  /** The budgets a run starts with and k changes pick from. */
  budgets: string[];
  /** The world of a run (randomised per seed). */
  world(rng: Rng): Partial<WorldConfig>;
};

const nodes = (rng: Rng, min: number, max: number) => min + rng.int(max - min + 1);
const oscChanges = { "osc-good": 3, "osc-bad-unit": 2, "osc-bad-network": 1, "osc-files": 1 };

export const profiles: Record<string, Profile> = {
  calm: {
    name: "calm",
    about: "no faults: good changes only (what any correct agent must pass; the harness's own tests)",
    weights: { "osc-good": 1 },
    everyMs: [20_000, 60_000],
    loseAnswer: 0,
    budgets: ["1"],
    world: (rng) => ({ nodes: nodes(rng, 3, 5), rollback: rng.chance(0.5) }),
  },
  all: {
    name: "all",
    about: "every fault kind",
    weights: { ...oscChanges, crash: 2, death: 2, revive: 1, "replace-dead": 1, partition: 2, "break-watches": 1, "clock-jump": 1, "k-change": 1, "add-node": 1, "remove-node": 1, pause: 1 },
    everyMs: [5_000, 40_000],
    loseAnswer: 0.01,
    budgets: ["1", "2", "50%", "34%"],
    world: (rng) => ({ nodes: nodes(rng, 3, 6), overlays: rng.chance(0.3), rollback: rng.chance(0.6) }),
  },
  "holder-death": {
    name: "holder-death",
    about: "machines die during their change (power, panic, a change that cuts the network) and are replaced or come back",
    weights: { "osc-good": 3, "osc-bad-unit": 1, "osc-bad-network": 1, death: 3, revive: 1, "replace-dead": 1 },
    everyMs: [10_000, 40_000],
    loseAnswer: 0,
    budgets: ["1", "2"],
    world: (rng) => ({ nodes: nodes(rng, 3, 5), rollback: rng.chance(0.5) }),
  },
  "clock-skew": {
    name: "clock-skew",
    about: "wall clocks step by 30 s to 5 min; good and bad changes",
    weights: { "osc-good": 3, "osc-bad-unit": 1, "clock-jump": 3 },
    everyMs: [10_000, 40_000],
    loseAnswer: 0,
    budgets: ["1", "2"],
    world: (rng) => ({ nodes: nodes(rng, 3, 5), rollback: rng.chance(0.5) }),
  },
  "change-in-gate": {
    name: "change-in-gate",
    about: "OSC changes during gates, some touching only files; agent crashes",
    weights: { "osc-good": 3, "osc-files": 3, "osc-bad-unit": 1, crash: 1 },
    everyMs: [5_000, 30_000],
    loseAnswer: 0,
    budgets: ["1", "2"],
    world: (rng) => ({ nodes: nodes(rng, 3, 5), rollback: rng.chance(0.5) }),
  },
  overlays: {
    name: "overlays",
    about: "every node has an overlay of its own; good and bad changes",
    weights: { "osc-good": 2, "osc-bad-unit": 3 },
    everyMs: [20_000, 60_000],
    loseAnswer: 0,
    budgets: ["1", "2"],
    world: (rng) => ({ nodes: nodes(rng, 3, 5), overlays: true, rollback: rng.chance(0.5) }),
  },
  "budget-change": {
    name: "budget-change",
    about: "max-disrupted changes between counts; good changes only",
    weights: { "osc-good": 3, "k-change": 3 },
    everyMs: [5_000, 30_000],
    loseAnswer: 0,
    budgets: ["1", "2", "3"],
    world: (rng) => ({ nodes: nodes(rng, 4, 7), rollback: rng.chance(0.5) }),
  },
  "pool-size": {
    name: "pool-size",
    about: "a percentage budget while the pool grows and shrinks; good changes only",
    weights: { "osc-good": 3, "add-node": 2, "remove-node": 2 },
    everyMs: [5_000, 30_000],
    loseAnswer: 0,
    budgets: ["50%", "34%", "25%"],
    world: (rng) => ({ nodes: nodes(rng, 4, 7), rollback: rng.chance(0.5) }),
  },
  "crash-partition": {
    name: "crash-partition",
    about: "agent crashes, partitions, broken watches and lost answers; good and bad changes",
    weights: { ...oscChanges, crash: 3, partition: 3, "break-watches": 1, pause: 1 },
    everyMs: [5_000, 30_000],
    loseAnswer: 0.02,
    budgets: ["1", "2"],
    world: (rng) => ({ nodes: nodes(rng, 3, 5), rollback: rng.chance(0.6) }),
  },
};

export class FaultInjector {
  private timer: number | undefined;
  constructor(
    private readonly world: World,
    private readonly profile: Profile,
  ) {}

  start(): void {
    const [min, max] = this.profile.everyMs;
    this.timer = this.world.clock.setTimer("world.faults", () => this.inject(), min + this.world.rng.int(max - min));
  }
  stop(): void {
    this.world.clock.clearTimer(this.timer);
    this.timer = undefined;
  }

  private inject(): void {
    this.start();
    const w = this.world;
    const kinds = Object.entries(this.profile.weights) as [FaultKind, number][];
    let roll = w.rng.next() * kinds.reduce((s, [, n]) => s + n, 0);
    const kind = (kinds.find(([, n]) => (roll -= n) < 0) ?? kinds[0])?.[0];
    if (kind) this.apply(kind);
  }

  private apply(kind: FaultKind): void {
    const w = this.world;
    const alive = [...w.machines.values()].filter((m) => m.alive);
    const dead = [...w.machines.values()].filter((m) => !m.alive);
    const rng = w.rng;
    switch (kind) {
      case "crash": {
        const m = this.target(alive);
        if (m) w.crash(m, 1_000 + rng.int(30_000));
        return;
      }
      case "death": {
        const m = this.target(alive);
        if (m && alive.length > 1) w.kill(m);
        return;
      }
      case "revive":
        if (dead.length > 0) w.revive(rng.pick(dead));
        return;
      case "replace-dead":
        if (dead.length > 0) w.replace(rng.pick(dead));
        return;
      case "partition": {
        const m = this.target(alive);
        if (m) w.partition(m, 5_000 + rng.int(120_000));
        return;
      }
      case "break-watches": {
        const m = rng.pick(alive);
        if (m) {
          w.api.breakWatches(m.name);
          w.trace.add(`FAULT ${m.name}: watches break`);
        }
        return;
      }
      case "clock-jump": {
        const m = this.target(alive);
        if (m) w.jump(m, (rng.chance(0.5) ? -1 : 1) * (30_000 + rng.int(5 * 60_000)));
        return;
      }
      case "k-change": {
        const now = w.revision().annotations[rolloutKey("max-disrupted")];
        const choices = this.profile.budgets.filter((b) => b !== now);
        if (choices.length > 0) this.publish({ [rolloutKey("max-disrupted")]: rng.pick(choices) }, undefined, "budget changed");
        return;
      }
      case "add-node":
        if (w.machines.size < w.config.maxNodes) w.addMachine();
        return;
      case "remove-node": {
        const idle = alive.filter((m) => !w.truth.disrupted(m.name));
        if (idle.length > 0 && w.machines.size > 2) w.remove(rng.pick(idle));
        return;
      }
      case "pause": {
        const m = rng.pick(alive);
        if (m) w.pause(m, !w.paused(m));
        return;
      }
      default:
        return this.change(kind);
    }
  }

  /** A new OSC; most of them while some node is in its gate. */
  private change(kind: "osc-good" | "osc-bad-unit" | "osc-bad-network" | "osc-files"): void {
    const w = this.world;
    if (w.truth.disruptions.size === 0 && w.rng.chance(0.5)) return;
    const osc = w.revision().osc;
    const unitsNow = { ...osc.units };
    const filesNow = { ...osc.files };
    let note: string;
    if (kind === "osc-files") {
      filesNow["/etc/app.conf"] = `f${w.rng.int(1_000_000)}`;
      note = "files only";
    } else if (kind === "osc-good") {
      // A good change also replaces whatever is broken (the fix).
      for (const [u, v] of Object.entries(unitsNow)) if (w.breakages.of(u, v)) unitsNow[u] = w.version(u);
      const u = w.rng.pick(units);
      unitsNow[u] = w.version(u);
      note = `good change of ${u}`;
    } else {
      const u = kind === "osc-bad-network" ? w.rng.pick(["kubelet.service", "app.service"]) : w.rng.pick(units);
      unitsNow[u] = w.version(u, kind === "osc-bad-network" ? "network" : "unit");
      note = `BAD change of ${u} (${kind === "osc-bad-network" ? "breaks the network" : "fails"})`;
    }
    this.publish({}, { units: unitsNow, files: filesNow }, note);
  }

  private publish(annotations: Record<string, string>, osc: { units: Record<string, string>; files: Record<string, string> } | undefined, note: string): void {
    const prev = this.world.revision();
    this.world.publish({ osc: osc ?? prev.osc, overlays: prev.overlays, annotations: { ...prev.annotations, ...annotations }, note });
  }

  /** Mostly a node in the middle of its change (disrupted, or holding a slot), else any. */
  private target(candidates: Machine[]): Machine | undefined {
    if (candidates.length === 0) return undefined;
    const w = this.world;
    if (w.rng.chance(0.7)) {
      const holders = new Set(w.driver.holders(w.store, w.pool()));
      const busy = candidates.filter((m) => w.truth.disrupted(m.name) || holders.has(m.name));
      if (busy.length > 0) return w.rng.pick(busy);
    }
    return w.rng.pick(candidates);
  }
}
