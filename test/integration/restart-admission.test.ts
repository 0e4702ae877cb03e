// Issue 19, "Found already" item 6: requested restarts (worker.gardener.cloud/restart-systemd-services) go
// through the node's rollout admission in every situation the old code let them bypass it. src/ runs in
// this process against a real kube-apiserver and a real systemd node: the real restart controller
// (src/controllers/restart.ts) and the real rollout controller (src/controllers/rollout/controller.ts) of
// node A, whose rollout state lives in a directory of the test's own (kept across an "agent restart": the
// controllers stopped and started again over it), and a second node B of the same pool that asks for and
// holds slots with the real pool protocol (src/kube/pool-leases.ts, src/kube/pool-leader.ts), as its agent
// would. Nothing else runs: no OSC controller (its Secret's osc.yaml is not even valid), so the rollout
// knows only what `observe` told it — what the OSC controller's `resolve` does first, even for an invalid
// OSC (src/controllers/osc/reconcile.ts) — and, where a test says so, the work the test offers in its place.
//
// The unit restarted is a sleeper, disrupt-a.service, which counts as disruptive through the Secret's
// rollout.trellis.dev/disruptive-units "disrupt-*" (kubelet would need a real kubelet). Its restart is seen
// from systemd (ExecMainStartTimestampMonotonic, MainPID); the slot from the pool's record, the Lease
// `<secret>-slots` (decodePool), read at the moment the controller asked systemd for the restart and watched
// over the whole test. Waits are on something the system does (a request on the node's ticket, a Node
// condition, a log line, a timestamp in systemd), never on a sleep.
import { afterAll, afterEach, beforeAll, describe, expect, test } from "bun:test";
import { Buffer } from "node:buffer";
import { CoreV1Api, PatchStrategy, setHeaderOptions } from "@kubernetes/client-node";
import { sha256Hex } from "../../src/api/desired.ts";
import { parseRolloutSettings, pausedLabel, type RolloutSettings, rolloutKeys } from "../../src/api/rollout.ts";
import { startNodeSource } from "../../src/controllers/node-source.ts";
import { restartAnnotation, startRestartController } from "../../src/controllers/restart.ts";
import { type Decision, type Rollout, startRollout } from "../../src/controllers/rollout/controller.ts";
import { rolloutConditionType } from "../../src/controllers/rollout/report.ts";
import type { ComponentStatus, StatusBoard } from "../../src/controllers/types.ts";
import { createStateStore } from "../../src/apply/state-store.ts";
import { createFiles } from "../../src/host/files.ts";
import { createSystemd, type Systemd } from "../../src/host/systemd.ts";
import { type Kube, kubeFromConnection } from "../../src/kube/client.ts";
import { createEventRecorder } from "../../src/kube/events.ts";
import { type LeaseApi, leaseApi } from "../../src/kube/lease-api.ts";
import { type PoolLeader, startPoolLeader } from "../../src/kube/pool-leader.ts";
import { nodeTicketName, type PoolMember, poolMember, readPool, readTicket } from "../../src/kube/pool-leases.ts";
import { createLogger } from "../../src/log.ts";
import type { Work } from "../../src/rollout/machine.ts";
import { admitted, type Holder, slotsLeaseName, workRevision } from "../../src/rollout/pool.ts";
import { monotonicMs } from "../../src/time.ts";
import { registerNode } from "../harness/agent.ts";
import { type Cluster, startCluster } from "../harness/cluster.ts";
import { runDir, waitFor } from "../harness/exec.ts";
import { bootNode, type Node } from "../harness/node.ts";
import { type PoolRecordWatch, watchPoolRecord } from "../harness/pool-record.ts";

const selfUnit = "gardener-node-agent.service";
const unit = "disrupt-a.service";
/** What node A has applied (the "old" OSC): a node in a pool always carries Gardener's checksum once it applied one. */
const appliedChecksum = "0".repeat(64);

type LogLine = { msg: string; level: string; [field: string]: unknown };
const lines: LogLine[] = [];
const log = createLogger({
  level: "debug",
  write: (line, level) => {
    lines.push(JSON.parse(line) as LogLine);
    if (process.env.TEST_LOG && (process.env.TEST_LOG === "debug" || level !== "debug")) process.stderr.write(`${line}\n`);
  },
});
/** The first log line after `mark` (an index into `lines`) that `match` accepts. */
const logged = (what: string, mark: number, match: (l: LogLine) => boolean, timeoutMs = 30_000) => waitFor(what, () => lines.slice(mark).find(match), timeoutMs, 50);

