// Fleet rollouts with real kubelets: three bare machines brought up by the compiled trellis with the OSC
// Gardener renders for one pool (test/harness/worker.ts), then the pool's Secret gets a disruption budget
// of one node, a short settle time and rollback (rollout.trellis.dev/ annotations).
// - A bad setting is refused on every node, naming it, and nothing changes; a count above the pool's size
//   is the pool (an autoscaled pool below its count still updates).
// - A good change of kubelet's configuration walks through the three nodes one at a time: each node's
//   kubelet restarts only while it holds the one slot, and gives it back only once its Node is Ready
//   again as the new kubelet reports it (every version of the pool's record `<secret>-slots`, from a watch).
// - A change that breaks kubelet (failCgroupV1: true, which kubelet refuses on this cgroup v1 host) stops
//   at the first node: its gate fails, it rolls back and is Ready again on the last good OSC; the other
//   two never restart kubelet and say the rollout is stopped; `trellis rollout status` shows it.
// - A fixed change goes on through all three.
// - Selection and windows: a paused node and nodes outside the canary selector take nothing new; outside
//   every maintenance window a change that restarts nothing goes at once, one that restarts kubelet waits.
// - Requested kubelet restarts (worker.gardener.cloud/restart-systemd-services) on two nodes at once go
//   through the same budget: one after the other.
// - Layering: an overlay of rank node in the same Secret changes kubelet's maxPods on the labelled node
//   only (its Node's capacity says so), and on a second node once that is labelled too; `trellis plan
//   --labels` names every entry's layer.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { Buffer } from "node:buffer";
import { mkdirSync, mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { parse, stringify } from "yaml";
import { CoreV1Api, PatchStrategy, setHeaderOptions } from "@kubernetes/client-node";
import { pausedLabel, rolloutKeys } from "../../src/api/rollout.ts";
import { rolloutConditionType } from "../../src/controllers/rollout/report.ts";
import { nodeEvents, putOscSecret, readNode, unitProperty, waitApplied } from "../harness/agent.ts";
import { upstream } from "../harness/bare-node.ts";
import { trellisBinary } from "../harness/binary.ts";
import { mirrorHostsToml } from "../harness/kubelet-config.ts";
import { type HoldPeriod, type PoolRecordWatch, watchPoolRecord } from "../harness/pool-record.ts";
import { run, runOk, waitFor } from "../harness/exec.ts";
import { workerOsc } from "../harness/worker-osc.ts";
import { bringUpWorker, startWorkerWorld, type Worker, type WorkerWorld } from "../harness/worker.ts";

let world: WorkerWorld;
const workers: Worker[] = [];
const settings = { [rolloutKeys.maxDisrupted]: "1", [rolloutKeys.settleTime]: "5s", [rolloutKeys.healthTimeout]: "40s", [rolloutKeys.rollback]: "true" };
/** Every version of the pool's record, with the host's wall clock when it arrived. */
let pool: PoolRecordWatch | undefined;

beforeAll(async () => {
  world = await startWorkerWorld();
  for (let i = 0; i < 3; i++) workers.push(await bringUpWorker(world, `roll${i}`));
  pool = watchPoolRecord(world.cluster.admin(), first().secretName);
}, 600_000);

afterAll(async () => {
  pool?.stop();
  for (const w of workers) await w.bare.stop();
  await world?.stop();
}, 120_000);

const first = () => workers[0] as Worker;
const put = (osc: string, annotations: Record<string, string>) => putOscSecret(world.cluster, first().secretName, osc, annotations);
const rendered = async (changes: Parameters<typeof workerOsc>[0] extends infer T ? Partial<T> : never) => (await workerOsc({ ...first().input, ...changes })).osc;
const kubeletStart = async (w: Worker) => Number(await unitProperty(w.bare.node, "kubelet.service", "ExecMainStartTimestamp").then((t) => Date.parse(t)));
const rolloutCondition = async (w: Worker) => (await readNode(w.bare)).status?.conditions?.find((c) => c.type === rolloutConditionType);

const record = () => pool as PoolRecordWatch;
/** Who held the slot since `since`, from the record's watched versions, in wall-clock ms. */
const holdPeriods = (since: number): HoldPeriod[] => record().holdPeriods(since);

describe("fleet rollouts on three real kubelets (max-disrupted 1, settle 5 s, rollback)", () => {
  let goodChecksum = "";

  test("bad settings are refused on every node, naming the annotation; nothing changes", async () => {
    const osc = await rendered({});
    const starts = await Promise.all(workers.map(kubeletStart));
    await put(osc, { ...settings, [rolloutKeys.windows]: "Mon-Fri 22:00-06:00 Europe/Atlantis" });
    for (const w of workers) {
      const e = await waitFor(`${w.bare.name}: OSCInvalid`, async () => (await nodeEvents(w.bare)).find((x) => x.reason === "OSCInvalid" && x.message?.includes(rolloutKeys.windows)), 60_000, 250);
      expect(e.message).toContain('"Europe/Atlantis" is not a time zone');
    }
    expect(await Promise.all(workers.map(kubeletStart))).toEqual(starts);
    // More nodes than the pool has: as many as the pool has (an autoscaled pool below its count must still
    // update), so the change reaches every node.
    const tooMany = await put(await rendered({ maxPods: 65 }), { ...settings, [rolloutKeys.maxDisrupted]: "4" });
    for (const w of workers) await waitApplied(w.bare, tooMany, 180_000);
    // Valid settings again: the pool settles on the OSC (rendered as node 0 reaches the API server).
    const settled = await put(osc, settings);
    for (const w of workers) await waitApplied(w.bare, settled, 180_000);
    await waitFor("every slot free", () => (record().latest().holders.length === 0 ? true : undefined), 120_000, 250);
  }, 400_000);

  test("a good change walks through the pool one node at a time, each slot given back only after the node is Ready again", async () => {
    const since = Date.now();
    const before = await Promise.all(workers.map(kubeletStart));
    goodChecksum = await put(await rendered({ maxPods: 60 }), settings);
    for (const w of workers) await waitApplied(w.bare, goodChecksum, 180_000);
    // Each gate passes (the last one's release follows its annotation).
    for (const w of workers) await waitFor(`${w.bare.name}: gate passed`, async () => ((await rolloutCondition(w))?.reason === "HealthGatePassed" ? true : undefined), 60_000, 250);
    const periods = holdPeriods(since);
    expect(periods.map((p) => p.node).sort()).toEqual(workers.map((w) => w.bare.name).sort());
    expect(periods.every((p) => p.revision === goodChecksum)).toBe(true);
    for (let i = 1; i < periods.length; i++) expect((periods[i] as HoldPeriod).from).toBeGreaterThanOrEqual((periods[i - 1] as HoldPeriod).to);
    for (const [i, w] of workers.entries()) {
      const restarted = await kubeletStart(w);
      expect(restarted).toBeGreaterThan(before[i] as number);
      const { from, to } = periods.find((p) => p.node === w.bare.name) as HoldPeriod;
      // kubelet restarted while this node held the slot (1 s: the watch's delivery and the second-precision of systemd's timestamp)…
      expect(restarted).toBeGreaterThanOrEqual(from - 1000);
      expect(restarted).toBeLessThanOrEqual(to);
      // …and the slot went back only after the settle time with the new kubelet running.
      expect(to - restarted).toBeGreaterThanOrEqual(5000);
      const passed = (await nodeEvents(w.bare)).find((e) => e.reason === "RolloutHealthGatePassed" && e.message?.includes(goodChecksum.slice(0, 12)));
      expect(passed?.message).toContain("kubelet.service");
    }
  }, 300_000);

  test("a change that breaks kubelet stops at the first node, which rolls back and is Ready again; the others never restart kubelet", async () => {
    const since = Date.now();
    const before = await Promise.all(workers.map(kubeletStart));
    const bad = await put(await rendered({ maxPods: 60, kubeletConfig: { failCgroupV1: true } }), settings);
    const failed = await waitFor("a node whose gate failed", async () => {
      for (const w of workers) if ((await nodeEvents(w.bare)).some((e) => e.reason === "RolloutHealthGateFailed" && e.message?.includes(bad.slice(0, 12)))) return w;
      return undefined;
    }, 120_000, 500);
    const others = workers.filter((w) => w !== failed);
    const gateFailed = (await nodeEvents(failed.bare)).find((e) => e.reason === "RolloutHealthGateFailed");
    expect(gateFailed?.message).toMatch(/kubelet/);
    expect(gateFailed?.message).toContain("the failure stops the pool's rollout of this revision");
    const rolledBack = await waitFor(`${failed.bare.name}: RolloutRolledBack`, async () => (await nodeEvents(failed.bare)).find((e) => e.reason === "RolloutRolledBack"), 60_000, 250);
    expect(rolledBack.message).toContain(`going back to the last good OSC ${goodChecksum.slice(0, 12)}`);
    // Back on the last good OSC and healthy: its slot is free again.
    // RolledBack, which the OSC controller (told of the release at once) replaces with Blocked within the second.
    await waitFor(`${failed.bare.name} rolled back and healthy`, async () => (["RolledBack", "Blocked"].includes((await rolloutCondition(failed))?.reason ?? "") ? true : undefined), 120_000, 250);
    await waitApplied(failed.bare, goodChecksum, 10_000);
    expect((await readNode(failed.bare)).status?.conditions?.find((c) => c.type === "Ready")?.status).toBe("True");
    expect(await unitProperty(failed.bare.node, "kubelet.service", "ActiveState")).toBe("active");
    // The others hold back: the failure is on the pool's record.
    expect(record().latest().failed).toMatchObject({ revision: bad, node: failed.bare.name });
    for (const w of others) {
      await waitFor(`${w.bare.name}: rollout stopped`, async () => ((await rolloutCondition(w))?.reason === "RolloutStopped" ? true : undefined), 120_000, 250);
      expect((await readNode(w.bare)).metadata?.annotations?.["checksum/cloud-config-data"]).toBe(goodChecksum);
      expect(await kubeletStart(w)).toBe(before[workers.indexOf(w)] as number);
    }
    expect(holdPeriods(since).map((p) => p.node)).toEqual([failed.bare.name]);

    // What an operator sees.
    const kubeconfig = world.cluster.adminKubeconfig;
    const report = JSON.parse(await runOk([await trellisBinary(), "rollout", "status", "--secret", first().secretName, "--kubeconfig", kubeconfig, "--json"]));
    expect(report.checksum).toBe(bad);
    expect(report.slots.stoppedBy).toMatchObject({ node: failed.bare.name, revision: bad });
    expect(report.slots.stoppedBy.failure).toMatch(/kubelet/);
    expect(report.counts).toMatchObject({ failed: 1, waiting: 2, updated: 0, holding: 0 });
    // Still saying so when the operator looks (a waiting node asks for the slot again at every reconcile).
    expect(report.nodes.filter((n: { detail: string }) => n.detail.startsWith("RolloutStopped:")).map((n: { node: string }) => n.node).sort()).toEqual(others.map((w) => w.bare.name).sort());
    const text = await runOk([await trellisBinary(), "rollout", "status", "--secret", first().secretName, "--kubeconfig", kubeconfig]);
    expect(text).toContain(`STOPPED: this revision of the Secret failed its health gate on ${failed.bare.name}`);
    console.log(`trellis rollout status, the bad change stopped:\n${text}`);
  }, 300_000);

  test("a fixed change goes on through all three, the rolled-back node included", async () => {
    const fixed = await put(await rendered({ maxPods: 70 }), settings);
    for (const w of workers) await waitApplied(w.bare, fixed, 180_000);
    for (const w of workers) await waitFor(`${w.bare.name}: gate passed`, async () => ((await rolloutCondition(w))?.reason === "HealthGatePassed" ? true : undefined), 60_000, 250);
    const report = JSON.parse(await runOk([await trellisBinary(), "rollout", "status", "--secret", first().secretName, "--kubeconfig", world.cluster.adminKubeconfig, "--json"]));
    expect(report.counts).toMatchObject({ updated: 3, failed: 0, waiting: 0 });
    fixedInput = { maxPods: 70 };
  }, 300_000);

  test("selection and windows: a paused node and nodes outside the canary take nothing new; outside every window only a change that restarts nothing goes", async () => {
    const [a, b, c] = workers as [Worker, Worker, Worker];
    await setLabel(c, pausedLabel, "true");
    const notToday = ["Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"][(new Date().getUTCDay() + 3) % 7] as string;
    const closed = { ...settings, [rolloutKeys.canary]: `kubernetes.io/hostname=${a.bare.name}`, [rolloutKeys.windows]: `${notToday} 00:00-01:00 UTC` };
    const startsBefore = await Promise.all(workers.map(kubeletStart));

    // A file no unit lists: a goes at once though no window is open; b is not in the canary, c is paused.
    const quiet = await put(await rendered({ ...fixedInput, extraFile: "v1\n" }), closed);
    await waitApplied(a.bare, quiet, 60_000);
    await waitFor("b not selected", async () => ((await rolloutCondition(b))?.reason === "NotSelected" ? true : undefined), 60_000, 250);
    await waitFor("c paused", async () => ((await rolloutCondition(c))?.reason === "Paused" ? true : undefined), 60_000, 250);

    // A kubelet change waits for a window on a, while it is closed.
    const loud = await put(await rendered({ ...fixedInput, maxPods: 80, extraFile: "v1\n" }), closed);
    const waiting = await waitFor("a outside the window", async () => {
      const cond = await rolloutCondition(a);
      return cond?.reason === "OutsideMaintenanceWindow" ? cond : undefined;
    }, 60_000, 250);
    expect(waiting.message).toContain(`next: `);
    expect(await kubeletStart(a)).toBe(startsBefore[0] as number);

    // The window opens (it is now always open): a goes; b and c still wait.
    await put(await rendered({ ...fixedInput, maxPods: 80, extraFile: "v1\n" }), { ...closed, [rolloutKeys.windows]: "daily 00:00-24:00 Europe/Berlin" });
    await waitApplied(a.bare, loud, 120_000);
    expect(await kubeletStart(a)).toBeGreaterThan(startsBefore[0] as number);
    for (const [i, w] of [[1, b], [2, c]] as const) {
      expect((await readNode(w.bare)).metadata?.annotations?.["checksum/cloud-config-data"]).not.toBe(loud);
      expect(await kubeletStart(w)).toBe(startsBefore[i] as number);
    }

    // Canary widened (removed) and c resumed: both follow, one at a time.
    await setLabel(c, pausedLabel, null);
    await put(await rendered({ ...fixedInput, maxPods: 80, extraFile: "v1\n" }), settings);
    for (const w of [b, c]) await waitApplied(w.bare, loud, 180_000);
  }, 400_000);

  test("requested kubelet restarts go through the budget: two nodes asked at once restart one after the other, each after the previous passed its gate", async () => {
    const [a, b] = workers as [Worker, Worker];
    for (const w of workers) await waitFor(`${w.bare.name}: gate passed`, async () => ((await rolloutCondition(w))?.reason === "HealthGatePassed" ? true : undefined), 60_000, 250);
    const since = Date.now();
    const before = await Promise.all([a, b].map(kubeletStart));
    await Promise.all([a, b].map((w) => setAnnotation(w, "worker.gardener.cloud/restart-systemd-services", "kubelet")));
    const after = await waitFor("both kubelets restarted", async () => {
      const now = await Promise.all([a, b].map(kubeletStart));
      return now.every((t, i) => t > (before[i] as number)) ? now : undefined;
    }, 180_000, 250);
    const periods = holdPeriods(since);
    expect(periods.map((p) => p.node).sort()).toEqual([a.bare.name, b.bare.name].sort());
    const [firstHold, secondHold] = periods as [HoldPeriod, HoldPeriod];
    const second = after[[a, b].findIndex((w) => w.bare.name === secondHold.node)] as number;
    // The second kubelet restarted only after the first node gave the slot back (its gate passed: ≥ the settle time).
    expect(second).toBeGreaterThanOrEqual(firstHold.to - 1000);
    expect(firstHold.to - firstHold.from).toBeGreaterThanOrEqual(5000);
    await waitFor("the slot given back", () => (holdPeriods(since).at(-1)?.to !== Number.POSITIVE_INFINITY ? true : undefined), 60_000, 250);
  }, 300_000);

  test("an overlay changes kubelet's configuration only on the nodes its selector picks, and follows their labels; `trellis plan` names each entry's layer", async () => {
    const [a, b, c] = workers as [Worker, Worker, Worker];
    const osc = await rendered({ ...fixedInput, maxPods: 80, extraFile: "v1\n" });
    const doc = parse(osc);
    const kubeletFile = doc.spec.files.find((f: { path: string }) => f.path === "/var/lib/kubelet/config/kubelet");
    const config = Buffer.from(kubeletFile.content.inline.data, "base64").toString("utf8");
    expect(config).toContain("maxPods: 80");
    const overridden = { ...kubeletFile, content: { inline: { encoding: "b64", data: Buffer.from(config.replace("maxPods: 80", "maxPods: 90")).toString("base64") } } };
    const big = "e2e.trellis.dev/big";
    const overlay = stringify({ rank: "node", selector: `${big}=true`, files: [overridden] });
    await setLabel(a, big, "true");
    const before = await Promise.all(workers.map(kubeletStart));
    const base = await put(osc, settings);
    await world.cluster.admin().makeApiClient(CoreV1Api).patchNamespacedSecret(
      { name: first().secretName, namespace: "kube-system", body: { data: { "overlay-big-node.yaml": Buffer.from(overlay).toString("base64") } } },
      setHeaderOptions("Content-Type", PatchStrategy.MergePatch),
    );
    const node = await waitFor(`${a.bare.name} with 90 pods`, async () => {
      const n = await readNode(a.bare);
      return n.status?.capacity?.pods === "90" && n.metadata?.annotations?.["trellis.dev/effective-checksum"] ? n : undefined;
    }, 120_000, 250);
    // Gardener's annotation still names osc.yaml; the layered checksum is trellis's own.
    expect(node.metadata?.annotations?.["checksum/cloud-config-data"]).toBe(base);
    expect(node.metadata?.annotations?.["trellis.dev/effective-checksum"]).not.toBe(base);
    expect(await kubeletStart(a)).toBeGreaterThan(before[0] as number);
    for (const [i, w] of [[1, b], [2, c]] as const) {
      expect((await readNode(w.bare)).status?.capacity?.pods).toBe("80");
      expect(await kubeletStart(w)).toBe(before[i] as number);
    }
    // Overlays follow the labels: b labelled later takes the overlay too, with no change to the Secret.
    await setLabel(b, big, "true");
    await waitFor(`${b.bare.name} with 90 pods`, async () => ((await readNode(b.bare)).status?.capacity?.pods === "90" ? true : undefined), 120_000, 250);
    expect((await readNode(c.bare)).status?.capacity?.pods).toBe("80");

    // Offline: the Secret as kubectl prints it, planned for a's labels on an empty root.
    const secret = await world.cluster.admin().makeApiClient(CoreV1Api).readNamespacedSecret({ name: first().secretName, namespace: "kube-system" });
    const dir = mkdtempSync(`${tmpdir()}/trellis-layers-`);
    writeFileSync(`${dir}/secret.yaml`, stringify({ apiVersion: "v1", kind: "Secret", metadata: { name: secret.metadata?.name }, data: secret.data }));
    // The machine image's mirror, through which plan pulls the OSC's imageRef files (kubelet, the agent).
    mkdirSync(`${dir}/root/etc/containerd/certs.d/${upstream}`, { recursive: true });
    writeFileSync(`${dir}/root/etc/containerd/certs.d/${upstream}/hosts.toml`, mirrorHostsToml(upstream, world.registry.host));
    const planned = await run([await trellisBinary(), "plan", "--osc", `${dir}/secret.yaml`, "--root", `${dir}/root`, "--labels", `${big}=true`]);
    expect(planned.stderr).toBe("");
    expect(planned.stdout).toContain("layers:");
    expect(planned.stdout).toContain("file /var/lib/kubelet/config/kubelet: overlay-big-node.yaml (node)");
    expect(planned.stdout).toContain("unit kubelet.service: osc.yaml");
    const other = await run([await trellisBinary(), "plan", "--osc", `${dir}/secret.yaml`, "--root", `${dir}/root`, "--labels", `${big}=false`]);
    expect(other.stdout).toContain("file /var/lib/kubelet/config/kubelet: osc.yaml");
  }, 300_000);
});

let fixedInput: { maxPods: number } = { maxPods: 70 };

async function setLabel(w: Worker, key: string, value: string | null): Promise<void> {
  await world.cluster.admin().makeApiClient(CoreV1Api).patchNode({ name: w.bare.name, body: { metadata: { labels: { [key]: value } } } }, setHeaderOptions("Content-Type", PatchStrategy.MergePatch));
}
async function setAnnotation(w: Worker, key: string, value: string): Promise<void> {
  await world.cluster.admin().makeApiClient(CoreV1Api).patchNode({ name: w.bare.name, body: { metadata: { annotations: { [key]: value } } } }, setHeaderOptions("Content-Type", PatchStrategy.MergePatch));
}
