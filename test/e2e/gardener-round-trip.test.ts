// Swapping the node agent of a running Gardener worker, both ways, as docs/gardener-landscape.md tells an
// operator to: gardener-node-agent brings a bare machine up with the OSC Gardener renders for its pool;
// the pool's OSC then names trellis's image for gardener-node-agent (what gardenlet renders once its image
// vector is overwritten), later gardener-node-agent's again (the overwrite removed), and trellis's once more.
// At each swap nothing restarts but the agent itself and no file of the OSC is written but the agent's
// binary (units compared by InvocationID and start time, files by inode, mtime and content), the Node stays Ready
// (its Ready condition never changes) and carries the new OSC's checksum; and each agent then runs the node
// the other left: a change of kubelet's configuration restarts kubelet only and rewrites its file only.
// And a new machine of a pool whose OSC names trellis's image gets trellis from Gardener's own node init.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { createHash } from "node:crypto";
import { readFileSync } from "node:fs";
import { parse } from "yaml";
import { nodeEvents, putOscSecret, readNode, unitProperty, waitApplied } from "../harness/agent.ts";
import { upstream } from "../harness/bare-node.ts";
import { waitFor } from "../harness/exec.ts";
import { bringUpWorker, pushAgentImage, readyAgain, readyHeartbeat, startWorkerWorld, trellisAgent, type Worker, type WorkerAgent, type WorkerWorld } from "../harness/worker.ts";
import { type WorkerOscInput, workerOsc } from "../harness/worker-osc.ts";
import { type BenchAgent, benchAgents } from "../bench/lib/agents.ts";
import { journal } from "../bench/lib/journal.ts";

type AgentName = "trellis" | "gardener-node-agent";
const agentBinary = "/opt/bin/gardener-node-agent";
const kubeletConfig = "/var/lib/kubelet/config/kubelet";
// gardener-node-agent writes containerd's configuration, the same bytes, whenever it applies an OSC
// (ReconcileContainerdConfig); trellis writes it only when its content changes.
const containerdConfig = "/etc/containerd/config.toml";

let world: WorkerWorld;
let w: Worker;
let images: Record<AgentName, WorkerAgent>;
const binarySha: Record<string, AgentName> = {};

beforeAll(async () => {
  world = await startWorkerWorld();
  const agents = await benchAgents();
  const peer = agents.find((a) => a.id === "gna") as BenchAgent;
  images = { trellis: trellisAgent, "gardener-node-agent": await pushAgentImage(world, peer) };
  for (const a of agents) binarySha[sha256(readFileSync(a.binary))] = a.id === "trellis" ? "trellis" : "gardener-node-agent";
}, 1_800_000);

afterAll(async () => {
  await w?.bare.stop();
  await world?.stop();
}, 60_000);

const sha256 = (b: Uint8Array) => createHash("sha256").update(b).digest("hex");
const imageOf = (agent: AgentName) => `${upstream}/${images[agent].repo}:${images[agent].tag}`;

/** Which agent a node's gardener-node-agent.service runs now, and its PID (its executable, hashed). */
async function runningAgent(on: Worker = w): Promise<{ agent: AgentName | undefined; pid: number }> {
  const pid = Number(await unitProperty(on.bare.node, "gardener-node-agent.service", "MainPID"));
  if (pid <= 1) return { agent: undefined, pid };
  const r = await on.bare.node.exec(["sha256sum", `/proc/${pid}/exe`]);
  return { agent: binarySha[r.stdout.split(" ")[0] ?? ""], pid };
}

type Snapshot = { units: Record<string, string>; files: Record<string, { at: string; sha256: string }>; ready: string };

/**
 * Every unit of the OSC (its invocation: ID and start time) and every file it writes, unit files and
 * drop-ins included (where: inode and mtime, a rewrite is a new inode through a rename or a new mtime in
 * place; and what: sha256), and the Node's Ready condition (status and last transition).
 */
