// Fleet rollouts under faults, with real kubelets: issue 19's "Found already" items 1, 2, 3 and 9, and item 5's
// faults on real components (the holder cut off from the API server, the holder's agent killed, a waiting
// agent killed), each a regression test. Three bare machines brought up by the compiled trellis with the OSC
// Gardener renders for one pool (test/harness/worker.ts), a disruption budget of one node and rollback; the
// pool's record `<secret>-slots` is watched from the start, so who held the slot when is known from its
// versions. The tests build on each other: the first one's gated change is every node's last good OSC, the
// rollback target of the third; each ends with every node on a good OSC and the slot free. Each test's change
// writes a file of its own: a failed change's files stay suspect for the pool until proven (a later change
// that brought one back would be stopped: docs/rollout-protocol.md).
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { CoordinationV1Api, type V1Node } from "@kubernetes/client-node";
import { parse, stringify } from "yaml";
import { rolloutKeys } from "../../src/api/rollout.ts";
import { rolloutStatePath } from "../../src/api/rollout-state.ts";
import type { AgentState } from "../../src/api/state.ts";
import { type StatusFile, statusPath } from "../../src/api/status-file.ts";
import { statePath } from "../../src/apply/state-store.ts";
import { rolloutConditionType } from "../../src/controllers/rollout/report.ts";
import type { NodeRollout } from "../../src/rollout/machine.ts";
import { failedAnnotation, leaderLeaseName, slotsLeaseName } from "../../src/rollout/pool.ts";
import { mainPid, nodeEvents, putOscSecret, readNode, unitProperty, waitApplied } from "../harness/agent.ts";
import { bridgeHostIp } from "../harness/bridge-relay.ts";
import { waitFor } from "../harness/exec.ts";
import { cutOff } from "../harness/partition.ts";
import { type HoldPeriod, type PoolRecordWatch, watchPoolRecord } from "../harness/pool-record.ts";
import { watchUntil } from "../harness/watch.ts";
import { workerOsc, type WorkerOscInput } from "../harness/worker-osc.ts";
import { bringUpWorker, readyAgain, startWorkerWorld, type Worker, type WorkerWorld } from "../harness/worker.ts";

let world: WorkerWorld;
const workers: Worker[] = [];
let pool: PoolRecordWatch | undefined;

beforeAll(async () => {
  world = await startWorkerWorld();
  for (let i = 0; i < 3; i++) workers.push(await bringUpWorker(world, `fault${i}`));
  pool = watchPoolRecord(world.cluster.admin(), first().secretName);
}, 600_000);

afterAll(async () => {
  pool?.stop();
  for (const w of workers) await w.bare.stop();
  await world?.stop();
}, 120_000);

const first = () => workers[0] as Worker;
const record = () => pool as PoolRecordWatch;
const settings = (settle: string, timeout: string) => ({ [rolloutKeys.maxDisrupted]: "1", [rolloutKeys.settleTime]: settle, [rolloutKeys.healthTimeout]: timeout, [rolloutKeys.rollback]: "true" });
const put = (osc: string, annotations: Record<string, string>) => putOscSecret(world.cluster, first().secretName, osc, annotations);
const applied = async (w: Worker) => (await readNode(w.bare)).metadata?.annotations?.["checksum/cloud-config-data"];
const kubeletStart = async (w: Worker) => Date.parse(await unitProperty(w.bare.node, "kubelet.service", "ExecMainStartTimestamp"));
const rolloutCondition = async (w: Worker) => (await readNode(w.bare)).status?.conditions?.find((c) => c.type === rolloutConditionType);
const ready = (n: V1Node) => n.status?.conditions?.find((c) => c.type === "Ready");
const byName = (name: string) => workers.find((w) => w.bare.name === name) as Worker;
const hasEvent = async (w: Worker, reason: string, text: string) => (await nodeEvents(w.bare)).find((e) => e.reason === reason && e.message?.includes(text));
const short = (checksum: string) => checksum.slice(0, 12);

/**
 * A registry's hosts.toml no pull uses: the kind of file a running process (containerd) reads without a
 * restart. Not a static pod manifest: an OSC with one is reported applied only once its mirror pod runs, as
 * gardener-node-agent reports it (agent-gates.test.ts), and these workers' kubelets have no staticPodPath.
 */
const liveFilePath = "/etc/containerd/certs.d/e2e-live.invalid/hosts.toml";
/** Breaks kubelet's start: its restart fails (systemd's job ends "failed"), so an apply that restarts it never completes. */
const brokenDropIn = { name: "50-e2e-broken.conf", content: "[Service]\nExecStartPre=/bin/false\n" };

type Change = Partial<Pick<WorkerOscInput, "maxPods" | "extraFile">> & { liveFile?: boolean; brokenKubelet?: boolean };

