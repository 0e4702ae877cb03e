// Integration test (src/ in-process against a real kube-apiserver and kube-controller-manager): the pool
// protocol of src/kube/pool-leases.ts and src/kube/pool-leader.ts as several agents run it. Every version of
// the record is read from a watch: never more than k holders; waiting nodes admitted oldest first as
// holders give their slots back; the leader's Lease taken over when its holder dies (judged on the
// waiter's own clock); a holder that stops answering keeps its slot however long, until the garbage
// collector deletes its ticket with its Node, which stops its revision as failed; a revision that failed is admitted nowhere and its waiters
// are told; the leader moves a holder on to new work only while the holders of every shard are within k; a waiting node
// costs the API server nothing while it waits (no list, no poll).
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { CoreV1Api, type V1Lease, Watch } from "@kubernetes/client-node";
import { type Kube, kubeFromConnection } from "../../src/kube/client.ts";
import { type LeaseApi, leaseApi } from "../../src/kube/lease-api.ts";
import { type PoolLeader, startPoolLeader } from "../../src/kube/pool-leader.ts";
import { type PoolMember, poolMember, readTicket } from "../../src/kube/pool-leases.ts";
import { createLogger } from "../../src/log.ts";
import { admitted, decodePool, shardLeaseName, slotsLeaseName, type Ticket, ticketLabel } from "../../src/rollout/pool.ts";
import type { Budget } from "../../src/api/rollout.ts";
import { monotonicMs } from "../../src/time.ts";
import { registerNode } from "../harness/agent.ts";
import { type Cluster, startCluster } from "../harness/cluster.ts";
import { waitFor } from "../harness/exec.ts";

const namespace = "kube-system";
const log = createLogger({ level: (process.env.TEST_LOG as "info" | undefined) ?? "error" });

let cluster: Cluster;
let core: CoreV1Api;
let kube: Kube;

beforeAll(async () => {
  cluster = await startCluster();
  core = cluster.admin().makeApiClient(CoreV1Api);
  kube = kubeFromConnection({ kind: "kubeconfig", path: cluster.adminKubeconfig });
}, 180_000);

afterAll(async () => {
  await cluster?.stop();
});

type Agent = { name: string; member: PoolMember; leader: PoolLeader; ticket(): Promise<Ticket | undefined>; stop(): Promise<void> };

let seq = 0;
async function pool(budget: Budget | (() => Budget), nodes: number, leaseDurationMs = 3_000, capacity?: number, leaderApi: (api: LeaseApi) => LeaseApi = (api) => api) {
  const name = `pool-${++seq}`;
  const secret = await core.createNamespacedSecret({ namespace, body: { metadata: { name }, data: {} } });
  const uid = secret.metadata?.uid as string;
  const api = leaseApi(kube, namespace, log);
  // Every version of the record, from a watch of the test's own.
  const versions: { holders: string[]; failed?: string }[] = [];
  const watch = await new Watch(cluster.admin()).watch(`/apis/coordination.k8s.io/v1/namespaces/${namespace}/leases`, { fieldSelector: `metadata.name=${slotsLeaseName(name)}` }, (_t: string, l: V1Lease) => {
    const r = decodePool(l.metadata?.annotations, "record");
    if (r.ok) versions.push({ holders: r.value.holders.map((h) => h.node).sort(), ...(r.value.failed ? { failed: r.value.failed.revision } : {}) });
  }, () => {});
  const agents: Agent[] = [];
  for (let i = 0; i < nodes; i++) {
    const node = `${name}-n${i}`;
    await registerNode(core, node);
    const nodeUid = (await core.readNode({ name: node })).metadata?.uid as string;
    const ref = { secret: { name, uid }, node: { name: node, uid: nodeUid } };
    const member = poolMember(api, ref, capacity);
    const leader = startPoolLeader({ api: leaderApi(api), ref, log, budget: typeof budget === "function" ? budget : () => budget, ...(capacity ? { shardCapacity: capacity } : {}), clock: monotonicMs, wallNow: () => new Date(), leaseDurationMs, renewEveryMs: leaseDurationMs / 3 });
    const ticket = async () => {
      const l = await api.get(member.ticketName);
      return l ? readTicket(l, member.ticketName) : undefined;
    };
    agents.push({ name: node, member, leader, ticket, stop: () => leader.stop() });
  }
  const maxHolders = () => Math.max(0, ...versions.map((v) => v.holders.length));
  return { name, uid, agents, versions, maxHolders, stop: async () => { watch.abort(); for (const a of agents) await a.stop(); } };
}

