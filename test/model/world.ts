// The simulated pool around the agents: the API server (memory-api.ts), the pool's OSC Secret and its
// revisions, the machines (machine.ts) with their kubelets, kube-controller-manager's node-lifecycle
// controller, and the agent processes a Driver boots on each machine. The world also applies what the
// agents ask of their machines, and records in the ground truth (truth.ts) what that disrupted.
//
// Everything runs on virtual timers and queued requests; the scheduler (sim.ts) decides what happens
// next. Faults (faults.ts decides which and when) are the methods below: crash, kill, revive, remove,
// partition, jump, pause, publish.
import type { V1Lease, V1Node } from "@kubernetes/client-node";
import type { Logger } from "../../src/log.ts";
import { machineOf, VirtualClock } from "./clock.ts";
import type { AgentEnv, Driver, Host, SecretSeen } from "./driver.ts";
import { Machine, restartsOf, stateStoreOf, systemdOf } from "./machine.ts";
import { MemoryApi } from "./memory-api.ts";
import { kubeFor } from "./memory-http.ts";
import { type KObject, MemoryStore } from "./memory-store.ts";
import { Breakages, type Content, layer, type Overlay, type Revision, revisionChecksum, units, unitKey } from "./osc-model.ts";
import { Trace, Truth } from "./truth.ts";

/** Gardener's kubelet labels each Node with the OSC Secret it follows: the pool a budget counts. */
export const poolLabel = "worker.gardener.cloud/gardener-node-agent-secret-name";
export const hostLabel = "kubernetes.io/hostname";
export const pausedLabel = "rollout.trellis.dev/paused";
export const rolloutKey = (k: string) => `rollout.trellis.dev/${k}`;

export type WorldConfig = {
  nodes: number;
  /** rollout.trellis.dev/max-disrupted at the start: "1", "2", "50%". */
  budget: string;
  rollback: boolean;
  settleSeconds: number;
  healthTimeoutSeconds: number;
  /** Every node gets an overlay of its own (so an effective checksum of its own). */
  overlays: boolean;
  /** kube-controller-manager's node-monitor-grace-period. */
  nlcGraceMs: number;
  kubeletEveryMs: number;
  /** How long an agent may take from its admission to its restart (the budget then may have changed). */
  kGraceMs: number;
  traceLines: number;
  maxNodes: number;
};

export const defaultWorld: WorldConfig = {
  nodes: 4,
  budget: "1",
  rollback: true,
  settleSeconds: 20,
  healthTimeoutSeconds: 90,
  overlays: false,
  nlcGraceMs: 40_000,
  kubeletEveryMs: 10_000,
  kGraceMs: 10_000,
  traceLines: 40,
  maxNodes: 8,
};

const silent: Logger = {
  debug: () => undefined,
  info: () => undefined,
  warn: () => undefined,
  error: () => undefined,
  with: () => silent,
  setLevel: () => undefined,
};

const metaTime = (ms: number) => new Date(ms).toISOString().replace(/\.\d+Z$/, "Z");

export type Rng = { next(): number; chance(p: number): boolean; pick<T>(xs: readonly T[]): T; int(n: number): number };

export class World {
  readonly clock = new VirtualClock(Date.UTC(2026, 10, 26, 9, 0, 0));
  readonly store = new MemoryStore({ now: () => this.clock.wall() });
  readonly api: MemoryApi;
  readonly trace = new Trace(() => this.clock.mono);
  readonly truth: Truth;
  readonly machines = new Map<string, Machine>();
  readonly revisions: Revision[] = [];
  readonly breakages = new Breakages();
  /** Machines whose Node was deleted while they held a slot (as the driver reads the API's objects). */
  readonly lostHolders = new Set<string>();
  readonly secret = { name: "osc-pool-a", namespace: "kube-system", uid: "" };
  step = 0;
  private names = 0;
  private versions = 0;

