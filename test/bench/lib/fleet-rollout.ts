// bench:fleet's rollout mode (`bun run bench:fleet -- --mode rollout`): the fleet's pool gets a disruption
// budget (k = 1, 5, 10 % of the nodes in turn; settle 3 s, health timeout 15 s, rollback), and for each k a
// good change (one unit restarts on every node) and a bad one (that unit fails to start) roll out. Every
// version of the pool's record (the Lease `<secret>-slots`: who holds a slot, and the revision that failed)
// is recorded from a watch, and every node's unit start times from the unit itself, so the number of nodes
// disrupted at every instant is known: from a node's restart of the unit until it gives its slot back.
// During the last good rollout one slot holder's agent is killed (-9) and another holder's node is powered
// off.
//
// Ready: fifty kubelets do not fit on two cores, so the harness plays kubelet's part for the Node's Ready
// condition: a heartbeat every 10 s for every running node, and Unknown (as the node lifecycle controller
// sets it after its grace period) for a node powered off. Everything else is real: the agents, systemd,
// the units, the API server, the Leases.
import { CoreV1Api, PatchStrategy, setHeaderOptions } from "@kubernetes/client-node";
import { sha256Hex } from "../../../src/api/desired.ts";
import { rolloutKeys } from "../../../src/api/rollout.ts";
import { type AgentNode, mainPid } from "../../harness/agent.ts";
import type { Cluster } from "../../harness/cluster.ts";
import { waitFor } from "../../harness/exec.ts";
import { watchPoolRecord } from "../../harness/pool-record.ts";
import { type OscShape, oscYaml, secretBody, startedFile, starts } from "./bench-osc.ts";
import { type Hold, overlap, type Phase, type RolloutPicture } from "./rollout-svg.ts";
import { median, round } from "./stats.ts";

const settleS = 3;
const timeoutS = 15;

export type ScenarioResult = {
  name: string;
  k: number;
  nodes: number;
  durationS: number;
  maxConcurrentSlotHolders: number;
  maxConcurrentlyDisrupted: number;
  nodesTouched: number;
  perNodeS?: number;
  idealS?: number;
  notes: string[];
};

