// How an agent implementation plugs into the model. The world (world.ts) owns everything that is not the
// agent — the API server, the machines, kubelets, the node-lifecycle controller, clocks, the Secret and
// the faults — and boots a driver's agent on each machine, again after every crash or reboot, with an
// AgentEnv. The agent runs on the env's virtual timers and talks to the API through the env only. The
// invariants are computed from the world's own record of what each machine ran and when (truth.ts),
// never from what an agent claims; the one thing a driver tells the world is how to read "who holds a
// disruption slot" from the API's objects (its protocol's representation), so that a dead machine that
// still holds one counts as disrupted.
import type { V1Lease, V1Node } from "@kubernetes/client-node";
import type { StateStore } from "../../src/apply/state-store.ts";
import type { Files } from "../../src/host/files.ts";
import type { Systemd } from "../../src/host/systemd.ts";
import type { Kube } from "../../src/kube/client.ts";
import type { LeaseApi } from "../../src/kube/lease-api.ts";
import type { Logger } from "../../src/log.ts";
import type { MemoryStore } from "./memory-store.ts";
import type { Content, Layered } from "./osc-model.ts";

/** The machine an agent manages: what runs there and the one way to change it. */
export type Host = {
  /** What runs now; undefined on a fresh machine (nothing applied yet). */
  running(): Content | undefined;
  /** The checksum the apply state (state.json) records as applied last. */
  lastApplied(): string | undefined;
  /** The units an apply of `desired` restarts or stops (what the apply's plan would do). */
  restarts(desired: Content): string[];
  /** Applies `desired`, recorded as `checksum`; resolves once the unit jobs are done (virtual seconds). */
  apply(desired: Content, checksum: string): Promise<void>;
  /** systemd as the health checks see it (unitStatus, unitStates). */
  systemd: Systemd;
  /** state.json as the health checks see it (which units the applied OSC owns). */
  stateStore: StateStore;
};

/** The pool's OSC Secret as this agent last received it (a watch: late while its machine is cut off). */
export type SecretSeen = {
  name: string;
  namespace: string;
  uid: string;
  /** The model's revision number, for traces only. */
  revision: number;
  /** The revision as an agent computes it from the Secret: sha256 over osc.yaml and every overlay. */
  revisionChecksum: string;
  annotations: Readonly<Record<string, string>>;
  /** What a node with these labels applies (overlays picked by label). */
  layered(labels: Readonly<Record<string, string>>): Layered;
};
export type SecretSource = {
  current(): SecretSeen | undefined;
  /** Called whenever a newer Secret arrives. */
  subscribe(listener: () => void): void;
};

export type NodeView = {
  /** The agent's Node as its watch last delivered it (stale while the machine is cut off). */
  current(): V1Node | undefined;
  /**
   * Called when the Node's labels or annotations change (delivered as a watch event would be: by the
   * scheduler, once the machine reaches the API). Status-only updates (kubelet's heartbeats) are not
   * pushed: current() shows them, and pushing them would spend a step per node every 10 s on nothing.
   */
  subscribe(listener: (node: V1Node) => void): () => void;
};

export type AgentEnv = {
  /** The Node's (and machine's) name. */
  node: string;
  /** This process's id: requests and timers are tagged with it and die with it. */
  owner: string;
  /** The pool's OSC Secret (kube-system), from the agent's configuration. */
  secretName: string;
  /** client-node against the model's API (today's code); `leases` is the direct port (the new design). */
  kube: Kube;
  leases(namespace: string): LeaseApi;
  /** The machine's disk: survives crashes and reboots. */
  files: Files;
  host: Host;
  nodes: NodeView;
  secret: SecretSource;
  /**
   * This boot of the machine: the kernel's boot id and when it booted on the monotonic clock. An agent
   * crash keeps it; a machine that dies and boots again gets a new one (src/host/boot-clock.ts).
   */
  boot: { id: string; atMs: number };
  /** The machine's wall clock and the monotonic one (ms). */
  wall(): number;
  mono(): number;
  setTimer(fn: () => void, ms: number): number;
  clearTimer(id: number | undefined): void;
  /** Seeded chance for the agent's own jitter. */
  random(): number;
  log: Logger;
  /** A line in the run's trace (shown with a violation). */
  note(text: string): void;
};

export type Driver = {
  name: string;
  /** Prepares what every agent shares (loading code); called once per process. */
  prepare?(): Promise<void>;
  /**
   * false: the agent takes time and chance only from its env, so the run need not swap Date, the timer
   * functions and Math.random (clock.ts installGlobals) — code that reads them directly needs the swap.
   */
  globals?: boolean;
  /** Boots the agent of one machine; it keeps running on env's timers until the world drops it. */
  start(env: AgentEnv): void;
  /** What a Lease of this driver's protocol says, in a few words for the trace (default: its holderIdentity). */
  describeLease?(lease: V1Lease): string | undefined;
  /** Which nodes hold a disruption slot, read from the API's objects as this driver's protocol keeps them. */
  holders(store: MemoryStore, pool: { secretName: string; namespace: string }): string[];
  /**
   * The revision the protocol stopped pool-wide and the node it names, read from the API's objects (a design
   * that stops a change whose holder's Node was deleted in its gate says so here: I4 does not hold the pool
   * to a change it stopped on purpose). `changes`: sets of unit and file versions as `name@version`, when the
   * design also stops later revisions that carry one of them whole.
   */
  stopped?(store: MemoryStore, pool: { secretName: string; namespace: string }): { revision: string; node: string; changes?: string[][] } | undefined;
};