  constructor(
    readonly driver: Driver,
    readonly config: WorldConfig,
    /** The scheduler's and the faults' chance. */
    readonly rng: Rng,
    /** The chance the code under test draws (Math.random, jitter): its own stream, so faults do not shift it. */
    readonly codeRandom: () => number,
  ) {
    this.api = new MemoryApi(this.store, this.clock, { requestTimeoutMs: 30_000, random: codeRandom });
    this.truth = new Truth({
      now: () => this.clock.mono,
      step: () => this.step,
      trace: this.trace,
      kGraceMs: config.kGraceMs,
      traceLines: config.traceLines,
      about: (m) => this.about(m),
      settled: (name) => {
        const m = this.machines.get(name);
        if (m?.alive && this.breakages.good(m.running)) m.ranGood = true;
      },
    });
    this.store.subscribe((c) => {
      if (c.resource === "nodes") return this.nodeChanged(c.object, c.old);
      if (c.resource !== "leases") return;
      const holder = (o: KObject | undefined) => (o && this.driver.describeLease?.(o as V1Lease)) ?? (((o?.spec as { holderIdentity?: string } | undefined)?.holderIdentity ?? "") || "-");
      const was = c.type === "ADDED" ? "(new)" : holder(c.old ?? c.object);
      const now = c.type === "DELETED" ? "(deleted)" : holder(c.object);
      if (was !== now) this.trace.add(`lease ${c.object.metadata?.name}: ${was} → ${now}`);
    });
  }

  boot(): void {
    this.secret.uid = this.store.create("secrets", this.secret.namespace, { metadata: { name: this.secret.name } }).metadata?.uid as string;
    const osc: Content = { units: Object.fromEntries(units.map((u) => [u, "v0"])), files: { "/etc/app.conf": "f0" } };
    const overlays: Overlay[] = this.config.overlays
      ? Array.from({ length: this.config.maxNodes + 8 }, (_, i) => ({ key: `overlay-node-${i + 1}`, label: hostLabel, value: `node-${i + 1}`, files: { "/etc/node.conf": `node-${i + 1}` } }))
      : [];
    this.publish({
      osc,
      overlays,
      annotations: {
        [rolloutKey("max-disrupted")]: this.config.budget,
        [rolloutKey("settle-time")]: `${this.config.settleSeconds}s`,
        [rolloutKey("health-timeout")]: `${this.config.healthTimeoutSeconds}s`,
        ...(this.config.rollback ? { [rolloutKey("rollback")]: "true" } : {}),
      },
      note: "initial",
    });
    for (let i = 0; i < this.config.nodes; i++) this.addMachine();
    this.clock.setTimer("world.nlc", () => this.nodeLifecycle(), 5_000, 5_000);
  }

  pool(): { secretName: string; namespace: string } {
    return { secretName: this.secret.name, namespace: this.secret.namespace };
  }

  revision(): Revision {
    return this.revisions.at(-1) as Revision;
  }

  /** A new revision of the Secret; every agent receives it (once its machine reaches the API). */
  publish(r: Omit<Revision, "id">): Revision {
    const rev: Revision = { ...r, id: this.revisions.length };
    this.revisions.push(rev);
    const current = this.store.get("secrets", this.secret.namespace, this.secret.name);
    this.store.replace("secrets", this.secret.namespace, this.secret.name, { ...current, metadata: { ...current.metadata, annotations: rev.annotations }, data: { revision: String(rev.id) } });
    this.trace.add(`SECRET r${rev.id}: ${rev.note} (base ${layer(rev, {}).base.slice(0, 8)}, units ${Object.entries(rev.osc.units).map(([u, v]) => `${u.replace(".service", "")}=${v}${this.breakages.of(u, v) ? `!${this.breakages.of(u, v)}` : ""}`).join(" ")})`);
    for (const m of this.machines.values()) if (m.owner) this.api.notify(m.owner, "the OSC Secret changed", () => this.deliverSecret(m));
    this.recordK();
    return rev;
  }

  /** A fresh version id; `broken` marks it so. */
  version(unit: string, broken?: "unit" | "network"): string {
    const v = `v${++this.versions}`;
    if (broken) this.breakages.mark(unit, v, broken);
    return v;
  }