let cluster: Cluster;
let node: Node;
let core: CoreV1Api;
let kube: Kube;
let leases: LeaseApi;
let systemd: Systemd;
/** Node B's name: the pool's other node, which takes slots through the same protocol. */
let otherName = "";

beforeAll(async () => {
  [cluster, node] = await Promise.all([startCluster({ controllerManager: false }), bootNode("radm")]);
  core = cluster.admin().makeApiClient(CoreV1Api);
  kube = kubeFromConnection({ kind: "kubeconfig", path: cluster.adminKubeconfig });
  leases = leaseApi(kube, "kube-system", log);
  // Node A, Ready (no kube-controller-manager: nobody marks it otherwise), on the "old" OSC.
  await core.createNode({ body: { metadata: { name: node.name, labels: { "kubernetes.io/hostname": node.name }, annotations: { "checksum/cloud-config-data": appliedChecksum } } } });
  const now = new Date().toISOString().replace(/\.\d+Z$/, "Z");
  const ready = { type: "Ready", status: "True", reason: "KubeletReady", message: "kubelet is posting ready status", lastHeartbeatTime: now, lastTransitionTime: now };
  await core.patchNodeStatus({ name: node.name, body: { status: { conditions: [ready] } } }, setHeaderOptions("Content-Type", PatchStrategy.StrategicMergePatch));
  otherName = `${node.name}-b`;
  await registerNode(core, otherName);
  await node.writeFile(`/etc/systemd/system/${unit}`, "[Unit]\nDescription=trellis test sleeper (disruptive by the Secret's disruptive-units)\n[Service]\nExecStart=/bin/sleep infinity\n");
  await node.execOk(["systemctl", "daemon-reload"]);
  await node.execOk(["systemctl", "start", unit]);
  systemd = createSystemd({ address: node.busAddress });
}, 240_000);

// What a test started, stopped after it whatever its outcome: a failed test must not leave an agent that
// restarts the unit for the next one.
const running: { stop(): Promise<void> }[] = [];
afterEach(async () => {
  for (const r of running.splice(0).reverse()) await r.stop().catch(() => {});
  await patchNode({ labels: { [pausedLabel]: null }, annotations: { [restartAnnotation]: null } });
}, 60_000);

afterAll(async () => {
  systemd?.close();
  await Promise.all([node?.stop(), cluster?.stop()]);
}, 60_000);

const show = async (prop: string) => (await node.execOk(["systemctl", "show", "-P", prop, unit])).trim();
const startedAt = () => show("ExecMainStartTimestampMonotonic").then(Number);
const mainPid = () => show("MainPID").then(Number);
const patchNode = (metadata: { labels?: Record<string, string | null>; annotations?: Record<string, string | null> }) =>
  core.patchNode({ name: node.name, body: { metadata } }, setHeaderOptions("Content-Type", PatchStrategy.MergePatch));
const annotation = async () => (await core.readNode({ name: node.name })).metadata?.annotations?.[restartAnnotation];
const rolloutCondition = async () => (await core.readNode({ name: node.name })).status?.conditions?.find((c) => c.type === rolloutConditionType);
/** The revision the restart controller gives the restart `value` asks for on node A. */
const restartRevision = (value: string) => workRevision("restart", node.name, sha256Hex(value).slice(0, 16));

// ---------------------------------------------------------------------------------------------------------
// A pool: the OSC Secret (rollout settings, an invalid osc.yaml), its record watched, and node B's member.

type Pool = {
  name: string;
  uid: string;
  settings: RolloutSettings;
  record: PoolRecordWatch;
  /** The record as the API server has it now. */
  read(): Promise<{ holders: Holder[]; failed?: { revision: string; node: string } }>;
  /** Node A's ticket as the API server has it now. */
  ticketOfA(): Promise<ReturnType<typeof readTicket>>;
  b: { member: PoolMember; leader: PoolLeader; ask(revision: string, changes?: string[]): Promise<void>; giveBack(): Promise<void> };
  stop(): Promise<void>;
};

