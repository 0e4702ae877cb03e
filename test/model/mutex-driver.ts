// A deliberately simple agent for the harness's own tests, and an example of a driver on the LeaseApi
// port: one Lease is a pool-wide mutex (so k = 1), taken before a change that restarts units, renewed
// while held, given back once the machine stayed healthy for the settle time. It keeps nothing on disk,
// trusts wall clocks and has no rollback: it is correct only without faults (the "calm" profile),
// which is what the tests use it for — a run that must find nothing.
import type { V1Lease } from "@kubernetes/client-node";
import { KubeError } from "../../src/kube/errors.ts";
import type { AgentEnv, Driver } from "./driver.ts";
import type { Content } from "./osc-model.ts";

const leaseSeconds = 40;
const renewMs = 10_000;
const mutexName = (secretName: string) => `${secretName}-mutex`;

export function mutexDriver(): Driver {
  return {
    name: "mutex (harness self-test)",
    globals: false,
    start: (env) => startMutexAgent(env),
    holders: (store, pool) => {
      const holder = (store.peek("leases", pool.namespace, mutexName(pool.secretName))?.spec as { holderIdentity?: string } | undefined)?.holderIdentity;
      return holder ? [holder] : [];
    },
  };
}

function startMutexAgent(env: AgentEnv): void {
  const leases = env.leases("kube-system");
  const name = mutexName(env.secretName);
  let timer: number | undefined;
  let renewal: number | undefined;
  let running = false;
  let again = false;
  type Gate = { checksum: string; healthySince: number | undefined };
  let gate: Gate | undefined;

  const later = (ms: number) => {
    env.clearTimer(timer);
    timer = env.setTimer(() => void pass(), ms);
  };
  async function pass(): Promise<void> {
    if (running) {
      again = true;
      return;
    }
    running = true;
    try {
      later(await reconcile().catch(() => 2_000));
    } finally {
      running = false;
      if (again) {
        again = false;
        void pass();
      }
    }
  }
  env.secret.subscribe(() => void pass());
  void pass();

  /** One look; returns when to look again (ms). */
  async function reconcile(): Promise<number> {
    const secret = env.secret.current();
    if (!secret) return 5_000;
    const { checksum, content } = secret.layered(env.nodes.current()?.metadata?.labels ?? {});
    if (gate) return settle(gate, secret.annotations);
    if (env.host.lastApplied() === checksum) return 60_000;
    if (env.host.restarts(content).length === 0) {
      await env.host.apply(content, checksum);
      return 60_000;
    }
    if (!(await take())) return 3_000 + env.random() * 4_000;
    gate = { checksum, healthySince: undefined };
    await env.host.apply(content, checksum);
    return 1_000;
  }

  async function settle(g: Gate, annotations: Readonly<Record<string, string>>): Promise<number> {
    const settleMs = Number(/^(\d+)s$/.exec(annotations["rollout.trellis.dev/settle-time"] ?? "")?.[1] ?? 60) * 1000;
    if (!(await allActive(env.host.running()))) g.healthySince = undefined;
    else g.healthySince ??= env.mono();
    if (g.healthySince === undefined || env.mono() - g.healthySince < settleMs) return 1_000;
    await give();
    gate = undefined;
    return 0;
  }

  async function allActive(running: Content | undefined): Promise<boolean> {
    for (const unit of Object.keys(running?.units ?? {})) if ((await env.host.systemd.unitStatus(unit)).activeState !== "active") return false;
    return true;
  }

  const claim = (l: V1Lease | undefined): V1Lease => {
    const at = new Date(env.wall()).toISOString();
    return {
      apiVersion: "coordination.k8s.io/v1",
      kind: "Lease",
      metadata: { ...l?.metadata, name, namespace: "kube-system" },
      spec: { holderIdentity: env.node, leaseDurationSeconds: leaseSeconds, renewTime: at as unknown as Date, acquireTime: at as unknown as Date },
    };
  };
  const expired = (l: V1Lease) => Date.parse(String(l.spec?.renewTime ?? 0)) + (l.spec?.leaseDurationSeconds ?? 0) * 1000 < env.wall();

  async function take(): Promise<boolean> {
    const l = await leases.get(name);
    const holder = l?.spec?.holderIdentity ?? "";
    if (l && holder !== "" && holder !== env.node && !expired(l)) return false;
    try {
      if (l) await leases.replace(claim(l));
      else await leases.create(claim(undefined));
    } catch (err) {
      if (err instanceof KubeError && (err.reason === "conflict" || err.reason === "not-found")) return false;
      throw err;
    }
    env.clearTimer(renewal);
    renewal = env.setTimer(() => void renew(), renewMs);
    return true;
  }

  async function renew(): Promise<void> {
    renewal = env.setTimer(() => void renew(), renewMs);
    const l = await leases.get(name).catch(() => undefined);
    if (l?.spec?.holderIdentity !== env.node) return;
    await leases.replace({ ...l, spec: { ...l.spec, renewTime: new Date(env.wall()).toISOString() as unknown as Date } }).catch(() => undefined);
  }

  async function give(): Promise<void> {
    env.clearTimer(renewal);
    for (;;) {
      const l = await leases.get(name);
      if (l?.spec?.holderIdentity !== env.node) return;
      try {
        await leases.replace({ ...l, spec: { ...l.spec, holderIdentity: "" } });
        return;
      } catch (err) {
        if (!(err instanceof KubeError && err.reason === "conflict")) throw err;
      }
    }
  }
}