  // --- machines -----------------------------------------------------------------------------------

  addMachine(): Machine {
    const m = new Machine(`node-${++this.names}`);
    m.bootedAt = this.clock.mono;
    this.machines.set(m.name, m);
    const at = metaTime(this.clock.wall(m.name));
    this.store.create("nodes", "", {
      metadata: { name: m.name, labels: { [poolLabel]: this.secret.name, [hostLabel]: m.name } },
      status: { conditions: [{ type: "Ready", status: "True", reason: "KubeletReady", message: "kubelet is posting ready status", lastHeartbeatTime: at, lastTransitionTime: at }] },
    });
    m.heartbeatSeenAt = this.clock.mono;
    this.clock.setTimer(`${m.name}.kubelet`, () => this.heartbeat(m), this.config.kubeletEveryMs, this.config.kubeletEveryMs);
    this.trace.add(`${m.name} joins the pool`);
    this.startAgent(m);
    this.recordK();
    return m;
  }

  /** Boots a new agent process on `m` (as its own owner, so its first steps read its machine's clock). */
  startAgent(m: Machine): void {
    m.incarnation++;
    const owner = `${m.name}.i${m.incarnation}`;
    m.owner = owner;
    m.seen = undefined;
    m.listeners = [];
    m.nodeListeners = [];
    m.nodeSeen = undefined;
    const env = this.envFor(m, owner);
    this.clock.setTimer(owner, () => this.driver.start(env), 0);
    this.api.notify(owner, "the OSC Secret listed", () => this.deliverSecret(m));
  }

  /** The agent process dies (its state files stay); it starts again after `restartAfterMs`, if given. */
  crash(m: Machine, restartAfterMs?: number): void {
    if (!m.owner) return;
    this.api.dropOwner(m.owner);
    this.clock.dropOwner(m.owner);
    this.trace.add(`FAULT ${m.name}: agent ${m.owner} dies${restartAfterMs !== undefined ? `, restarts in ${(restartAfterMs / 1000).toFixed(0)}s` : ""}`);
    m.owner = undefined;
    if (restartAfterMs !== undefined) this.clock.setTimer(`world.restart.${m.name}`, () => m.alive && !m.owner && this.machines.has(m.name) && this.startAgent(m), restartAfterMs);
  }

  /** The machine dies (power, panic, preemption): agent and kubelet gone; its Node stays until the lifecycle controller notices. */
  kill(m: Machine): void {
    if (!m.alive) return;
    this.crash(m);
    m.alive = false;
    this.syncReach(m);
    this.truth.health(m.name, false);
    this.trace.add(`FAULT ${m.name}: machine dies${this.truth.disrupted(m.name) ? " (disrupted)" : ""}`);
  }

  /** The dead machine boots again with its disk: every unit starts, then kubelet and the agent. */
  revive(m: Machine): void {
    if (m.alive || !this.machines.has(m.name)) return;
    m.alive = true;
    m.boots++;
    m.bootedAt = this.clock.mono;
    for (const u of Object.keys(m.running?.units ?? {})) m.unitSince.set(u, { wall: this.clock.wall(m.name), sinceBoot: 0 });
    this.armNetworkBreakage(m);
    this.syncReach(m);
    this.truth.health(m.name, this.healthy(m));
    this.trace.add(`FAULT ${m.name}: machine boots again`);
    this.clock.setTimer(`${m.name}.kubelet`, () => this.heartbeat(m), 1_000);
    this.startAgent(m);
  }

  /** The machine leaves the pool: its Node is deleted (with what the Node owns). */
  remove(m: Machine): void {
    // Its Node deleted while it held a slot: the change it held it for never passed its gate there.
    if (this.driver.holders(this.store, this.pool()).includes(m.name)) this.lostHolders.add(m.name);
    this.kill(m);
    this.machines.delete(m.name);
    this.clock.dropOwner(`${m.name}.kubelet`);
    this.clock.dropOwner(`${m.name}.net`);
    if (this.store.peek("nodes", "", m.name)) this.store.delete("nodes", "", m.name);
    this.truth.forget(m.name);
    this.trace.add(`FAULT ${m.name}: removed from the pool (Node deleted)`);
    this.recordK();
  }