let seq = 0;
async function startPool(annotations: Record<string, string> = {}): Promise<Pool> {
  const name = `radm-${++seq}-${node.name}`;
  const secret = await core.createNamespacedSecret({
    namespace: "kube-system",
    body: {
      metadata: {
        name,
        annotations: {
          [rolloutKeys.maxDisrupted]: "1",
          [rolloutKeys.disruptiveUnits]: "disrupt-*",
          [rolloutKeys.settleTime]: "2s",
          [rolloutKeys.healthTimeout]: "60s",
          ...annotations,
        },
      },
      // Not an OSC at all: the OSC controller would call it invalid, after observing the settings.
      data: { "osc.yaml": Buffer.from("{ this is: [not an OSC\n").toString("base64") },
    },
  });
  const uid = secret.metadata?.uid as string;
  // The settings as the OSC controller's resolve reads them, first thing, from the Secret as it is.
  const parsed = parseRolloutSettings(secret.metadata?.annotations, `Secret kube-system/${name}`);
  if (!parsed.ok) throw new Error(parsed.errors.join("; "));
  const record = watchPoolRecord(cluster.admin(), name);
  const bUid = (await core.readNode({ name: otherName })).metadata?.uid as string;
  const ref = { secret: { name, uid }, node: { name: otherName, uid: bUid } };
  const member = poolMember(leases, ref);
  const leader = startPoolLeader({ api: leases, ref, log, budget: () => parsed.value.budget, clock: monotonicMs, wallNow: () => new Date(), leaseDurationMs: 3_000, renewEveryMs: 1_000 });
  const read = async () => readPool(await leases.get(slotsLeaseName(name)), "record");
  let stopped = false;
  const pool: Pool = {
    name,
    uid,
    settings: parsed.value,
    record,
    read,
    ticketOfA: async () => {
      const l = await leases.get(nodeTicketName(name, node.name));
      return l ? readTicket(l, "ticket") : undefined;
    },
    b: {
      member,
      leader,
      // As B's agent: its ticket asks, it stands for leader while it waits, and holds once admitted.
      async ask(revision, changes) {
        await member.ensureTicket();
        await member.request({ revision, reason: "osc", since: new Date().toISOString(), ...(changes ? { changes } : {}) });
        leader.campaign(true);
        await waitFor(`${otherName} admitted for ${revision}`, async () => {
          const l = await leases.get(member.ticketName);
          return admitted(l ? readTicket(l, "ticket") : undefined) && (await read()).holders.some((h) => h.node === otherName) ? true : undefined;
        }, 60_000, 100);
        leader.campaign(false);
      },
      async giveBack() {
        await member.release();
      },
    },
    async stop() {
      if (stopped) return;
      stopped = true;
      record.stop();
      await leader.stop();
    },
  };
  running.push(pool);
  return pool;
}

// ---------------------------------------------------------------------------------------------------------
// Node A's agent: its Node source, rollout and restart controllers over a state directory that outlives it.

/**
 * Every restart the controller asked systemd for, with the pool's record as the API server had it then and
 * the node's rollout state (its current work) as saved then.
 */
type RestartSeen = { unit: string; at: number; holders: Holder[]; current?: { kind: string; revision: string; phase: string } };

type Agent = { rollout: Rollout; restarts: RestartSeen[]; stop(): Promise<void> };

const statusBoard = (): StatusBoard => {
  const components: Record<string, ComponentStatus> = {};
  return { set: (c, s) => void (components[c] = { ...s, at: new Date().toISOString() } as ComponentStatus), snapshot: () => ({ ...components }) };
};

async function startAgent(pool: Pool, root: string, restarts: RestartSeen[] = []): Promise<Agent> {
  const files = createFiles(root);
  let rollout: Rollout | undefined;
  const recording: Systemd = {
    ...systemd,
    restart: async (u) => {
      const at = Date.now();
      const cur = (await rollout?.state())?.current;
      restarts.push({ unit: u, at, holders: (await pool.read()).holders, ...(cur ? { current: { kind: cur.work.kind, revision: cur.work.revision, phase: cur.phase } } : {}) });
      return systemd.restart(u);
    },
  };
  const nodes = startNodeSource({ kube, hostName: node.name, log });
  await nodes.found;
  const shared = { kube, files, systemd: recording, store: createStateStore(files), events: createEventRecorder({ kube, log }), node: nodes, status: statusBoard(), log, secretName: pool.name };
  rollout = startRollout({ ...shared, stuckThresholdMs: 60_000, lookEveryMs: 250 });
  const restart = startRestartController({ kube, systemd: recording, events: shared.events, nodes, log, selfUnit, rollout, retryMs: 200, settingsRetryMs: 500 });
  let stopped = false;
  const agent: Agent = {
    rollout,
    restarts,
    async stop() {
      if (stopped) return;
      stopped = true;
      await restart.stop();
      await rollout.stop();
      await nodes.stop();
    },
  };
  running.push(agent);
  return agent;
}

