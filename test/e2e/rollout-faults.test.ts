// Fleet rollouts under faults, with real kubelets: issue 19's "Found already" items 1, 2, 3 and 9, each a
// regression test. Three bare machines brought up by the compiled trellis with the OSC Gardener renders for
// one pool (test/harness/worker.ts), a disruption budget of one node and rollback; the pool's record
// `<secret>-slots` is watched from the start, so who held the slot when is known from its versions.
// The tests build on each other: the first one's gated change is every node's last good OSC, the rollback
// target of the third.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { CoordinationV1Api, type V1Node } from "@kubernetes/client-node";
import { parse, stringify } from "yaml";
import { rolloutKeys } from "../../src/api/rollout.ts";
import { rolloutConditionType } from "../../src/controllers/rollout/report.ts";
import { mainPid, nodeEvents, putOscSecret, readNode, unitProperty, waitApplied } from "../harness/agent.ts";
import { waitFor } from "../harness/exec.ts";
import { type HoldPeriod, type PoolRecordWatch, watchPoolRecord } from "../harness/pool-record.ts";
import { watchUntil } from "../harness/watch.ts";
import { workerOsc, type WorkerOscInput } from "../harness/worker-osc.ts";
import { bringUpWorker, startWorkerWorld, type Worker, type WorkerWorld } from "../harness/worker.ts";

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

/** A static pod kubelet would run (Gardener's staticPodPath): the kind of file a running process reads without a restart. */
const manifestPath = "/etc/kubernetes/manifests/e2e-static.yaml";
/** Breaks kubelet's start: its restart fails (systemd's job ends "failed"), so an apply that restarts it never completes. */
const brokenDropIn = { name: "50-e2e-broken.conf", content: "[Service]\nExecStartPre=/bin/false\n" };

type Change = Partial<Pick<WorkerOscInput, "maxPods" | "extraFile">> & { manifest?: boolean; brokenKubelet?: boolean };

/** The pool's OSC as Gardener renders it, with `c`'s changes (an OS extension would add such files and drop-ins). */
async function rendered(c: Change): Promise<string> {
  const { maxPods, extraFile } = c;
  const osc = (await workerOsc({ ...first().input, ...(maxPods ? { maxPods } : {}), ...(extraFile ? { extraFile } : {}) })).osc;
  if (!c.manifest && !c.brokenKubelet) return osc;
  const doc = parse(osc);
  if (c.manifest) {
    const pod = { apiVersion: "v1", kind: "Pod", metadata: { name: "e2e-static", namespace: "kube-system" }, spec: { hostNetwork: true, containers: [{ name: "pause", image: world.images.pause }] } };
    doc.spec.files.push({ path: manifestPath, permissions: 0o644, content: { inline: { data: stringify(pod) } } });
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

describe("fleet rollouts under faults on three real kubelets (max-disrupted 1, rollback)", () => {
  // Item 9: "non-disruptive" was too narrow: a file a running process reads without a unit restart (a static
  // pod manifest, hosts.toml, the CNI config) reached every node at once, outside windows and ungated.
  test("item 9: a change that only writes a static pod manifest passes through the nodes one at a time, each gated", async () => {
    const settle = 5_000;
    const since = Date.now();
    const starts = await Promise.all(workers.map(kubeletStart));
    const checksum = await put(await rendered({ manifest: true }), settings("5s", "60s"));
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
      const written = Number(await w.bare.node.execOk(["stat", "-c", "%Y", manifestPath])) * 1000;
      expect(written).toBeGreaterThanOrEqual(Math.floor(from / 1000) * 1000 - 1000);
      expect(written).toBeLessThanOrEqual(to);
      expect(to - written).toBeGreaterThanOrEqual(settle - 1000);
      const passed = await hasEvent(w, "RolloutHealthGatePassed", short(checksum));
      expect(passed?.message).toContain(manifestPath);
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
    const a = await put(await rendered({ manifest: true, maxPods: 61 }), policy);
    const holder = byName((await firstHolder(since)).node);
    await waitApplied(holder.bare, a, 120_000, 50);
    // In its settle time now (applied, the gate needs 15 s of health): the next change is only a file no unit lists.
    expect(record().latest().holders.map((h) => h.node)).toEqual([holder.bare.name]);
    const pushedAt = Date.now();
    const b = await put(await rendered({ manifest: true, maxPods: 61, extraFile: "pushed during the settle time\n" }), policy);
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
    expect(await holder.bare.node.readFile("/etc/e2e/unrelated")).toBe("pushed during the settle time\n");
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
    const bad = await put(await rendered({ manifest: true, maxPods: 61, extraFile: "pushed during the settle time\n", brokenKubelet: true }), settings("5s", "20s"));
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
    await waitFor(`${failed.bare.name}: rolled back and healthy`, async () => ((await rolloutCondition(failed))?.reason === "RolledBack" ? true : undefined), 120_000, 250);
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
    const change = await put(await rendered({ manifest: true, maxPods: 62, extraFile: "pushed during the settle time\n" }), policy);
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
});

const readLease = (namespace: string, name: string) => world.cluster.admin().makeApiClient(CoordinationV1Api).readNamespacedLease({ name, namespace });