const ask = async (a: Agent, revision: string, since: string) => {
  await a.member.ensureTicket();
  await a.member.request({ revision, reason: "osc", since });
  a.leader.campaign(true);
};
const granted = async (a: Agent) => admitted(await a.ticket());

describe("the pool protocol on real Leases", () => {
  test("k = 2 of 5: never more than 2 holders; all admitted oldest first as slots come back", async () => {
    const p = await pool({ text: "2", count: 2 }, 5);
    for (const [i, a] of p.agents.entries()) await ask(a, "r1", `2026-01-01T00:00:0${i}Z`);
    const order: string[] = [];
    while (order.length < 5) {
      const now = await waitFor("two holders", async () => {
        const g: Agent[] = [];
        for (const a of p.agents) if (!order.includes(a.name) && (await granted(a))) g.push(a);
        return g.length > 0 ? g : undefined;
      }, 30_000, 100);
      for (const a of now) {
        order.push(a.name);
        a.leader.campaign(false);
        await a.member.release();
      }
    }
    expect(order).toEqual(p.agents.map((a) => a.name));
    expect(p.maxHolders()).toBe(2);
    // Slots go back on the tickets; the leader drops them from the record, and with nobody waiting (no
    // leader) the last ones leave it themselves: a finished rollout's record is empty.
    await waitFor("the record empty once every slot went back", async () => (p.versions.at(-1)?.holders.length === 0 ? true : undefined), 30_000, 100);
    await p.stop();
  }, 120_000);

  test("a holder that stops answering keeps its slot until its Node is deleted; then its change is stopped as failed, and another revision goes on", async () => {
    const p = await pool({ text: "1", count: 1 }, 3);
    const [dead, b, c] = p.agents as [Agent, Agent, Agent];
    await ask(dead, "r1", "2026-01-01T00:00:00Z");
    await waitFor("dead admitted", async () => ((await granted(dead)) ? true : undefined), 30_000, 100);
    await dead.stop(); // its agent is gone: no renewals, no release, its leadership lapses
    await ask(b, "r1", "2026-01-01T00:00:01Z");
    await ask(c, "r2", "2026-01-01T00:00:02Z");
    // Well past the leader's lease duration: a new leader runs, and still admits nobody.
    await waitFor("a new leader", async () => (b.leader.leading() || c.leader.leading() ? true : undefined), 30_000, 100);
    const quiet = Date.now();
    while (Date.now() - quiet < 8_000) {
      expect(await granted(b)).toBe(false);
      expect(await granted(c)).toBe(false);
      await Bun.sleep(500);
    }
    await core.deleteNode({ name: dead.name });
    // Its change never passed its gate (a change that kills machines looks like this): r1 goes nowhere else.
    const tb = await waitFor("b told that r1 stopped", async () => ((await b.ticket())?.grant?.stopped ? b.ticket() : undefined), 60_000, 200);
    expect(tb?.grant?.stopped).toContain("its ticket went while it held a slot");
    expect(await b.member.failure()).toMatchObject({ revision: "r1", node: dead.name });
    await waitFor("c admitted for another revision", async () => ((await granted(c)) ? true : undefined), 30_000, 200);
    expect(await granted(b)).toBe(false);
    expect(p.maxHolders()).toBe(1);
    await p.stop();
  }, 120_000);

  test("a failed revision is admitted nowhere and its waiters are told; another revision goes on", async () => {
    const p = await pool({ text: "1", count: 1 }, 3);
    const [a, b, c] = p.agents as [Agent, Agent, Agent];
    await ask(a, "bad", "2026-01-01T00:00:00Z");
    await waitFor("a admitted", async () => ((await granted(a)) ? true : undefined), 30_000, 100);
    await ask(b, "bad", "2026-01-01T00:00:01Z");
    await ask(c, "good", "2026-01-01T00:00:02Z");
    await a.member.recordFailure({ revision: "bad", node: a.name, failure: "Node Ready: False", at: new Date().toISOString() });
    a.leader.campaign(false);
    await a.member.release(); // rolled back and healthy again: the slot goes back, the record stays
    await waitFor("c admitted", async () => ((await granted(c)) ? true : undefined), 30_000, 100);
    const tb = await waitFor("b told", async () => ((await b.ticket())?.grant?.stopped ? b.ticket() : undefined), 30_000, 100);
    expect(tb?.grant?.stopped).toContain("Node Ready: False");
    expect(admitted(tb)).toBe(false);
    expect(await b.member.failure()).toMatchObject({ revision: "bad", node: a.name });
    await p.stop();
  }, 120_000);

  test("k lowered under holders in two shards: the leader moves no holder on to new work until they are within k again", async () => {
    let budget: Budget = { text: "3", count: 3 };
    const p = await pool(() => budget, 3, 3_000, 2);
    // Every version of both shards, in etcd's order (resourceVersions are global).
    const history: { rv: number; shard: number; holders: string[] }[] = [];
    const watches = await Promise.all(
      [0, 1].map((shard) =>
        new Watch(cluster.admin()).watch(`/apis/coordination.k8s.io/v1/namespaces/${namespace}/leases`, { fieldSelector: `metadata.name=${shardLeaseName(p.name, shard)}` }, (_t: string, l: V1Lease) => {
          const r = decodePool(l.metadata?.annotations, "record");
          if (r.ok) history.push({ rv: Number(l.metadata?.resourceVersion), shard, holders: r.value.holders.map((h) => `${h.node}@${h.revision}`) });
        }, () => {}),
      ),
    );
    for (const [i, a] of p.agents.entries()) await ask(a, "r1", `2026-01-01T00:00:0${i}Z`);
    for (const a of p.agents) await waitFor(`${a.name} admitted`, async () => ((await granted(a)) ? true : undefined), 30_000, 100);
    const [a, b, c] = p.agents as [Agent, Agent, Agent];
    expect((await c.ticket())?.grant?.shard).toBe(1);
    budget = { text: "2", count: 2 };
    // New work on every holder, asked for on its ticket. Shard 0 holds two, its full share of k = 2: only the
    // holder in shard 1 shows that three hold slots.
    for (const x of [a, b, c]) await x.member.request({ revision: "r2", reason: "osc", since: new Date().toISOString() });
    c.leader.campaign(false);
    await c.member.release();
    for (const x of [a, b]) await waitFor(`${x.name} moved on`, async () => ((await x.ticket())?.grant?.revision === "r2" ? true : undefined), 30_000, 100);
    for (const w of watches) w.abort();
    // Replayed in order: no holder of shard 0 moved on while c still held its slot in shard 1.
    const latest = new Map<number, string[]>();
    for (const v of history.sort((x, y) => x.rv - y.rv)) {
      latest.set(v.shard, v.holders);
      const all = [...latest.values()].flat();
      if (all.some((h) => h.startsWith(`${c.name}@`))) expect(all.filter((h) => h.endsWith("@r2"))).toEqual([]);
    }
    expect(latest.get(0)?.sort()).toEqual([`${a.name}@r2`, `${b.name}@r2`]);
    await p.stop();
  }, 120_000);
  test("a holder that gave back is not admitted again on a view of its ticket that is behind the record's (the grant still on it): the waiting node goes next", async () => {
    // The leaders' watch of the holder's ticket is held back while it gives back: the record's watch (a stream
    // of its own) shows the holder leave while its ticket still shows it asking, with its grant.
    let holdTicket: string | undefined;
    const held: (() => void)[] = [];
    const delayTickets = (api: LeaseApi): LeaseApi => ({
      ...api,
      watch: (selector, onEvent) =>
        api.watch(selector, (e) => {
          if (!("labelSelector" in selector && selector.labelSelector.startsWith(ticketLabel)) || e.object.metadata?.name !== holdTicket) return onEvent(e);
          held.push(() => void onEvent(e));
        }),
    });
    const p = await pool({ text: "1", count: 1 }, 2, 3_000, undefined, delayTickets);
    const [a, b] = p.agents as [Agent, Agent];
    await ask(a, "r1", "2026-01-01T00:00:00Z");
    await waitFor(`${a.name} admitted`, async () => ((await granted(a)) ? true : undefined), 30_000, 100);
    await ask(b, "r1", "2026-01-01T00:00:01Z");
    holdTicket = a.member.ticketName;
    const from = p.versions.length;
    await a.member.release();
    await waitFor(`${b.name} admitted`, async () => ((await granted(b)) ? true : undefined), 30_000, 100);
    holdTicket = undefined;
    for (const deliver of held.splice(0)) deliver();
    expect(p.versions.slice(from).map((v) => v.holders.join(","))).not.toContain(a.name);
    expect(p.versions.at(-1)?.holders).toEqual([b.name]);
    await p.stop();
  }, 120_000);
});