/** What the OSC controller's resolve does first, whatever the OSC: the rollout learns the Secret's settings. */
const observe = (a: Agent, p: Pool) => a.rollout.observe({ secretUid: p.uid, settings: p.settings });

/** The restart of `value` as seen when it ran: admitted (the node's current work, applying) and holding A's slot on the record. */
const admittedRestart = (value: string) => ({
  unit,
  current: { kind: "restart", revision: restartRevision(value), phase: "applying" },
  holders: [expect.objectContaining({ node: node.name, revision: restartRevision(value) })],
});

/** Node A's ticket asks for `revision` (the rollout offered the work to the pool, and it waits). */
const waitRequested = (p: Pool, revision: string) =>
  waitFor(`node A's ticket to ask for ${revision}`, async () => ((await p.ticketOfA())?.request?.revision === revision ? true : undefined), 60_000, 100);

/** The restart seen in systemd: a later start of its main process than `before`. */
const waitRestarted = (before: number, timeoutMs: number) => waitFor(`${unit} restarted`, async () => ((await startedAt()) > before ? true : undefined), timeoutMs, 200);

/**
 * Once restarted and gated: the annotation gone, the gate passed and the slot given back — A's ticket no longer
 * asks for the restart (the record drops the holder then or at the next leader's pass; and A's OSC controller
 * may ask for other work at once).
 */
async function settled(p: Pool, revision: string): Promise<void> {
  await waitFor("the annotation removed", async () => ((await annotation()) === undefined ? true : undefined), 30_000, 100);
  // The event, not only the condition: the OSC controller's next answer (held, stopped) may replace the
  // condition within the second the slot goes back.
  await waitFor("the restart's gate passed", async () => {
    const c = await rolloutCondition();
    if (c?.reason === "HealthGatePassed" && c.message?.includes(revision)) return true;
    const events = await core.listNamespacedEvent({ namespace: "default", fieldSelector: `involvedObject.name=${node.name},reason=RolloutHealthGatePassed` });
    return events.items.some((e) => e.message?.includes(revision)) ? true : undefined;
  }, 60_000, 100);
  await waitFor("node A's slot given back", async () => {
    const t = await p.ticketOfA();
    return t && t.request?.revision !== revision && t.grant?.revision !== revision ? true : undefined;
  }, 60_000, 100);
}