/** The pool's OSC as Gardener renders it, with `c`'s changes (an OS extension would add such files and drop-ins). */
async function rendered(c: Change): Promise<string> {
  const { maxPods, extraFile } = c;
  const osc = (await workerOsc({ ...first().input, ...(maxPods ? { maxPods } : {}), ...(extraFile ? { extraFile } : {}) })).osc;
  if (!c.liveFile && !c.brokenKubelet) return osc;
  const doc = parse(osc);
  if (c.liveFile) {
    const hosts = `server = "https://e2e-live.invalid"\n\n[host."https://mirror.e2e-live.invalid"]\n  capabilities = ["pull", "resolve"]\n`;
    doc.spec.files.push({ path: liveFilePath, permissions: 0o644, content: { inline: { data: hosts } } });
  }
  if (c.brokenKubelet) {
    const kubelet = doc.spec.units.find((u: { name: string }) => u.name === "kubelet.service");
    kubelet.dropIns = [...(kubelet.dropIns ?? []), brokenDropIn];
  }
  return stringify(doc);
}

/** Every node's gate for `checksum` passed (its condition says so; the slot goes back right after). */
async function gatesPassed(checksum: string, timeoutMs: number): Promise<void> {
  for (const w of workers) {
    await waitFor(`${w.bare.name}: gate of ${short(checksum)} passed`, async () => {
      const c = await rolloutCondition(w);
      return c?.reason === "HealthGatePassed" && c.message?.includes(short(checksum)) ? true : undefined;
    }, timeoutMs, 250);
  }
  await waitFor("every slot given back", () => (record().latest().holders.length === 0 ? true : undefined), 30_000, 250);
}

/** Hold periods one after the other, never overlapping: the budget of one node. */
function expectOneAtATime(periods: HoldPeriod[]): void {
  for (let i = 1; i < periods.length; i++) expect((periods[i] as HoldPeriod).from).toBeGreaterThanOrEqual((periods[i - 1] as HoldPeriod).to);
}

/** Who held the slot when, in seconds from `since`, for the test's log. */
const timeline = (periods: HoldPeriod[], since: number) => periods.map((p) => `${p.node} ${((p.from - since) / 1000).toFixed(1)}–${((p.to - since) / 1000).toFixed(1)} s`).join(", ");

/** The first node admitted since `since`, once it holds the slot. */
const firstHolder = (since: number) => waitFor("a node admitted", () => record().holdPeriods(since)[0], 120_000, 100);

/** The agent's own records inside the node (read through its root, not the network): what it applied, its rollout, its status board. */
const agentState = async (w: Worker) => JSON.parse(await w.bare.node.readFile(statePath)) as AgentState;
const nodeRollout = async (w: Worker) => JSON.parse(await w.bare.node.readFile(rolloutStatePath)) as NodeRollout;
const agentStatus = async (w: Worker) => JSON.parse(await w.bare.node.readFile(statusPath)) as StatusFile;
const agentUnit = "gardener-node-agent.service";
const dropInPath = `/etc/systemd/system/kubelet.service.d/${brokenDropIn.name}`;
const hasDropIn = async (w: Worker) => (await w.bare.node.exec(["test", "-e", dropInPath])).code === 0;
/** kubelet's maxPods as its configuration file on the node says. */
const maxPodsOf = async (w: Worker) => Number(/^maxPods: (\d+)$/m.exec(await w.bare.node.readFile("/var/lib/kubelet/config/kubelet"))?.[1]);
/** Seconds from `from` to `to`, for the test's log. */
const secs = (from: number, to: number) => `${((to - from) / 1000).toFixed(1)} s`;

/**
 * The pool at rest: no slot held and every Node naming the same applied OSC, which is returned (the rollback
 * target of the next change). Waited for, so that a test after one that failed starts from a settled pool.
 */
const poolAtRest = () =>
  waitFor("the pool at rest (no slot held, every node on the same OSC)", async () => {
    if (record().latest().holders.length > 0) return undefined;
    const checksums = await Promise.all(workers.map(applied));
    return checksums.every((c) => c !== undefined && c === checksums[0]) ? (checksums[0] as string) : undefined;
  }, 180_000, 250);

/**
 * As an operator resumes a stopped rollout (README, "Dead holders"): the last test's failure taken off the
 * pool's record, so that its changes (the broken kubelet drop-in every bad change here writes) no longer stop
 * this test's.
 */