  /** machine-controller-manager replaces a dead machine: its Node goes, a fresh machine joins. */
  replace(m: Machine): Machine {
    this.remove(m);
    return this.addMachine();
  }

  /** Cuts `m` off the API server for `ms`. */
  partition(m: Machine, ms: number): void {
    m.cutOff = true;
    this.syncReach(m);
    this.trace.add(`FAULT ${m.name}: cut off the API server for ${(ms / 1000).toFixed(0)}s`);
    this.clock.setTimer(`world.heal.${m.name}`, () => this.heal(m), ms);
  }
  heal(m: Machine): void {
    if (!m.cutOff) return;
    m.cutOff = false;
    this.syncReach(m);
    this.trace.add(`${m.name}: reaches the API server again`);
  }

  jump(m: Machine, deltaMs: number): void {
    this.clock.jump(m.name, deltaMs);
    this.trace.add(`FAULT ${m.name}: wall clock steps ${deltaMs > 0 ? "+" : ""}${(deltaMs / 1000).toFixed(0)}s (skew now ${(this.clock.skew(m.name) / 1000).toFixed(0)}s)`);
  }

  pause(m: Machine, paused: boolean): void {
    if (!this.store.peek("nodes", "", m.name)) return;
    this.store.patch("nodes", "", m.name, (n) => ({ ...n, metadata: { ...n.metadata, labels: { ...n.metadata?.labels, [pausedLabel]: String(paused) } } }));
    this.trace.add(`FAULT ${m.name}: ${paused ? "paused" : "unpaused"}`);
  }

  paused(m: Machine): boolean {
    return this.store.peek("nodes", "", m.name)?.metadata?.labels?.[pausedLabel] === "true";
  }

  healthy(m: Machine): boolean {
    return m.alive && m.running !== undefined && this.breakages.good(m.running);
  }

  labelsOf(m: Machine): Record<string, string> {
    return this.store.peek("nodes", "", m.name)?.metadata?.labels ?? {};
  }

  /** Dead machines whose Node is still there and that hold a slot, as the driver reads the API's objects. */
  deadHolders(): string[] {
    let anyDead = false;
    for (const m of this.machines.values()) if (!m.alive) anyDead = true;
    if (!anyDead) return [];
    return this.driver.holders(this.store, this.pool()).filter((h) => this.machines.get(h)?.alive === false);
  }

  // --- what agents do to their machines ------------------------------------------------------------

  private host(m: Machine, owner: string): Host {
    return {
      running: () => m.running,
      lastApplied: () => m.lastApplied,
      restarts: (desired) => restartsOf(m.running, desired),
      apply: (desired, checksum) =>
        new Promise<void>((done) => {
          this.applyOn(m, desired, checksum);
          // Unit jobs take their time; the agent learns the result afterwards (or never, if it dies first).
          this.clock.setTimer(owner, done, 500 + Math.floor(this.rng.next() * 3_000));
        }),
      systemd: systemdOf(m, this.breakages),
      stateStore: stateStoreOf(m, () => this.clock.wall(m.name)),
    };
  }