describe("item 6: requested restarts go through the node's rollout admission", () => {
  test("item 6: a disruptive restart waits while another node holds the only slot (k = 1) and runs once it is free; the same right after an agent restart while the request is pending", async () => {
    // Why the old code (5822692) fails this: its restart controller asked the rollout for a slot only when
    // the rollout already knew the pool (src/controllers/restart.ts:91-93, `const pool = rollout?.current()`
    // … `if (rollout && pool && disruptive.length > 0)`), and only the OSC controller told it, late in a
    // reconcile of a valid OSC (src/controllers/osc.ts:351). Right after an agent restart `current()` was
    // undefined, so the pending request fell through to the restarts (restart.ts:105-110) at once, with no
    // slot, while node B held the only one: the second round below sees the restart before B gives back.
    // (The first round held on the old code too, once its OSC controller had observed the pool.)
    const p = await startPool();
    const root = runDir("restart-admission-k1");
    const since = Date.now();
    const restarts: RestartSeen[] = [];

    // Round 1: B holds the only slot; A's restart asks the pool and waits.
    await p.b.ask("osc-of-b-1");
    let agent = await startAgent(p, root, restarts);
    observe(agent, p);
    const first = { start: await startedAt(), pid: await mainPid() };
    const value1 = "disrupt-a";
    await patchNode({ annotations: { [restartAnnotation]: value1 } });
    await waitRequested(p, restartRevision(value1));
    expect((await rolloutCondition())?.reason).toBe("WaitingForSlot");
    expect(await startedAt()).toBe(first.start);
    expect(restarts).toEqual([]);
    expect((await p.read()).holders.map((h) => h.node)).toEqual([otherName]);
    await p.b.giveBack();
    await waitRestarted(first.start, 60_000);
    expect(await mainPid()).not.toBe(first.pid);
    expect(restarts).toHaveLength(1);
    expect(restarts[0]).toMatchObject(admittedRestart(value1));
    await settled(p, restartRevision(value1));

    // Round 2: B holds the slot again; A's next request is pending when A's agent stops and starts again.
    await p.b.ask("osc-of-b-2");
    const second = { start: await startedAt(), pid: await mainPid() };
    const value2 = "disrupt-a.service";
    await patchNode({ annotations: { [restartAnnotation]: value2 } });
    await waitRequested(p, restartRevision(value2));
    await agent.stop();
    const restarted = lines.length;
    agent = await startAgent(p, root, restarts);
    // Before the OSC controller has read the Secret (nobody called observe): the request waits for the settings.
    await logged("the restarted agent's request waiting for the rollout settings", restarted, (l) => l.msg === "the requested restart asks again later" && l.why === "the rollout settings are not read yet");
    expect(await startedAt()).toBe(second.start);
    expect(restarts).toHaveLength(1);
    // The settings known: the request goes to the pool again, and waits for B's slot.
    const observed = lines.length;
    observe(agent, p);
    await logged("the restarted agent's request waiting for the slot", observed, (l) => l.msg === "the requested restart waits" && l.reason === "WaitingForSlot");
    expect(await startedAt()).toBe(second.start);
    expect(restarts).toHaveLength(1);
    expect((await p.read()).holders.map((h) => h.node)).toEqual([otherName]);
    expect((await p.ticketOfA())?.request?.revision).toBe(restartRevision(value2));
    await p.b.giveBack();
    await waitRestarted(second.start, 60_000);
    expect(await mainPid()).not.toBe(second.pid);
    expect(restarts).toHaveLength(2);
    expect(restarts[1]).toMatchObject(admittedRestart(value2));
    await settled(p, restartRevision(value2));

    // Over the whole test: never two holders; A held the slot for exactly its two restarts.
    expect(p.record.maxHolders(since)).toBe(1);
    expect(p.record.holdPeriods(since).map((h) => `${h.node === node.name ? "A" : "B"} ${h.revision}`)).toEqual(["B osc-of-b-1", `A ${restartRevision(value1)}`, "B osc-of-b-2", `A ${restartRevision(value2)}`]);
    await agent.stop();
    await p.stop();
  }, 300_000);

  test("item 6: a disruptive restart waits while the Node is paused, and runs after it is unpaused", async () => {
    // Why the old code (5822692) fails this: the pause was checked only in the OSC controller's admission
    // (src/controllers/rollout.ts:247, in admit(), called from src/controllers/osc.ts:372); the restart
    // controller went to takeSlot (restart.ts:95), which looked at no label (rollout.ts:193-223): with a free
    // slot the paused node restarted at once.
    const p = await startPool();
    const agent = await startAgent(p, runDir("restart-admission-paused"));
    observe(agent, p);
    const before = { start: await startedAt(), pid: await mainPid() };
    const value = "disrupt-a";
    // The pause and the request in one update of the Node: the controller never sees the one without the other.
    await patchNode({ labels: { [pausedLabel]: "true" }, annotations: { [restartAnnotation]: value } });
    const held = await waitFor("the restart held back: Paused", async () => {
      const c = await rolloutCondition();
      return c?.reason === "Paused" ? c : undefined;
    }, 60_000, 100);
    expect(held.message).toContain(`restart ${restartRevision(value)} waits: this node is paused`);
    // Held back before the pool is asked: no request on A's ticket, no slot, no restart.
    expect((await p.ticketOfA())?.request).toBeUndefined();
    expect((await p.read()).holders).toEqual([]);
    expect(await startedAt()).toBe(before.start);
    expect(agent.restarts).toEqual([]);
    await patchNode({ labels: { [pausedLabel]: null } });
    const unpaused = Date.now();
    // The hold is looked at again 60 s after it began (src/rollout/hold-back.ts).
    await waitRestarted(before.start, 120_000);
    expect(await mainPid()).not.toBe(before.pid);
    expect(agent.restarts).toHaveLength(1);
    expect(agent.restarts[0]?.at).toBeGreaterThanOrEqual(unpaused);
    expect(agent.restarts[0]).toMatchObject(admittedRestart(value));
    await settled(p, restartRevision(value));
    await agent.stop();
    await p.stop();
  }, 300_000);

  test("item 6: a disruptive restart waits outside every maintenance window, and runs when a window opens", async () => {
    // Why the old code (5822692) fails this: maintenance windows were checked only in the OSC controller's
    // admission (src/controllers/rollout.ts:252-259, in admit()); the restart controller's takeSlot
    // (rollout.ts:193-223) never looked at them: with a free slot the restart ran at once, outside every window.
    // A window opening at the next whole minute at least 20 s from now: long enough to see the hold.
    const opens = Math.ceil((Date.now() + 20_000) / 60_000) * 60_000;
    const hhmm = (ms: number) => new Date(ms).toISOString().slice(11, 16);
    const window = `daily ${hhmm(opens)}-${hhmm(opens + 10 * 60_000)} UTC`;
    const p = await startPool({ [rolloutKeys.windows]: window });
    const agent = await startAgent(p, runDir("restart-admission-window"));
    observe(agent, p);
    const before = { start: await startedAt(), pid: await mainPid() };
    const value = "disrupt-a";
    await patchNode({ annotations: { [restartAnnotation]: value } });
    const held = await waitFor("the restart held back: OutsideMaintenanceWindow", async () => {
      const c = await rolloutCondition();
      return c?.reason === "OutsideMaintenanceWindow" ? c : undefined;
    }, 30_000, 100);
    expect(Date.now()).toBeLessThan(opens);
    expect(held.message).toContain(`restarts ${unit} and waits for a maintenance window (next: ${new Date(opens).toISOString()})`);
    expect((await p.ticketOfA())?.request).toBeUndefined();
    expect((await p.read()).holders).toEqual([]);
    expect(await startedAt()).toBe(before.start);
    expect(agent.restarts).toEqual([]);
    // The hold asks again when the window opens.
    await waitRestarted(before.start, 150_000);
    expect(await mainPid()).not.toBe(before.pid);
    expect(agent.restarts).toHaveLength(1);
    expect(agent.restarts[0]?.at).toBeGreaterThanOrEqual(opens);
    expect(agent.restarts[0]).toMatchObject(admittedRestart(value));
    await settled(p, restartRevision(value));
    await agent.stop();
    await p.stop();
  }, 300_000);

  test("item 6: while the rollout settings are known but the OSC is invalid (observe only), a disruptive restart still waits for the slot", async () => {
    // Why the old code (5822692) fails this: with an invalid OSC its OSC controller returned at
    // src/controllers/osc.ts:296-346 (`return invalid(…)`) before `deps.rollout.observe` at osc.ts:351, so an
    // agent started while the OSC was invalid never knew the pool: `rollout?.current()` was undefined in
    // src/controllers/restart.ts:91-93 and the restart ran at once (restart.ts:105-110), B's slot or not.
    // (The new OSC controller observes the settings first, even for an invalid OSC: reconcile.ts, resolve.)
    const p = await startPool();
    const secret = await core.readNamespacedSecret({ name: p.name, namespace: "kube-system" });
    expect(Buffer.from(secret.data?.["osc.yaml"] ?? "", "base64").toString()).toContain("not an OSC");
    await p.b.ask("osc-of-b");
    const since = Date.now();
    const agent = await startAgent(p, runDir("restart-admission-invalid"));
    observe(agent, p);
    const before = { start: await startedAt(), pid: await mainPid() };
    const value = "disrupt-a";
    const asked = lines.length;
    await patchNode({ annotations: { [restartAnnotation]: value } });
    await waitRequested(p, restartRevision(value));
    await logged("the request waiting for the slot", asked, (l) => l.msg === "the requested restart waits" && l.reason === "WaitingForSlot" && Array.isArray(l.units));
    expect(await startedAt()).toBe(before.start);
    expect(agent.restarts).toEqual([]);
    expect((await p.read()).holders.map((h) => h.node)).toEqual([otherName]);
    await p.b.giveBack();
    await waitRestarted(before.start, 60_000);
    expect(await mainPid()).not.toBe(before.pid);
    expect(agent.restarts).toHaveLength(1);
    expect(agent.restarts[0]).toMatchObject(admittedRestart(value));
    await settled(p, restartRevision(value));
    expect(p.record.maxHolders(since)).toBe(1);
    await agent.stop();
    await p.stop();
  }, 300_000);

  test("item 6: a revision that failed its gate on another node (on the pool's record) neither refuses nor stops a restart requested on a node still on the old OSC: it waits for its slot like any work, is admitted and runs", async () => {
    // Why the old code (5822692) fails this: its restart controller took its slot for the OSC the Secret
    // carries (src/controllers/restart.ts:95, `rollout.takeSlot("restart", pool)`, with `pool.checksum` the
    // OSC observed at src/controllers/osc.ts:351), and takeSlot acquired for that checksum
    // (src/controllers/rollout.ts:204): the failed OSC's slot record said "stopped", so the restart got
    // RolloutStopped (rollout.ts:205-212) and waited, retried every minute, for as long as the failed OSC
    // stayed in the Secret (restart.ts:96-102).
    // It also failed on the redesign as first committed (8cff98f): the restart controller waited behind any
    // OSC work of the node's rollout (restart.ts, `busy.work.kind !== "restart"`), and a node still on the old
    // OSC has the failed revision waiting there for ever (its OSC controller offers it at every reconcile), so
    // the request was asked again every 5 s and never ran. Fixed with this test: a revision the pool stopped
    // does not hold a restart back, nor take its place in the queue (src/controllers/rollout/controller.ts).
    const p = await startPool();
    // B took the new OSC, failed its gate and recorded it, then gave its slot back (rolled back, healthy).
    const bad = "osc-revision-that-failed";
    const changes = ["0123456789abcdef"];
    await p.b.ask(bad, changes);
    await p.b.member.recordFailure({ revision: bad, node: otherName, failure: "Node Ready: False (KubeletNotReady)", at: new Date().toISOString(), changes: [changes] });
    await p.b.giveBack();
    expect((await p.read()).failed).toMatchObject({ revision: bad, node: otherName });

    const since = Date.now();
    const agent = await startAgent(p, runDir("restart-admission-failed"));
    observe(agent, p);
    // A is still on the old OSC: its OSC controller offers the new one, which the pool has stopped. This
    // stands in for it: it offers at once, again when the decision says, and whenever the rollout says the
    // answer may have changed (src/controllers/osc/rollout.ts admit, controller.ts onChange).
    const osc = oscController(agent.rollout, { kind: "osc", revision: bad, checksum: "1".repeat(64), base: "1".repeat(64), disruption: { units: ["kubelet.service"], paths: [] }, changes });
    await waitFor("A told that the new OSC is stopped", async () => ((await rolloutCondition())?.reason === "RolloutStopped" ? true : undefined), 60_000, 100);
    expect((await p.ticketOfA())?.grant?.stopped).toContain("KubeletNotReady");
    // B takes the only slot for other work (a fix, say): A's restart must wait for it like any other work.
    await p.b.ask("osc-revision-of-the-fix");

    const before = { start: await startedAt(), pid: await mainPid() };
    const value = "disrupt-a";
    await patchNode({ annotations: { [restartAnnotation]: value } });
    await waitRequested(p, restartRevision(value));
    // Meanwhile A's OSC controller offers the failed OSC again and again: it is held, and the restart keeps
    // its request on A's ticket (its place in the pool's queue).
    const offered = osc.decisions.length;
    await waitFor("two more offers of the failed OSC", () => (osc.decisions.length >= offered + 2 ? true : undefined), 30_000, 100);
    expect(osc.decisions.slice(offered)).toEqual(osc.decisions.slice(offered).map(() => expect.objectContaining({ do: "hold", reason: "RolloutStopped" })));
    expect((await p.ticketOfA())?.request?.revision).toBe(restartRevision(value));
    expect(await startedAt()).toBe(before.start);
    expect(agent.restarts).toEqual([]);
    expect((await p.read()).holders.map((h) => h.node)).toEqual([otherName]);

    await p.b.giveBack();
    await waitRestarted(before.start, 90_000);
    expect(await mainPid()).not.toBe(before.pid);
    expect(agent.restarts).toHaveLength(1);
    expect(agent.restarts[0]).toMatchObject(admittedRestart(value));
    await settled(p, restartRevision(value));
    // The failure stays on the record, the failed OSC was never admitted here, and the node waits for it again.
    expect((await p.read()).failed).toMatchObject({ revision: bad, node: otherName });
    expect(osc.applied()).toBe(false);
    expect(revisionsHeldBy(p, node.name, since)).toEqual([restartRevision(value)]);
    expect(p.record.maxHolders(since)).toBe(1);
    await waitRequested(p, bad);
    await osc.stop();
    await agent.stop();
    await p.stop();
  }, 300_000);

  test("item 6: during an in-place update holding the node's slot (the OSC controller's in-place hold), a requested restart waits, across an agent restart, and goes through admission after it", async () => {
    // Why the old code (5822692) fails this: a restart requested while the node held a slot for an OSC change
    // (this in-place update) took that slot over at once — takeSlot returned `{ go: true }` for any slot the
    // node held (src/controllers/rollout.ts:195-198) — and ran beside the in-place update, with no gate of its
    // own. And an agent restarted while the OSC controller held an in-place update for its drain never knew the
    // pool: that hold returned at src/controllers/osc.ts:341-343, before `deps.rollout.observe` at osc.ts:351,
    // so `rollout?.current()` was undefined (src/controllers/restart.ts:91-93) and the restart bypassed the
    // budget. (That drain hold comes before the update is offered: to the rollout it is the previous test's
    // case, settings observed and nothing offered, as the new OSC controller observes them first.)
    // A health timeout the in-place update's hold stays well within.
    const p = await startPool({ [rolloutKeys.healthTimeout]: "180s" });
    const root = runDir("restart-admission-in-place");
    const since = Date.now();
    const restarts: RestartSeen[] = [];
    let agent = await startAgent(p, root, restarts);
    observe(agent, p);
    // The OSC controller's in-place update: admitted under A's slot, then held (the machine restarting, say).
    // (Its disruption names a counted unit this node has no kubelet for: its gate then judges the Node's Ready.)
    const inPlace: Work = { kind: "in-place", revision: "in-place-revision", checksum: "2".repeat(64), base: "2".repeat(64), disruption: { units: ["disrupt-in-place.service"], paths: [] } };
    expect(await agent.rollout.offer(inPlace)).toMatchObject({ do: "hold", reason: "WaitingForSlot" });
    await waitFor("the in-place update admitted", async () => ((await agent.rollout.offer(inPlace)).do === "apply" ? true : undefined), 60_000, 250);
    const before = { start: await startedAt(), pid: await mainPid() };
    const value = "disrupt-a";
    const asked = lines.length;
    await patchNode({ annotations: { [restartAnnotation]: value } });
    await logged("the request waiting for the in-place update", asked, (l) => l.msg === "the requested restart asks again later" && String(l.why).includes("busy with in-place work"));
    // An agent restart during the hold: the OSC controller observes the settings first, then holds again.
    await agent.stop();
    const restarted = lines.length;
    agent = await startAgent(p, root, restarts);
    observe(agent, p);
    await logged("the restarted agent's request waiting for the in-place update", restarted, (l) => l.msg === "the requested restart asks again later" && String(l.why).includes("busy with in-place work"));
    expect(await startedAt()).toBe(before.start);
    expect(restarts).toEqual([]);
    expect((await p.read()).holders).toEqual([expect.objectContaining({ node: node.name, revision: "in-place-revision" })]);
    // The in-place update ends; its gate passes and the slot goes back; then the restart asks for one.
    expect(await agent.rollout.offer(inPlace)).toEqual({ do: "apply", target: "work" });
    await agent.rollout.applied({ complete: true, checksum: inPlace.checksum });
    await waitRestarted(before.start, 90_000);
    expect(await mainPid()).not.toBe(before.pid);
    expect(restarts).toHaveLength(1);
    expect(restarts[0]).toMatchObject(admittedRestart(value));
    await settled(p, restartRevision(value));
    // On the record A's one slot went from the in-place update to the restart (moved on, or given back and
    // admitted again): never both, never a second slot.
    expect(revisionsHeldBy(p, node.name, since)).toEqual(["in-place-revision", restartRevision(value)]);
    expect(p.record.maxHolders(since)).toBe(1);
    await agent.stop();
    await p.stop();
  }, 300_000);
});