export async function rolloutMode(o: { cluster: Cluster; agents: AgentNode[]; secretName: string; shape: OscShape; progress: (m: string) => void }): Promise<{ scenarios: ScenarioResult[]; picture: RolloutPicture }> {
  const { cluster, agents, secretName, shape, progress } = o;
  const core = cluster.admin().makeApiClient(CoreV1Api);
  const alive = new Set(agents.map((a) => a.name));
  const n = agents.length;

  // ---- kubelet's part: Ready heartbeats
  const setReady = (name: string, status: "True" | "Unknown") =>
    core
      .patchNodeStatus(
        { name, body: { status: { conditions: [{ type: "Ready", status, reason: status === "True" ? "KubeletReady" : "NodeStatusUnknown", message: status === "True" ? "heartbeat from the bench (plays kubelet)" : "powered off", lastHeartbeatTime: new Date(), lastTransitionTime: new Date() }] } } },
        setHeaderOptions("Content-Type", PatchStrategy.StrategicMergePatch),
      )
      .catch((err: unknown) => progress(`Ready heartbeat of ${name} failed: ${String(err)}`));
  const beat = async () => {
    const names = [...alive];
    for (let i = 0; i < names.length; i += 10) await Promise.all(names.slice(i, i + 10).map((name) => setReady(name, "True")));
  };
  await beat();
  const heartbeats = setInterval(() => void beat(), 10_000);

  // ---- every version of the pool's record
  const pool = watchPoolRecord(cluster.admin(), secretName);

  const annotated = async (checksum: string) => (await core.listNode()).items.filter((x) => x.metadata?.annotations?.["checksum/cloud-config-data"] === checksum).map((x) => x.metadata?.name as string);
  const put = (text: string, annotations: Record<string, string>) => {
    const body = secretBody(secretName, text);
    body.metadata = { ...body.metadata, annotations: { ...body.metadata?.annotations, ...annotations } };
    return core.replaceNamespacedSecret({ name: secretName, namespace: "kube-system", body });
  };
  /** Slot hold periods between `from` and `to`, each with the revision it was admitted for; one still held ends at `to`. */
  const holdsBetween = (from: number, to: number): (Hold & { checksum: string })[] =>
    pool.holdPeriods(from, to).map((p) => (p.to <= to ? { node: p.node, from: p.from, to: p.to, outcome: "passed" as const, checksum: p.revision } : { node: p.node, from: p.from, to, outcome: "held" as const, checksum: p.revision }));
  const maxHolders = (from: number, to: number) => pool.maxHolders(from, to);
  const byName = new Map(agents.map((a) => [a.name, a]));
  const restartsOf = async (unit: number, since: number) => {
    const out: { node: string; at: number }[] = [];
    for (const a of agents) if (alive.has(a.name)) for (const t of await starts(a.node, unit)) if (t >= since) out.push({ node: a.name, at: t });
    return out;
  };

  const scenarios: ScenarioResult[] = [];
  const phases: Phase[] = [];
  const allHolds: Hold[] = [];
  const allRestarts: { node: string; at: number }[] = [];
  const disruptedIntervals: { from: number; to: number }[] = [];
  let change = 0;
  let good = oscYaml(0, shape);

  try {
    for (const budget of ["1", "5", "10%"]) {
      const k = budget.endsWith("%") ? Math.max(1, Math.floor((Number(budget.slice(0, -1)) * n) / 100)) : Number(budget);
      const settings = { [rolloutKeys.maxDisrupted]: budget, [rolloutKeys.settleTime]: `${settleS}s`, [rolloutKeys.healthTimeout]: `${timeoutS}s`, [rolloutKeys.rollback]: "true" };
      const chaos = budget === "10%";

      // ---- a good change
      const unit = change % shape.units;
      good = oscYaml(++change, shape);
      const checksum = sha256Hex(good);
      const t0 = Date.now();
      progress(`k=${budget} (${k}): good change ${checksum.slice(0, 12)} (restarts bench-u${String(unit).padStart(2, "0")} on every node)`);
      await put(good, settings);
      const notes: string[] = [];
      if (chaos) notes.push(...(await chaosDuringRollout()));
      await waitFor(`every running node on ${checksum.slice(0, 12)} with its slot given back`, async () => {
        const done = new Set(await annotated(checksum));
        const holding = holdsBetween(t0, Date.now()).filter((h) => h.outcome === "held" && alive.has(h.node)).length;
        return [...alive].every((a) => done.has(a)) && holding === 0 ? true : undefined;
      }, 60_000 + Math.ceil(n / k) * 20_000, 1000);
      const t1 = Date.now();
      const holds = holdsBetween(t0, t1);
      const restarts = await restartsOf(unit, t0);
      const disrupted = disruptedFrom(holds, restarts);
      const holdS = holds.filter((h) => h.outcome !== "held").map((h) => (h.to - h.from) / 1000);
      const perNodeS = holdS.length ? median(holdS) : 0;
      scenarios.push({
        name: `k=${budget}, good change`,
        k,
        nodes: alive.size,
        durationS: round((t1 - t0) / 1000),
        maxConcurrentSlotHolders: maxHolders(t0, t1),
        maxConcurrentlyDisrupted: overlap(disrupted).max,
        nodesTouched: new Set(restarts.map((r) => r.node)).size,
        perNodeS: round(perNodeS),
        idealS: round((Math.ceil(alive.size / k) * perNodeS)),
        notes,
      });
      progress(`  ${JSON.stringify(scenarios.at(-1))}`);
      record(`k=${budget} good`, k, t0, t1, holds, restarts, disrupted);

      // ---- a bad change: the unit changed last fails to start
      const badUnit = (change - 1) % shape.units;
      const bad = good.replace(`${startedFile(badUnit)}; exec sleep infinity`, `${startedFile(badUnit)}; exit 1`);
      const badChecksum = sha256Hex(bad);
      const b0 = Date.now();
      progress(`k=${budget} (${k}): bad change ${badChecksum.slice(0, 12)} (bench-u${String(badUnit).padStart(2, "0")} exits 1)`);
      await put(bad, settings);
      // Stopped: the failure is on the record, every slot is given back (rolled back), and nothing moves for 15 s.
      await waitFor("the bad change stopped and rolled back", async () => {
        const now = Date.now();
        const since = pool.versions().filter((v) => v.at >= b0);
        // Without overlays the Secret's revision is osc.yaml's checksum.
        const failedOn = since.some((v) => v.record.failed?.revision === badChecksum);
        const held = holdsBetween(b0, now).filter((h) => h.outcome === "held" && alive.has(h.node));
        const quietSince = Math.max(b0, ...since.map((v) => v.at));
        return failedOn && held.length === 0 && now - quietSince > 15_000 ? true : undefined;
      }, 300_000, 1000);
      const b1 = Date.now();
      const badHolds = holdsBetween(b0, b1).map((h) => ({ ...h, outcome: h.checksum === badChecksum ? ("failed" as const) : h.outcome }));
      const badRestarts = await restartsOf(badUnit, b0);
      const badDisrupted = disruptedFrom(badHolds, badRestarts);
      const touched = new Set(badHolds.filter((h) => h.checksum === badChecksum).map((h) => h.node));
      scenarios.push({
        name: `k=${budget}, bad change`,
        k,
        nodes: alive.size,
        durationS: round((b1 - b0) / 1000),
        maxConcurrentSlotHolders: maxHolders(b0, b1),
        maxConcurrentlyDisrupted: overlap(badDisrupted).max,
        nodesTouched: touched.size,
        notes: [`took a slot for the bad change: ${[...touched].join(", ")}; the others were refused (the failure on the pool's record) and kept the good OSC; the failed nodes rolled back`],
      });
      progress(`  ${JSON.stringify(scenarios.at(-1))}`);
      record(`k=${budget} bad`, k, b0, b1, badHolds, badRestarts, badDisrupted);
    }
  } finally {
    clearInterval(heartbeats);
    pool.stop();
  }
  const series = overlap(disruptedIntervals).series;
  return { scenarios, picture: { nodes: agents.map((a) => a.name), holds: allHolds, restarts: allRestarts, disrupted: series, phases } };

  /** Disrupted: from the node's restart of the changed unit within its hold (else the hold's start) to giving the slot back. */
  function disruptedFrom(holds: Hold[], restarts: { node: string; at: number }[]) {
    return holds.map((h) => {
      const r = restarts.find((x) => x.node === h.node && x.at >= h.from - 1000 && x.at <= h.to);
      return { from: r ? Math.max(h.from, r.at) : h.from, to: h.to };
    });
  }
  function record(name: string, k: number, from: number, to: number, holds: Hold[], restarts: { node: string; at: number }[], disrupted: { from: number; to: number }[]) {
    phases.push({ name, from, to, k });
    allHolds.push(...holds);
    allRestarts.push(...restarts);
    disruptedIntervals.push(...disrupted);
  }

  /** Once two nodes hold slots: kill one holder's agent with -9, power the other holder's node off. */
  async function chaosDuringRollout(): Promise<string[]> {
    const holders = await waitFor("two slot holders", () => {
      const names = pool.latest().holders.map((h) => h.node).filter((h) => alive.has(h));
      return names.length >= 2 ? names : undefined;
    }, 120_000, 100);
    const [killed, powered] = holders as [string, string];
    const a = byName.get(killed) as AgentNode;
    const pid = await mainPid(a, "gardener-node-agent.service");
    await a.node.execOk(["kill", "-9", String(pid)]);
    const b = byName.get(powered) as AgentNode;
    alive.delete(powered);
    await b.node.stop();
    await setReady(powered, "Unknown");
    return [
      `${killed}: its agent was killed with -9 while holding a slot (systemd started it again; it went on with its gate and the same slot)`,
      `${powered}: powered off while holding a slot; its Node set Ready=Unknown; the slot stays taken (a holder keeps its slot until its Node is deleted), the rollout goes on with k-1 slots`,
    ];
  }
}