async function snapshot(oscYaml: string): Promise<Snapshot> {
  const osc = parse(oscYaml);
  const units = [...(osc.spec.units ?? []), ...(osc.status?.extensionUnits ?? [])] as { name: string; dropIns?: { name: string }[] }[];
  const files = [...(osc.spec.files ?? []), ...(osc.status?.extensionFiles ?? [])] as { path: string }[];
  const paths = [...files.map((f) => f.path), ...units.flatMap((u) => [`/etc/systemd/system/${u.name}`, ...(u.dropIns ?? []).map((d) => `/etc/systemd/system/${u.name}.d/${d.name}`)]), containerdConfig];
  const show = await w.bare.node.execOk(["systemctl", "show", "--property=Id,InvocationID,ExecMainStartTimestampMonotonic", ...units.map((u) => u.name)]);
  const unitState: Record<string, string> = {};
  for (const block of show.trim().split("\n\n")) {
    const p = Object.fromEntries(block.split("\n").map((l) => [l.slice(0, l.indexOf("=")), l.slice(l.indexOf("=") + 1)]));
    unitState[p.Id as string] = `${p.InvocationID} ${p.ExecMainStartTimestampMonotonic}`;
  }
  const script = 'for f; do [ -f "$f" ] && echo "$f|$(stat -c "%i %.9Y" "$f")|$(sha256sum <"$f" | cut -c1-64)"; done; true';
  const listed = await w.bare.node.execOk(["sh", "-c", script, "sh", ...paths]);
  const fileState = Object.fromEntries(listed.trim().split("\n").map((l) => l.split("|")).map(([path, at, sha256]) => [path as string, { at: at as string, sha256: sha256 as string }]));
  const ready = (await readNode(w.bare)).status?.conditions?.find((c) => c.type === "Ready");
  return { units: unitState, files: fileState, ready: `${ready?.status} since ${ready?.lastTransitionTime}` };
}

/** What differs between two snapshots: the units started again, the files written and those whose content changed. */
function changes(before: Snapshot, after: Snapshot) {
  const differ = <T>(a: Record<string, T>, b: Record<string, T>, key: (t: T | undefined) => string | undefined) =>
    Object.keys({ ...a, ...b }).filter((k) => key(a[k]) !== key(b[k])).sort();
  return {
    restarted: differ(before.units, after.units, (u) => u),
    written: differ(before.files, after.files, (f) => f?.at),
    changed: differ(before.files, after.files, (f) => f?.sha256),
    ready: after.ready === before.ready && after.ready.startsWith("True"),
  };
}

/** systemd has nothing left to do in the node: no job queued, no unit activating or deactivating. */
const settled = () =>
  waitFor("systemd idle in the node", async () => {
    const busy = await w.bare.node.execOk(["sh", "-c", "systemctl list-jobs --no-legend; systemctl list-units --all --no-legend --plain --state=activating,deactivating"]);
    return busy.trim() === "" ? true : undefined;
  }, 60_000, 250);

/**
 * The pool's OSC rendered with `changes` and put into its Secret; resolves once `agent` runs the node and
 * has reconciled it: the Node carries the checksum, and the agent's own process says it applied the OSC
 * (trellis: its OSCApplied event; gardener-node-agent: its log line after its start).
 */
async function rollOut(agent: AgentName, changes: Partial<WorkerOscInput>): Promise<{ osc: string; checksum: string }> {
  const { osc } = await workerOsc({ ...w.input, ...changes });
  const checksum = await putOscSecret(world.cluster, w.secretName, osc);
  await waitApplied(w.bare, checksum, 180_000, 200);
  await waitFor(`${agent} to run the node and report ${checksum.slice(0, 12)}`, async () => {
    const running = await runningAgent();
    if (running.agent !== agent) return undefined;
    if (agent === "trellis") return (await nodeEvents(w.bare)).some((e) => e.reason === "OSCApplied" && e.message?.startsWith(`Applied OSC ${checksum.slice(0, 12)}:`)) || undefined;
    const lines = await journal(w.bare.node, running.pid);
    return lines.some((l) => l.msg === "Configuration on this node is up to date, nothing to be done" || l.msg === "Successfully applied operating system config") || undefined;
  }, 180_000, 500);
  await settled();
  return { osc, checksum };
}

/** Swaps the node's agent to `to` through the OSC and returns what changed on the node meanwhile. */
async function swapTo(to: AgentName, oscChanges: Partial<WorkerOscInput>, current: string) {
  const before = await snapshot(current);
  const from = (await runningAgent()).agent;
  const next = await rollOut(to, { ...oscChanges, agentImage: imageOf(to) });
  expect(from).not.toBe(to);
  return { ...next, ...changes(before, await snapshot(next.osc)) };
}

/** A change of kubelet's configuration under `agent`: what it restarted and wrote, and the Node Ready again. */
async function kubeletChange(agent: AgentName, maxPods: number | undefined, current: string) {
  const before = await snapshot(current);
  const heartbeat = await readyHeartbeat(w);
  const since = Date.now();
  const next = await rollOut(agent, { agentImage: imageOf(agent), maxPods });
  expect(await w.bare.node.readFile(kubeletConfig)).toContain(`maxPods: ${maxPods ?? 110}`);
  await readyAgain(w, heartbeat, since);
  return { ...next, ...changes(before, await snapshot(next.osc)) };
}

/** At a swap: only the agent restarts, only its binary changes, the Node stays Ready. */
const agentOnly = (written: string[]) => ({ restarted: ["gardener-node-agent.service"], changed: [agentBinary], written, ready: true });
/** At a change of kubelet's configuration: only kubelet restarts, only its file changes (kubelet's own restart is the Node's business). */
const kubeletOnly = (written: string[]) => ({ restarted: ["kubelet.service"], changed: [kubeletConfig], written });
const seen = (c: { restarted: string[]; changed: string[]; written: string[] }) => ({ restarted: c.restarted, changed: c.changed, written: c.written });
let current = "";
let firstSwap = "";