/** The revisions `nodeName` held on the record since `since`, in order, each once per holding. */
function revisionsHeldBy(p: Pool, nodeName: string, since: number): string[] {
  const held: string[] = [];
  for (const v of p.record.versions()) {
    if (v.at < since) continue;
    const r = v.record.holders.find((h) => h.node === nodeName)?.revision;
    if (r !== undefined && held.at(-1) !== r) held.push(r);
  }
  return held;
}

/**
 * Stands in for a node's OSC controller that keeps offering `work` (src/controllers/osc/rollout.ts admit):
 * once now, again after each hold's retryAfterMs, and at once whenever the rollout says its decision may
 * have changed. It never applies anything; `applied()` says whether the rollout ever told it to.
 */
function oscController(rollout: Rollout, work: Work): { decisions: Decision[]; applied(): boolean; stop(): Promise<void> } {
  let stopped = false;
  let applied = false;
  const decisions: Decision[] = [];
  let timer: ReturnType<typeof setTimeout> | undefined;
  let running: Promise<void> = Promise.resolve();
  const offer = () => {
    if (timer) clearTimeout(timer);
    running = running.then(async () => {
      if (stopped) return;
      const d: Decision = await rollout.offer(work);
      decisions.push(d);
      if (d.do === "apply") applied = true;
      if (!stopped) timer = setTimeout(offer, d.do === "hold" ? d.retryAfterMs : 5_000);
    });
  };
  const unsubscribe = rollout.onChange(offer);
  offer();
  return {
    decisions,
    applied: () => applied,
    async stop() {
      stopped = true;
      unsubscribe();
      if (timer) clearTimeout(timer);
      await running;
    },
  };
}