async function resumeRollout(): Promise<void> {
  const api = world.cluster.admin().makeApiClient(CoordinationV1Api);
  const name = slotsLeaseName(first().secretName);
  await waitFor("the last failure off the pool's record", async () => {
    const lease = await api.readNamespacedLease({ name, namespace: "kube-system" });
    const { [failedAnnotation]: failed, ...rest } = lease.metadata?.annotations ?? {};
    if (failed === undefined) return true;
    await api.replaceNamespacedLease({ name, namespace: "kube-system", body: { ...lease, metadata: { ...lease.metadata, annotations: rest } } });
    return undefined;
  }, 30_000, 200);
}

/** The node's agent killed with SIGKILL (by its main PID); resolves once systemd started it again (Date.now() when the new MainPID was seen). */
async function killAgent(w: Worker): Promise<{ pid: number; killedAt: number; restartedAt: number }> {
  const pid = await mainPid(w.bare, agentUnit);
  expect(pid).toBeGreaterThan(1);
  const restarts = Number(await unitProperty(w.bare.node, agentUnit, "NRestarts"));
  await w.bare.node.execOk(["kill", "-9", String(pid)]);
  const killedAt = Date.now();
  const restartedAt = await waitFor(`${w.bare.name}: the agent started again by systemd`, async () => {
    const now = await mainPid(w.bare, agentUnit);
    return now > 1 && now !== pid ? Date.now() : undefined;
  }, 60_000, 100);
  expect(Number(await unitProperty(w.bare.node, agentUnit, "NRestarts"))).toBe(restarts + 1);
  return { pid, killedAt, restartedAt };
}

/**
 * After `bad` failed its gate on `failed`: it is back on `good` (rolled back: the drop-in gone, kubelet
 * running, the Node Ready and naming `good`) and gave the slot back; the others were stopped — told so,
 * never admitted, kubelet never restarted, still on `good`. Blast radius one node.
 */
async function rolledBackAlone(failed: Worker, bad: string, good: string, since: number, starts: number[]): Promise<void> {
  // RolledBack when it gives the slot back, Blocked as soon as its OSC controller looks again (at once: it is told).
  await waitFor(`${failed.bare.name}: rolled back and healthy`, async () => (["RolledBack", "Blocked"].includes((await rolloutCondition(failed))?.reason ?? "") ? true : undefined), 180_000, 250);
  await waitFor("the slot given back", () => (record().latest().holders.length === 0 ? true : undefined), 60_000, 250);
  expect(await unitProperty(failed.bare.node, "kubelet.service", "ActiveState")).toBe("active");
  expect(await hasDropIn(failed)).toBe(false);
  expect(ready(await readNode(failed.bare))?.status).toBe("True");
  await waitApplied(failed.bare, good, 60_000, 250);
  for (const w of workers.filter((w) => w !== failed)) {
    await waitFor(`${w.bare.name}: rollout stopped`, async () => ((await rolloutCondition(w))?.reason === "RolloutStopped" ? true : undefined), 120_000, 250);
    expect(await applied(w)).toBe(good);
    expect(await kubeletStart(w)).toBe(starts[workers.indexOf(w)] as number);
    expect(await hasDropIn(w)).toBe(false);
  }
  // One node (a failure it could not see is tried once more on it: two hold periods, the same node).
  expect([...new Set(record().holdPeriods(since).map((p) => p.node))]).toEqual([failed.bare.name]);
  expect(record().latest().failed).toMatchObject({ revision: bad, node: failed.bare.name });
}