  private applyOn(m: Machine, desired: Content, checksum: string): void {
    if (!m.alive) return;
    const before = m.running;
    const restarted = restartsOf(before, desired);
    const started = Object.keys(desired.units).filter((u) => before?.units[u] !== desired.units[u]);
    m.running = desired;
    if (before === undefined) m.ranGood ||= this.breakages.good(desired);
    m.lastApplied = checksum;
    m.contentChangedAt = this.clock.mono;
    for (const u of started) m.unitSince.set(u, { wall: this.clock.wall(m.name), sinceBoot: this.clock.mono - m.bootedAt });
    this.trace.add(`${m.name}: applies ${checksum.slice(0, 8)}${restarted.length ? `, restarting ${restarted.join(", ")}` : ""}`);
    if (started.includes("kubelet.service")) this.clock.setTimer(`${m.name}.kubelet`, () => this.heartbeat(m), 1_000 + this.rng.int(2_000));
    if (restarted.length > 0) this.truth.restarted(m.name, restarted, { settleMs: this.config.settleSeconds * 1000, cause: checksum, deadHolders: this.deadHolders() });
    for (const u of restarted) {
      const v = desired.units[u];
      if (v !== undefined && this.breakages.of(u, v)) this.truth.brokenRestart(m.name, unitKey(u, v));
    }
    if (!this.armNetworkBreakage(m) && m.netBroken) {
      m.netBroken = false;
      this.syncReach(m);
    }
    this.truth.health(m.name, this.healthy(m));
  }

  /**
   * A bad network setting bites once its unit has come up (CNI reconfigured, routes replaced), after each
   * apply and after each boot. Whether what runs has one.
   */
  private armNetworkBreakage(m: Machine): boolean {
    const running = m.running;
    if (!this.breakages.in(running).some((b) => b.how === "network")) return false;
    if (m.netBroken) return true;
    const boot = m.boots;
    this.clock.setTimer(`${m.name}.net`, () => {
      if (m.running === running && m.alive && m.boots === boot) {
        m.netBroken = true;
        this.syncReach(m);
        this.trace.add(`${m.name}: loses its network (bad change)`);
      }
    }, 5_000 + this.rng.int(10_000));
    return true;
  }

  // --- the cluster ---------------------------------------------------------------------------------

  /** kubelet posts Ready with its machine's wall clock, while it can reach the API server. */
  private heartbeat(m: Machine): void {
    if (!m.alive || !m.reachable() || !this.store.peek("nodes", "", m.name)) return;
    const at = metaTime(this.clock.wall(m.name));
    this.store.patch("nodes", "", m.name, (n) => {
      const status = (n.status ?? {}) as { conditions?: { type: string; status: string; lastTransitionTime?: string }[] };
      const ready = status.conditions?.find((c) => c.type === "Ready");
      const others = status.conditions?.filter((c) => c.type !== "Ready") ?? [];
      const since = ready?.status === "True" ? ready.lastTransitionTime : at;
      return { ...n, status: { ...status, conditions: [...others, { type: "Ready", status: "True", reason: "KubeletReady", message: "kubelet is posting ready status", lastHeartbeatTime: at, lastTransitionTime: since }] } };
    }, undefined, "status");
    m.heartbeatSeenAt = this.clock.mono;
  }

  /** kube-controller-manager: a Node whose kubelet stayed silent past the grace period goes Unknown. */
  private nodeLifecycle(): void {
    for (const m of this.machines.values()) {
      const node = this.store.peek("nodes", "", m.name);
      const ready = (node?.status as { conditions?: { type: string; status: string }[] } | undefined)?.conditions?.find((c) => c.type === "Ready");
      if (!node || ready?.status !== "True" || this.clock.mono - m.heartbeatSeenAt <= this.config.nlcGraceMs) continue;
      const at = metaTime(this.clock.wall());
      this.store.patch("nodes", "", m.name, (n) => {
        const status = (n.status ?? {}) as { conditions?: { type: string }[] };
        const others = status.conditions?.filter((c) => c.type !== "Ready") ?? [];
        return { ...n, status: { ...status, conditions: [...others, { type: "Ready", status: "Unknown", reason: "NodeStatusUnknown", message: "Kubelet stopped posting node status.", lastHeartbeatTime: metaTime(this.clock.wall() - (this.clock.mono - m.heartbeatSeenAt)), lastTransitionTime: at }] } };
      }, undefined, "status");
      this.trace.add(`${m.name}: Node Ready=Unknown (node-lifecycle controller)`);
    }
  }

  private syncReach(m: Machine): void {
    if (m.reachable()) this.api.heal(m.name);
    else this.api.partition(m.name);
  }