describe("gardener-node-agent → trellis → gardener-node-agent → trellis on one worker, with the OSC Gardener renders", () => {
  test("gardener-node-agent brings the bare machine up to a Ready Node", async () => {
    w = await bringUpWorker(world, "trip", { agent: images["gardener-node-agent"], machineContainerd: "containerd-default" });
    current = (await workerOsc(w.input)).osc;
    await waitFor("gardener-node-agent running the node", async () => ((await runningAgent()).agent === "gardener-node-agent" ? true : undefined), 60_000, 250);
    await settled();
  }, 900_000);

  test("the OSC names trellis's image: trellis runs the node; only the agent restarted and only its binary was written", async () => {
    const swap = await swapTo("trellis", {}, current);
    // gardener-node-agent applied the OSC up to its own binary and restarted itself; trellis adopted the rest.
    expect({ ...seen(swap), ready: swap.ready }).toEqual(agentOnly([containerdConfig, agentBinary]));
    current = swap.osc;
    firstSwap = swap.checksum;
  }, 600_000);

  test("the OSC names gardener-node-agent's image again: it runs the node; only the agent restarted and only its binary was written", async () => {
    const swap = await swapTo("gardener-node-agent", {}, current);
    // The pool's first OSC again. trellis installed gardener-node-agent and restarted itself last, the Node
    // annotated: gardener-node-agent found the node up to date.
    expect(swap.checksum).toBe(w.checksum);
    expect({ ...seen(swap), ready: swap.ready }).toEqual(agentOnly([agentBinary]));
    current = swap.osc;
    // What trellis leaves, which gardener-node-agent neither reads nor removes: its directory, its own condition.
    expect((await w.bare.node.exec(["test", "-f", "/var/lib/gardener-node-agent/trellis/state.json"])).code).toBe(0);
    expect((await readNode(w.bare)).status?.conditions?.map((c) => c.type)).toContain("OperatingSystemConfigApplied");
  }, 600_000);

  test("the OSC names trellis's image once more, the same OSC as the first swap: trellis runs the node again", async () => {
    // gardener-node-agent began this very OSC before, at the first swap; trellis removed its record of that
    // unfinished apply, which it would otherwise resume now, taking the OSC for applied with itself still running.
    const swap = await swapTo("trellis", {}, current);
    expect(swap.checksum).toBe(firstSwap);
    expect({ ...seen(swap), ready: swap.ready }).toEqual(agentOnly([containerdConfig, agentBinary]));
    current = swap.osc;
  }, 600_000);

  test("trellis runs the node gardener-node-agent left: a kubelet change restarts kubelet only", async () => {
    const change = await kubeletChange("trellis", 60, current);
    expect(seen(change)).toEqual(kubeletOnly([kubeletConfig]));
    current = change.osc;
  }, 300_000);

  test("gardener-node-agent's image with that change: it runs the node; only the agent restarted and only its binary was written", async () => {
    const swap = await swapTo("gardener-node-agent", { maxPods: 60 }, current);
    expect({ ...seen(swap), ready: swap.ready }).toEqual(agentOnly([agentBinary]));
    current = swap.osc;
  }, 600_000);

  test("gardener-node-agent runs the node trellis left: a kubelet change restarts kubelet only", async () => {
    // Back to the pool's first OSC. It diffs against the record trellis left (last-applied-osc.yaml, with
    // containerd's drop-in as it keeps it).
    const change = await kubeletChange("gardener-node-agent", undefined, current);
    expect(change.checksum).toBe(w.checksum);
    expect(seen(change)).toEqual(kubeletOnly([containerdConfig, kubeletConfig]));
    current = change.osc;
  }, 300_000);
});

describe("a new machine, with trellis's image in the pool's OSC", () => {
  let fresh: Worker | undefined;
  afterAll(async () => {
    await fresh?.bare.stop();
  }, 60_000);

  test("Gardener's gardener-node-init pulls it with ctr, copies the binary out and bootstraps trellis: the Node is Ready", async () => {
    fresh = await bringUpWorker(world, "fresh", { agent: images.trellis, pool: "fresh", init: "gardener-node-init", machineContainerd: "containerd-default" });
    expect((await runningAgent(fresh)).agent).toBe("trellis");
    // What the init script did: the image pulled into containerd, the init unit disabled by the bootstrap.
    expect(await fresh.bare.node.execOk(["ctr", "images", "ls", "-q"])).toContain(imageOf("trellis"));
    expect((await fresh.bare.node.exec(["systemctl", "is-enabled", "gardener-node-init.service"])).stdout.trim()).toBe("disabled");
  }, 600_000);
});