describe("fleet rollouts under faults on three real kubelets (max-disrupted 1, rollback)", () => {
  // Item 9: "non-disruptive" was too narrow: a file a running process reads without a unit restart (a static
  // pod manifest, hosts.toml, the CNI config) reached every node at once, outside windows and ungated.
  test("item 9: a change that only writes a file containerd reads live (a hosts.toml) passes through the nodes one at a time, each gated", async () => {
    const settle = 5_000;
    const since = Date.now();
    const starts = await Promise.all(workers.map(kubeletStart));
    const checksum = await put(await rendered({ liveFile: true }), settings("5s", "60s"));
    for (const w of workers) await waitApplied(w.bare, checksum, 180_000, 250);
    await gatesPassed(checksum, 60_000);

    const periods = record().holdPeriods(since);
    console.log(`[rollout-faults] item 9: slot held by ${timeline(periods, since)}`);
    expect(periods.map((p) => p.node).sort()).toEqual(workers.map((w) => w.bare.name).sort());
    expect(periods.every((p) => p.revision === checksum)).toBe(true);
    expect(record().maxHolders(since)).toBe(1);
    expectOneAtATime(periods);
    for (const [i, w] of workers.entries()) {
      const { from, to } = periods.find((p) => p.node === w.bare.name) as HoldPeriod;
      // Written while this node held the slot (mtime has whole seconds), and the slot kept for the settle time after.
      const written = Number(await w.bare.node.execOk(["stat", "-c", "%Y", liveFilePath])) * 1000;
      expect(written).toBeGreaterThanOrEqual(Math.floor(from / 1000) * 1000 - 1000);
      expect(written).toBeLessThanOrEqual(to);
      expect(to - written).toBeGreaterThanOrEqual(settle - 1000);
      const passed = await hasEvent(w, "RolloutHealthGatePassed", short(checksum));
      expect(passed?.message).toContain(liveFilePath);
      // The file alone was the disruption: kubelet was not restarted.
      expect(await kubeletStart(w)).toBe(starts[i] as number);
    }
  }, 400_000);

  // Item 3: the slot leaked for ever when the next OSC was non-disruptive for its holder (pushed during the
  // settle time; a fix that touches only a file no unit lists): the old gate was never settled, and with k = 1
  // the pool's rollouts stopped.
  test("item 3: a change pushed during the holder's settle time that restarts nothing on it: the slot still goes back after the settle time, and the rollout goes on", async () => {
    const settle = 15_000;
    const policy = settings("15s", "60s");
    const since = Date.now();
    const starts = await Promise.all(workers.map(kubeletStart));
    const a = await put(await rendered({ liveFile: true, maxPods: 61 }), policy);
    const holder = byName((await firstHolder(since)).node);
    await waitApplied(holder.bare, a, 120_000, 50);
    // In its settle time now (applied, the gate needs 15 s of health): the next change is only a file no unit lists.
    expect(record().latest().holders.map((h) => h.node)).toEqual([holder.bare.name]);
    const pushedAt = Date.now();
    const b = await put(await rendered({ liveFile: true, maxPods: 61, extraFile: "pushed during the settle time (item 3)\n" }), policy);
    for (const w of workers) await waitApplied(w.bare, b, 240_000, 250);
    await gatesPassed(b, 120_000);

    const periods = record().holdPeriods(since);
    console.log(`[rollout-faults] item 3: second change pushed at ${((pushedAt - since) / 1000).toFixed(1)} s; slot held by ${timeline(periods, since)}`);
    const held = periods.find((p) => p.node === holder.bare.name) as HoldPeriod;
    // It held the slot when the change came, and gave it back, a settle time after it (the gate started over).
    expect(held.from).toBeLessThan(pushedAt);
    expect(held.to).toBeGreaterThan(pushedAt);
    expect(held.to - pushedAt).toBeGreaterThanOrEqual(settle);
    expect(held.revision).toBe(a);
    // Then the others, one at a time, with the newer change (which restarts kubelet there).
    expect(periods.map((p) => p.node).sort()).toEqual(workers.map((w) => w.bare.name).sort());
    expect(periods.filter((p) => p !== held).every((p) => p.revision === b && p.from >= held.to)).toBe(true);
    expect(record().maxHolders(since)).toBe(1);
    expectOneAtATime(periods);
    for (const [i, w] of workers.entries()) expect(await kubeletStart(w)).toBeGreaterThan(starts[i] as number);
    // On the holder the file restarted nothing: its kubelet still the one started for the first change, within its hold.
    expect(await kubeletStart(holder)).toBeLessThan(pushedAt);
    expect(await holder.bare.node.readFile("/etc/e2e/unrelated")).toBe("pushed during the settle time (item 3)\n");
  }, 500_000);

  // Item 2: a disruptive apply that did not finish on its first try escaped its gate and rollback: the retry
  // was classified from disk after the files were checkpointed, so it restarted nothing "disruptive", never
  // timed out, never rolled back, and kept its slot.
  test("item 2: an apply whose kubelet restart keeps failing stays under its gate: it fails at the health timeout, is recorded, rolls back; the others never apply it", async () => {
    const timeout = 20_000;
    const good = await applied(first());
    for (const w of workers) expect(await applied(w)).toBe(good);
    const since = Date.now();
    const starts = await Promise.all(workers.map(kubeletStart));
    const bad = await put(await rendered({ liveFile: true, maxPods: 61, extraFile: "pushed during the settle time (item 2)\n", brokenKubelet: true }), settings("5s", "20s"));
    const failed = byName((await firstHolder(since)).node);
    const others = workers.filter((w) => w !== failed);

    const gateFailed = await waitFor(`${failed.bare.name}: RolloutHealthGateFailed`, () => hasEvent(failed, "RolloutHealthGateFailed", short(bad)), 120_000, 250);
    // The apply never completed: the gate failed on it, at the health timeout counted from the grant.
    console.log(`[rollout-faults] item 2: ${failed.bare.name}: ${gateFailed.message}`);
    expect(gateFailed.message).toContain("apply: ");
    expect(gateFailed.message).toContain("kubelet.service");
    const recorded = await waitFor("the failure on the pool's record", () => record().versions().find((v) => v.at >= since && v.record.failed?.revision === bad), 30_000, 100);
    expect(recorded.record.failed?.node).toBe(failed.bare.name);
    const hold = record().holdPeriods(since)[0] as HoldPeriod;
    expect(recorded.at - hold.from).toBeGreaterThanOrEqual(timeout - 1000);
    // Never applied as a whole: the Node never carried it.
    expect(await applied(failed)).toBe(good);

    // Rolled back: the last good OSC again (the drop-in gone, kubelet running), its gate passed, the slot free.
    const rolledBack = await waitFor(`${failed.bare.name}: RolloutRolledBack`, () => hasEvent(failed, "RolloutRolledBack", short(bad)), 60_000, 250);
    expect(rolledBack.message).toContain(`going back to the last good OSC ${short(good as string)}`);
    // RolledBack when it gives the slot back, Blocked as soon as its OSC controller looks again (at once: it is told).
    await waitFor(`${failed.bare.name}: rolled back and healthy`, async () => (["RolledBack", "Blocked"].includes((await rolloutCondition(failed))?.reason ?? "") ? true : undefined), 120_000, 250);
    await waitFor("the slot given back", () => (record().latest().holders.length === 0 ? true : undefined), 30_000, 250);
    expect(await unitProperty(failed.bare.node, "kubelet.service", "ActiveState")).toBe("active");
    expect((await failed.bare.node.exec(["test", "-e", `/etc/systemd/system/kubelet.service.d/${brokenDropIn.name}`])).code).not.toBe(0);
    expect(ready(await readNode(failed.bare))?.status).toBe("True");

    // The others were stopped: never admitted, never restarted, still on the last good OSC.
    for (const w of others) {
      await waitFor(`${w.bare.name}: rollout stopped`, async () => ((await rolloutCondition(w))?.reason === "RolloutStopped" ? true : undefined), 120_000, 250);
      expect(await applied(w)).toBe(good);
      expect(await kubeletStart(w)).toBe(starts[workers.indexOf(w)] as number);
      expect((await w.bare.node.exec(["test", "-e", `/etc/systemd/system/kubelet.service.d/${brokenDropIn.name}`])).code).not.toBe(0);
    }
    expect(record().holdPeriods(since).map((p) => p.node)).toEqual([failed.bare.name]);
    expect(record().latest().failed).toMatchObject({ revision: bad, node: failed.bare.name });
  }, 400_000);

  // Item 1: a holder's Node still shows Ready with the slot's OSC for the grace period before the node
  // lifecycle controller marks it Unknown, so a node that died during its settle time let the next node take
  // the same change. A holder that stops answering keeps its slot, however its Node and its Leases look.
  test("item 1: a holder frozen during its settle time (kubelet and agent SIGSTOPped) keeps the slot, after its Node is Unknown and long after its Leases expired; resumed, it finishes and the pool goes on", async () => {
    const policy = settings("20s", "10m");
    const since = Date.now();
    const change = await put(await rendered({ liveFile: true, maxPods: 62, extraFile: "pushed during the settle time (item 1)\n" }), policy);
    const holder = byName((await firstHolder(since)).node);
    const others = workers.filter((w) => w !== holder);
    await waitApplied(holder.bare, change, 120_000, 50);
    // Applied, its gate (20 s of health) running: the node dies now, as a machine that hangs.
    const frozen = { kubelet: await mainPid(holder.bare, "kubelet.service"), agent: await mainPid(holder.bare, "gardener-node-agent.service") };
    expect(frozen.kubelet).toBeGreaterThan(1);
    expect(frozen.agent).toBeGreaterThan(1);
    const signal = (sig: "STOP" | "CONT") => holder.bare.node.execOk(["kill", `-${sig}`, String(frozen.kubelet), String(frozen.agent)]);
    await signal("STOP");
    const frozenAt = Date.now();
    try {
      expect(record().latest().holders.map((h) => h.node)).toEqual([holder.bare.name]);
      // kube-controller-manager's node lifecycle controller marks the Node Unknown after its grace period.
      const unknownAt = await watchUntil<V1Node, number>(world.cluster.admin(), `${holder.bare.name} Ready=Unknown`, "/api/v1/nodes", holder.bare.name, (n) => (ready(n)?.status === "Unknown" ? Date.now() : undefined), {
        timeoutMs: 180_000,
        describe: (n) => JSON.stringify(ready(n)),
      });
      // When the agent's own Lease and kubelet's ran out (each 40 s, renewed every 10 s; this host's clock wrote both renewals).
      const leases = await Promise.all([readLease("kube-system", `gardener-node-agent-${holder.bare.name}`), readLease("kube-node-lease", holder.bare.name)]);
      const expiredBy = Math.max(...leases.map((l) => Date.parse(String(l.spec?.renewTime)) + (l.spec?.leaseDurationSeconds ?? 0) * 1000));
      // Watched for a further minute past both: the slot stays the frozen holder's.
      const until = Math.max(unknownAt, expiredBy) + 60_000;
      await waitFor("a minute past the Node's Unknown and its Leases' expiry, no other node admitted", () => {
        const intruder = record().holdPeriods(since).find((p) => p.node !== holder.bare.name);
        if (intruder) throw new Error(`${intruder.node} was admitted while the holder was frozen`);
        return Date.now() >= until ? true : undefined;
      }, until - Date.now() + 10_000, 500);
      expect(record().holdPeriods(since).map((p) => p.node)).toEqual([holder.bare.name]);
      expect(record().holdPeriods(since)[0]?.to).toBe(Number.POSITIVE_INFINITY);
      for (const w of others) expect(await applied(w)).not.toBe(change);
      console.log(`[rollout-faults] item 1 (agent's WatchdogUSec ${await unitProperty(holder.bare.node, "gardener-node-agent.service", "WatchdogUSec")}): frozen ${((Date.now() - frozenAt) / 1000).toFixed(0)} s, Node Unknown after ${((unknownAt - frozenAt) / 1000).toFixed(0)} s, its Leases expired ${((Date.now() - expiredBy) / 1000).toFixed(0)} s ago: still the only holder`);
    } finally {
      await signal("CONT");
    }
    // Back: its gate passes, the slot goes back, and the others follow one at a time.
    for (const w of others) await waitApplied(w.bare, change, 240_000, 250);
    await gatesPassed(change, 120_000);
    const periods = record().holdPeriods(since);
    console.log(`[rollout-faults] item 1: slot held by ${timeline(periods, since)}`);
    expect(periods[0]?.node).toBe(holder.bare.name);
    expect(periods.map((p) => p.node).sort()).toEqual(workers.map((w) => w.bare.name).sort());
    expect(record().maxHolders(since)).toBe(1);
    expectOneAtATime(periods);
  }, 600_000);

  // Item 5a: a change after which the holder cannot reach the API server (a bad network setting would do it;
  // here the test plays its part: it cuts the node's network to the API server whenever the change runs
  // there, and mends it when the node runs its last good OSC again). The gate's decisive look reads the Node
  // from the API server and fails. Only the rollback can bring such a node back, so it rolls back at once,
  // cut off as it is, and tells the pool once it can. A node that cannot see itself cannot tell the change's
  // fault from a partition's, so it tries the change once more after its rollback passed: cut off again, the
  // failure is final. Radius 1: the same node twice, nobody else.
  test("item 5a: a change that cuts the holder off from the API server: the gate fails, it rolls back while cut off, the failure is recorded once the network is back; tried once more on the same node, it fails for good; the others never apply it", async () => {
    const good = await poolAtRest();
    await resumeRollout();
    const goodMaxPods = await maxPodsOf(first());
    expect(Number.isInteger(goodMaxPods) && goodMaxPods !== 63).toBe(true);
    const since = Date.now();
    const starts = await Promise.all(workers.map(kubeletStart));
    const bad = await put(await rendered({ liveFile: true, maxPods: 63, extraFile: "pushed during the settle time (item 5a)\n" }), settings("10s", "40s"));
    const hold = await firstHolder(since);
    const holder = byName(hold.node);
    const apiPorts = [...new Set(workers.map((w) => Number(new URL(w.bare.server).port)))];
    /** One run of the change on the holder: applied, kubelet Ready with it, then cut off; back on the last good OSC while cut off, then mended. */
    const cutOffByTheChange = async (after: number) => {
      await waitFor(`${holder.bare.name}: runs ${short(bad)}`, async () => ((await agentState(holder)).lastApplied?.checksum === bad ? true : undefined), 180_000, 50);
      const appliedAt = Date.now();
      // In its gate: the new kubelet reports the Node Ready (the gate's looks see it healthy). Then the network goes.
      const restarted = await waitFor(`${holder.bare.name}: kubelet restarted with ${short(bad)}`, async () => {
        const at = await kubeletStart(holder);
        return at > after ? at : undefined;
      }, 60_000, 250);
      await readyAgain(holder, 0, restarted);
      const cut = await cutOff(holder.bare.node, bridgeHostIp, apiPorts);
      try {
        // Rolled back while cut off, as seen inside the node: its agent applied the last good OSC again (kubelet
        // started anew after the cut, with the good configuration).
        const rolledBackAt = await waitFor(`${holder.bare.name}: rolled back to ${short(good)} while cut off from the API server`, async () => {
          const [state, rollout] = await Promise.all([agentState(holder), nodeRollout(holder)]);
          if (state.lastApplied?.checksum !== good || rollout.current?.rollbackTo?.checksum !== good || rollout.current.work.checksum !== bad) return undefined;
          return (await kubeletStart(holder)) > cut.at ? Date.now() : undefined;
        }, 180_000, 250);
        expect(await maxPodsOf(holder)).toBe(goodMaxPods);
        // Nobody else was admitted meanwhile.
        expect([...new Set(record().holdPeriods(since).map((p) => p.node))]).toEqual([holder.bare.name]);
        return { appliedAt, cutAt: cut.at, rolledBackAt, healedAt: await cut.heal() };
      } catch (err) {
        // What the agent did while cut off (its Lease renewals' failures left out), and where its rollout stands.
        const journal = await holder.bare.node.exec(["journalctl", "--no-pager", "-o", "short-precise", "-u", agentUnit, "--since", "-4min"]);
        console.error(`${holder.bare.name}'s agent while cut off:\n${journal.stdout.split("\n").filter((l) => !l.includes("could not renew the Lease")).slice(-40).join("\n")}\nits rollout state: ${JSON.stringify((await nodeRollout(holder)).current)}`);
        throw err;
      } finally {
        await cut.heal();
      }
    };
    const once = await cutOffByTheChange(starts[workers.indexOf(holder)] as number);
    // Back on the network: the failure is on the pool's record, naming the revision, the node and the check.
    const recorded = await waitFor("the failure on the pool's record", () => record().versions().find((v) => v.at >= since && v.record.failed?.revision === bad), 180_000, 100);
    expect(recorded.at).toBeGreaterThanOrEqual(once.healedAt);
    expect(recorded.record.failed?.node).toBe(holder.bare.name);
    expect(recorded.record.failed?.failure).toContain("Node");
    // Its rollback passed: the slot goes back, and the node asks for the change again; only it is admitted.
    const twice = await cutOffByTheChange(once.rolledBackAt);
    await rolledBackAlone(holder, bad, good, since, starts);
    expect(await maxPodsOf(holder)).toBe(goodMaxPods);
    const periods = record().holdPeriods(since);
    expect(periods.map((p) => p.node)).toEqual([holder.bare.name, holder.bare.name]);
    console.log(
      `[rollout-faults] item 5a: ${holder.bare.name} granted at 0 s, applied ${secs(hold.from, once.appliedAt)}, cut off ${secs(hold.from, once.cutAt)}, rolled back while cut off ${secs(hold.from, once.rolledBackAt)} (${secs(once.cutAt, once.rolledBackAt)} after the cut), network back ${secs(hold.from, once.healedAt)}, failure recorded ${secs(once.healedAt, recorded.at)} after that; tried again at ${secs(hold.from, (periods[1] as HoldPeriod).from)}, cut off ${secs(hold.from, twice.cutAt)}, rolled back ${secs(hold.from, twice.rolledBackAt)}, slot back for good ${secs(hold.from, (periods[1] as HoldPeriod).to)}; failure: ${record().latest().failed?.failure}`,
    );
  }, 900_000);

  // Item 5b: an agent that dies during its gate (a crash, the OOM killer) is started again by systemd and takes
  // the gate up where it was: its timeout counts from the grant on the boot clock, so a crash loop can never
  // start it over and keep a bad change from failing.
  test("item 5b: the holder's agent killed (SIGKILL) during its gate: systemd starts it again, the gate's timeout still counts from the grant, it fails, is recorded, rolls back; the others never apply the change", async () => {
    const timeout = 30_000;
    const good = await poolAtRest();
    await resumeRollout();
    const since = Date.now();
    const starts = await Promise.all(workers.map(kubeletStart));
    const bad = await put(await rendered({ liveFile: true, maxPods: 64, extraFile: "pushed during the settle time (item 5b)\n", brokenKubelet: true }), settings("5s", "30s"));
    const hold = await firstHolder(since);
    const holder = byName(hold.node);
    // A third of the way into its gate, the bad change under way (the broken drop-in written, kubelet's restart
    // failing and retried): the agent dies.
    await waitFor(`${holder.bare.name}: ${timeout / 3000} s into its gate with the change under way`, async () => (Date.now() - hold.from >= timeout / 3 && (await hasDropIn(holder)) ? true : undefined), 120_000, 250);
    const kill = await killAgent(holder);
    const recorded = await waitFor("the failure on the pool's record", () => record().versions().find((v) => v.at >= since && v.record.failed?.revision === bad), 120_000, 100);
    expect(recorded.record.failed?.node).toBe(holder.bare.name);
    expect(recorded.record.failed?.failure).toContain("kubelet.service");
    // At the timeout counted from the grant: not before it, and long before a timeout started over by the
    // restarted agent could end.
    expect(recorded.at - hold.from).toBeGreaterThanOrEqual(timeout - 1000);
    expect(recorded.at).toBeLessThan(kill.restartedAt + timeout - 2000);
    const rolledBack = await waitFor(`${holder.bare.name}: RolloutRolledBack`, () => hasEvent(holder, "RolloutRolledBack", short(bad)), 60_000, 250);
    expect(rolledBack.message).toContain(`going back to the last good OSC ${short(good)}`);
    await rolledBackAlone(holder, bad, good, since, starts);
    // The agent that finished the gate is the one systemd started after the kill.
    expect(await mainPid(holder.bare, agentUnit)).not.toBe(kill.pid);
    const slotBack = (record().holdPeriods(since)[0] as HoldPeriod).to;
    console.log(
      `[rollout-faults] item 5b: ${holder.bare.name} granted at 0 s, agent killed ${secs(hold.from, kill.killedAt)}, running again ${secs(hold.from, kill.restartedAt)}, failure recorded ${secs(hold.from, recorded.at)} (health timeout ${timeout / 1000} s), slot back ${secs(hold.from, slotBack)}; failure: ${recorded.record.failed?.failure}`,
    );
  }, 400_000);

  // Item 5c: a node waiting for the slot whose agent restarts must come back waiting: its request stands, it
  // applies nothing without a grant, and it learns that the revision stopped from the leader's word on its
  // ticket, however long it was away. The one restarted is the pool's leader if a waiting node leads it (a
  // killed leader's Lease is taken over only after a lease duration).
  test("item 5c: a waiting node's agent killed (SIGKILL) behind the holder: it comes back still waiting, is told the revision stopped once the holder's failure is recorded, and never applies it", async () => {
    const good = await poolAtRest();
    await resumeRollout();
    const since = Date.now();
    const starts = await Promise.all(workers.map(kubeletStart));
    const bad = await put(await rendered({ liveFile: true, maxPods: 65, extraFile: "pushed during the settle time (item 5c)\n", brokenKubelet: true }), settings("5s", "30s"));
    const hold = await firstHolder(since);
    const holder = byName(hold.node);
    const others = workers.filter((w) => w !== holder);
    for (const w of others) {
      await waitFor(`${w.bare.name}: waiting for the slot`, async () => {
        const c = await rolloutCondition(w);
        return c?.reason === "WaitingForSlot" && c.message?.includes(short(bad)) ? true : undefined;
      }, 60_000, 250);
    }
    const leader = (await readLease("kube-system", leaderLeaseName(first().secretName)).catch(() => undefined))?.spec?.holderIdentity;
    const waiter = others.find((w) => w.bare.name === leader) ?? (others[0] as Worker);
    const kill = await killAgent(waiter);
    // Back and still waiting: the restarted agent's own status board says so, before the holder's gate ended.
    const back = await waitFor(`${waiter.bare.name}: the restarted agent waits for the slot`, async () => {
      const status = await agentStatus(waiter);
      return Date.parse(status.startedAt) >= kill.killedAt - 1000 && status.components.rollout?.summary.startsWith(`waiting OSC ${short(bad)}`) ? Date.now() : undefined;
    }, 60_000, 250);
    expect(record().latest().failed?.revision).not.toBe(bad);
    expect(await applied(waiter)).toBe(good);
    expect(await hasDropIn(waiter)).toBe(false);
    const recorded = await waitFor("the failure on the pool's record", () => record().versions().find((v) => v.at >= since && v.record.failed?.revision === bad), 120_000, 100);
    expect(recorded.record.failed?.node).toBe(holder.bare.name);
    // Told: the leader's word on its ticket, shown on its Node.
    const toldAt = await waitFor(`${waiter.bare.name}: told the rollout stopped`, async () => {
      const c = await rolloutCondition(waiter);
      return c?.reason === "RolloutStopped" && c.message?.includes(short(bad)) ? Date.now() : undefined;
    }, 120_000, 250);
    await rolledBackAlone(holder, bad, good, since, starts);
    expect(await mainPid(waiter.bare, agentUnit)).not.toBe(kill.pid);
    console.log(
      `[rollout-faults] item 5c: ${holder.bare.name} granted at 0 s; ${waiter.bare.name} (${waiter.bare.name === leader ? "the pool's leader" : `not the leader; the leader: ${leader ?? "none"}`}) killed ${secs(hold.from, kill.killedAt)}, running again ${secs(hold.from, kill.restartedAt)}, waiting again ${secs(hold.from, back)}; failure recorded ${secs(hold.from, recorded.at)}, ${waiter.bare.name} told ${secs(recorded.at, toldAt)} after that`,
    );
  }, 400_000);
});

const readLease = (namespace: string, name: string) => world.cluster.admin().makeApiClient(CoordinationV1Api).readNamespacedLease({ name, namespace });