  /** k as the Secret and the pool's Node count give it now (Infinity: no budget). */
  recordK(): void {
    const text = this.revision()?.annotations[rolloutKey("max-disrupted")];
    const pool = this.store.list("nodes", undefined, `${poolLabel}=${this.secret.name}`).items.length;
    const pct = text ? /^(\d+)%$/.exec(text) : null;
    const k = text === undefined ? Number.POSITIVE_INFINITY : pct ? Math.max(1, Math.floor((Number(pct[1]) * pool) / 100)) : Number(text);
    this.truth.recordK(k);
  }

  /** A Node's labels or annotations changed: its agent's watch delivers it. */
  private nodeChanged(node: KObject, old: KObject | undefined): void {
    const m = this.machines.get(node.metadata?.name ?? "");
    if (!m?.owner || m.nodeListeners.length === 0) return;
    const meta = (o: KObject | undefined) => JSON.stringify([o?.metadata?.labels, o?.metadata?.annotations]);
    if (meta(node) === meta(old)) return;
    this.api.notify(m.owner, "its Node changed", () => {
      const current = this.store.peek("nodes", "", m.name) as V1Node | undefined;
      if (!current) return;
      m.nodeSeen = current;
      for (const l of m.nodeListeners) l(current);
    });
  }

  private deliverSecret(m: Machine): void {
    m.seen = this.revision();
    for (const l of m.listeners) l();
  }

  private about(name: string): string {
    const m = this.machines.get(name);
    if (!m) return "gone";
    const parts = [!m.alive ? "dead" : m.netBroken ? "network broken" : m.cutOff ? "cut off" : "", this.clock.skew(name) ? `clock ${this.clock.skew(name) > 0 ? "+" : ""}${(this.clock.skew(name) / 1000).toFixed(0)}s` : ""];
    return parts.filter((p) => p !== "").join(", ");
  }

  private envFor(m: Machine, owner: string): AgentEnv {
    const secret = this.secret;
    return {
      node: m.name,
      owner,
      secretName: secret.name,
      kube: kubeFor(owner, this.api),
      leases: (namespace) => this.api.leaseApi(owner, namespace),
      files: m.files,
      host: this.host(m, owner),
      boot: { id: `${m.name}/boot-${m.boots}`, atMs: m.bootedAt },
      nodes: {
        current: () => {
          if (m.reachable()) m.nodeSeen = this.store.peek("nodes", "", m.name) as V1Node | undefined;
          return m.nodeSeen;
        },
        subscribe: (listener) => {
          m.nodeListeners.push(listener);
          return () => void (m.nodeListeners = m.nodeListeners.filter((l) => l !== listener));
        },
      },
      secret: {
        current: (): SecretSeen | undefined => {
          const rev = m.seen;
          return rev && { name: secret.name, namespace: secret.namespace, uid: secret.uid, revision: rev.id, revisionChecksum: revisionChecksum(rev), annotations: rev.annotations, layered: (labels) => layer(rev, labels) };
        },
        subscribe: (listener) => void m.listeners.push(listener),
      },
      wall: () => this.clock.wall(m.name),
      mono: () => this.clock.mono,
      setTimer: (fn, ms) => this.clock.setTimer(owner, fn, ms),
      clearTimer: (id) => this.clock.clearTimer(id),
      random: this.codeRandom,
      log: silent,
      note: (text) => this.trace.add(`${m.name}: ${text}`),
    };
  }

  /** Stops the faults' after-effects: partitions heal, clocks are synced, dead machines are replaced. */
  quiesce(): void {
    this.trace.add("QUIET: faults stop; partitions heal, clocks sync, dead machines are replaced");
    for (const m of [...this.machines.values()]) {
      this.clock.jump(m.name, -this.clock.skew(m.name));
      this.heal(m);
      if (!m.alive) this.replace(m);
      else if (!m.owner) this.startAgent(m);
    }
  }

  ownerMachine(owner: string): Machine | undefined {
    return this.machines.get(machineOf(owner));
  }
}
