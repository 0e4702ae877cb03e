// One machine of the pool as the world keeps it: what runs there (per unit, the version and since when),
// its disk (survives crashes and reboots), whether it is alive and reachable, and the agent process now
// running on it. Also systemd and state.json as an agent's health checks read them, derived from that.
import type { V1Node } from "@kubernetes/client-node";
import type { AgentState } from "../../src/api/state.ts";
import type { StateStore } from "../../src/apply/state-store.ts";
import type { Systemd, UnitState, UnitStatus } from "../../src/host/systemd.ts";
import { memoryFiles } from "./memory-files.ts";
import type { Breakages, Content, Revision } from "./osc-model.ts";

export class Machine {
  alive = true;
  /** A fault cut it off the API server (until healed). */
  cutOff = false;
  /** What runs cut it off the network (a broken "network" unit, a few seconds after it started). */
  netBroken = false;
  running: Content | undefined;
  lastApplied: string | undefined;
  readonly files = memoryFiles();
  incarnation = 0;
  /** Boots so far, and when the last one was (monotonic). */
  boots = 1;
  bootedAt = 0;
  /** The agent process running now, if any. */
  owner: string | undefined;
  /** When each unit last became active: on its own wall clock, and since its boot (systemd's *TimestampMonotonic). */
  readonly unitSince = new Map<string, { wall: number; sinceBoot: number }>();
  /** When the node-lifecycle controller last saw a heartbeat (monotonic). */
  heartbeatSeenAt = 0;
  contentChangedAt = 0;
  /**
   * It has a good OSC to roll back to: it settled on one (healthy on it for the settle time after a
   * disruption: its gate), or its first OSC was good (a fresh node's first apply is its rollback target).
   */
  ranGood = false;
  /** The Secret as its agent last received it, and who listens for the next one. */
  seen: Revision | undefined;
  listeners: (() => void)[] = [];
  /** Who listens for changes of its Node's labels and annotations (its agent's NodeView.subscribe). */
  nodeListeners: ((node: V1Node) => void)[] = [];
  /** The Node as the agent's watch last delivered it. */
  nodeSeen: V1Node | undefined;

  constructor(readonly name: string) {}

  reachable(): boolean {
    return this.alive && !this.cutOff && !this.netBroken;
  }
}

/** The units an apply of `desired` restarts or stops on a machine running `running` (new units are only started). */
export function restartsOf(running: Content | undefined, desired: Content): string[] {
  if (!running) return [];
  return Object.keys(running.units)
    .filter((u) => desired.units[u] !== running.units[u])
    .sort();
}

/** systemd as D-Bus would answer about the machine's units: a broken "unit" version has failed. */
export function systemdOf(m: Machine, breakages: Breakages): Systemd {
  const status = (unit: string): UnitStatus => {
    const version = m.running?.units[unit];
    const base = { name: unit, mainPID: 0, unitFileState: "enabled", triggeredBy: [] };
    if (version === undefined) return { ...base, loadState: "not-found", activeState: "inactive", subState: "dead", unitFileState: "" };
    if (breakages.of(unit, version) === "unit") return { ...base, loadState: "loaded", activeState: "failed", subState: "failed", result: "exit-code", serviceType: "simple" };
    const since = m.unitSince.get(unit);
    return {
      ...base,
      loadState: "loaded",
      activeState: "active",
      subState: "running",
      mainPID: 1000,
      serviceType: "simple",
      ...(since !== undefined ? { activeEnterTimestamp: new Date(since.wall), stateChangeTimestamp: new Date(since.wall), stateChangeSinceBootMs: since.sinceBoot } : {}),
    };
  };
  const unsupported = (what: string) => async (): Promise<never> => {
    throw new Error(`the model's systemd does not ${what}: applies go through Host.apply`);
  };
  return {
    address: "model",
    daemonReload: unsupported("reload"),
    enableUnits: unsupported("enable units"),
    disableUnits: unsupported("disable units"),
    start: unsupported("start units"),
    restart: unsupported("restart units"),
    queueRestart: unsupported("restart units"),
    stop: unsupported("stop units"),
    unitStatus: async (unit) => status(unit),
    unitStates: async (units) =>
      new Map(
        units.map((u): [string, UnitState] => {
          const s = status(u);
          return [u, { loadState: s.loadState, activeState: s.activeState, subState: s.subState, unitFileState: s.unitFileState }];
        }),
      ),
    listUnits: async () =>
      Object.keys(m.running?.units ?? {}).map((name) => {
        const s = status(name);
        return { name, description: name, loadState: s.loadState, activeState: s.activeState, subState: s.subState };
      }),
    watchUnits: async () => () => undefined,
    close: () => undefined,
  };
}

/** state.json as the health gate reads it: every unit of what runs is owned, and what was applied last. */
export function stateStoreOf(m: Machine, wall: () => number): StateStore {
  return {
    read: async (): Promise<AgentState> => ({
      version: 1,
      owned: { version: 1, files: {}, units: Object.fromEntries(Object.keys(m.running?.units ?? {}).map((u) => [u, { enable: true, dropIns: {} }])) },
      ...(m.lastApplied ? { lastApplied: { checksum: m.lastApplied, at: new Date(wall()).toISOString() } } : {}),
    }),
    write: async () => undefined,
    recordApplied: async () => undefined,
  };
}
