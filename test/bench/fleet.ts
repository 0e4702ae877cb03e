// bun run bench:fleet [-- --nodes 50 --steady-minutes 5] [--mode rollout] [--agent-env NAME=VALUE ...]
//
// --mode rollout: the same fleet, then fleet rollouts under disruption budgets instead of the load
// measurements (test/bench/lib/fleet-rollout.ts); writes fleet-rollout-<date>.json and
// docs/fleet-rollout.svg.
//
// trellis at fleet scale on one machine: N real nodes (systemd in namespaces, host network), each with
// its own trellis agent, client certificate and RBAC, all of one worker pool (one OSC Secret: 8 units,
// 32 files, test/bench/lib/bench-osc.ts), against one real kube-apiserver + etcd. Measured at the API
// server: its request rate (audit log, by verb and resource) and the CPU time of kube-apiserver and
// etcd (/proc of their PIDs) for an idle control plane, for the fleet in steady state, and during a
// rollout of an OSC change to every node (one file of one unit: every node restarts that unit). From
// those, the per-node cost, extrapolated linearly to 5,000 nodes with the arithmetic printed.
// Nodes are started while MemAvailable stays above 3 GiB; the result says how many ran.
// Writes test/bench/results/fleet-<date>.json.
//
// --mode scale [--sizes 200,1000,5000 --handovers 10 --full-k1-up-to 0]: no nodes booted; simulated agents against pools of Node objects
// (test/bench/lib/fleet-scale.ts); writes fleet-scale-<date>.json and docs/fleet-scale.svg.
import { Buffer } from "node:buffer";
import { readFileSync, writeFileSync } from "node:fs";
import { parseArgs } from "node:util";
import { CoreV1Api } from "@kubernetes/client-node";
import { sha256Hex } from "../../src/api/desired.ts";
import { nodeAgentUserPrefix } from "../../src/kube/csr.ts";
import { type AgentNode, mainPid, startAgentNode } from "../harness/agent.ts";
import { startCluster } from "../harness/cluster.ts";
import { waitFor } from "../harness/exec.ts";
import type { AuditEvent } from "../harness/rbac.ts";
import { AuditTail, auditMs, countByKind } from "./lib/audit.ts";
import { type OscShape, oscYaml, secretBody } from "./lib/bench-osc.ts";
import { cpuSecondsAt, initClockTicks, machineInfo, memoryKiB, procKiB } from "./lib/proc.ts";
import { saveResult } from "./lib/results.ts";
import { round, summary } from "./lib/stats.ts";
import { rolloutMode, type ScenarioResult } from "./lib/fleet-rollout.ts";
import { traceRollout } from "./lib/fleet-trace.ts";
import { rolloutSvg } from "./lib/rollout-svg.ts";
import { relaunchForManyWatches, scaleMode } from "./lib/fleet-scale.ts";

const { values: args } = parseArgs({
  options: {
    nodes: { type: "string", default: "50" },
    "steady-minutes": { type: "string", default: "5" },
    "baseline-seconds": { type: "string", default: "60" },
    parallel: { type: "string", default: "4" },
    mode: { type: "string", default: "load" },
    // The nice value of the control plane's sessions (ClusterOptions.controlPlaneNice); 0: as the nodes.
    "control-plane-nice": { type: "string", default: "-20" },
    // NAME=VALUE, repeatable: set in every agent's environment (a runtime knob measured at fleet scale).
    "agent-env": { type: "string", multiple: true, default: [] },
    sizes: { type: "string", default: "200,1000,5000" },
    handovers: { type: "string", default: "10" },
    "full-k1-up-to": { type: "string", default: "0" },
  },
});
const CONTROL_PLANE_NICE = Number(args["control-plane-nice"]);
const AGENT_ENV = Object.fromEntries(
  args["agent-env"].map((kv) => {
    const i = kv.indexOf("=");
    if (i <= 0) throw new Error(`--agent-env takes NAME=VALUE, not "${kv}"`);
    return [kv.slice(0, i), kv.slice(i + 1)];
  }),
);
const MODE = args.mode;
if (MODE !== "load" && MODE !== "rollout" && MODE !== "scale") throw new Error(`--mode is "load", "rollout" or "scale", not "${MODE}"`);
const NODES = Number(args.nodes);
const STEADY_MINUTES = Number(args["steady-minutes"]);
const BASELINE_S = Number(args["baseline-seconds"]);
const PARALLEL = Number(args.parallel);
const TARGET = 5_000;
const SHAPE: OscShape = { units: 8, filesPerUnit: 4 };
const MIN_AVAILABLE_KIB = 3 * 1024 * 1024;
const secretName = "gardener-node-agent-fleet";

const benchStart = performance.now();
const progress = (msg: string) => console.error(`[${((performance.now() - benchStart) / 1000).toFixed(1).padStart(7)} s] ${msg}`);
const wallNow = () => performance.timeOrigin + performance.now();
const memAvailableKiB = () => Number(/^MemAvailable:\s+(\d+)/m.exec(readFileSync("/proc/meminfo", "utf8"))?.[1]);
if (MODE === "scale") {
  const relaunched = await relaunchForManyWatches();
  if (relaunched === undefined) await scaleMode({ sizes: args.sizes.split(",").map(Number), applyMs: 200, settleMs: 2_000, handovers: Number(args.handovers), fullK1UpTo: Number(args["full-k1-up-to"]), heartbeatUpTo: 1_000, heartbeatSeconds: 30, idleSeconds: 30, controlPlaneNice: CONTROL_PLANE_NICE, progress });
  process.exit(relaunched ?? 0);
}

await initClockTicks();
const machine = await machineInfo();
// The control plane first: in a real cluster it has machines of its own, and at nice 0 it would get one
// 51st of the cores while 50 agents work, so their PATCHes wait in the API server (measured: 100–900 ms
// each, against 4 ms, and the Nodes annotated in a clump when the agents are done). Its CPU still counts.
const cluster = await startCluster({ controllerManager: false, controlPlaneNice: CONTROL_PLANE_NICE });
const core = cluster.admin().makeApiClient(CoreV1Api);
const audit = new AuditTail(cluster.auditLog);
const agents: AgentNode[] = [];
const result: Record<string, unknown> = { date: new Date().toISOString().slice(0, 10), machine, controlPlaneNice: CONTROL_PLANE_NICE, ...(Object.keys(AGENT_ENV).length > 0 && { agentEnvironment: AGENT_ENV }) };

/** CPU seconds of kube-apiserver and etcd, and kube-apiserver's RSS. */
function controlPlane() {
  const { apiserver, etcd } = cluster.pids();
  if (!apiserver || !etcd) throw new Error("the control plane is not running");
  const { VmRSS } = procKiB("", apiserver, "status", ["VmRSS"]);
  return { at: wallNow(), apiserver: cpuSecondsAt("", apiserver), etcd: cpuSecondsAt("", etcd), apiserverRssMiB: round(VmRSS / 1024) };
}
type Sample = ReturnType<typeof controlPlane>;
const isAgent = (e: AuditEvent) => e.user.username.startsWith(nodeAgentUserPrefix);
/** Completed requests (a watch counts once, when it ends or is cut) of the agents in a window. */
function agentRequests(fromMs: number, toMs: number): AuditEvent[] {
  return audit.poll().filter((e) => isAgent(e) && e.stage === "ResponseComplete" && auditMs(e.stageTimestamp) >= fromMs && auditMs(e.stageTimestamp) <= toMs);
}
function byKind(events: AuditEvent[], seconds: number) {
  const counts = countByKind(events).sort((a, b) => b[1] - a[1]);
  return Object.fromEntries(counts.map(([k, n]) => [k, { count: n, perSecond: round(n / seconds, 3) }]));
}
function window(from: Sample, to: Sample) {
  const s = (to.at - from.at) / 1000;
  return { seconds: round(s), apiserverCores: round((to.apiserver - from.apiserver) / s, 3), etcdCores: round((to.etcd - from.etcd) / s, 3) };
}

try {
  // ------------------------------------------------ idle control plane
  progress(`idle control plane for ${BASELINE_S} s`);
  await Bun.sleep(5_000);
  const b0 = controlPlane();
  await Bun.sleep(BASELINE_S * 1000);
  const baseline = window(b0, controlPlane());
  result.baseline = { ...baseline, apiserverRssMiB: controlPlane().apiserverRssMiB };

  // ------------------------------------------------ the fleet
  // Each node's systemd and journald hold ~7 inotify instances; the kernel's default of 128 per user
  // stops the 19th node from booting (its .path units fail).
  const inotify = "/proc/sys/fs/inotify/max_user_instances";
  const instances = Number(readFileSync(inotify, "utf8"));
  if (instances < 16 * NODES) {
    writeFileSync(inotify, `${16 * NODES}\n`);
    progress(`raised fs.inotify.max_user_instances from ${instances} to ${16 * NODES}`);
  }
  let text = oscYaml(0, SHAPE);
  await core.createNamespacedSecret({ namespace: "kube-system", body: secretBody(secretName, text) });
  const started = wallNow();
  let next = 0;
  let stoppedForMemory = false;
  const worker = async () => {
    while (next < NODES && !stoppedForMemory) {
      if (memAvailableKiB() < MIN_AVAILABLE_KIB) {
        stoppedForMemory = true;
        break;
      }
      const i = next++;
      agents.push(await startAgentNode(cluster, { prefix: `fleet${i}`, secretName, environment: AGENT_ENV }));
      if (agents.length % 10 === 0) progress(`${agents.length} nodes up, MemAvailable ${round(memAvailableKiB() / 1048576, 1)} GiB`);
    }
  };
  await Promise.all(Array.from({ length: PARALLEL }, worker));
  progress(`${agents.length} nodes booted in ${round((wallNow() - started) / 1000)} s${stoppedForMemory ? " (stopped: memory)" : ""}; waiting for every node to apply the OSC`);
  const notAnnotated = async (checksum: string) => {
    const list = await core.listNode();
    const done = new Set(list.items.filter((n) => n.metadata?.annotations?.["checksum/cloud-config-data"] === checksum).map((n) => n.metadata?.name));
    return agents.filter((a) => !done.has(a.name));
  };
  try {
    await waitFor("every node to apply the OSC", async () => (await notAnnotated(sha256Hex(text))).length === 0, 300_000, 1_000);
  } catch (err) {
    // What the nodes that did not get there say, before they are stopped.
    for (const a of await notAnnotated(sha256Hex(text))) {
      const unit = await a.node.exec(["systemctl", "status", "--no-pager", "--lines=15", "gardener-node-agent.service"]);
      console.error(`--- ${a.name} has not applied the OSC:\n${unit.stdout}${unit.stderr}`);
    }
    throw err;
  }
  const n = agents.length;
  const agentRss = await Promise.all(
    agents.map(async (a) => (await memoryKiB(a.node, await mainPid(a, "gardener-node-agent.service"))).vmRssKiB / 1024),
  );

  if (MODE === "rollout") {
    const { scenarios, picture } = await rolloutMode({ cluster, agents, secretName, shape: SHAPE, progress });
    result.mode = "rollout";
    result.readySignal = "driven by the bench (a heartbeat every 10 s per running node; Unknown for a node powered off): 50 kubelets do not fit on 2 cores";
    result.scenarios = scenarios;
    const svg = rolloutSvg(picture, `trellis fleet rollout: ${n} nodes, k = 1, 5, 10 %; a good and a bad change each (${result.date})`);
    writeFileSync(new URL("../../docs/fleet-rollout.svg", import.meta.url), svg);
  } else {

    // ------------------------------------------------ steady state
    progress(`steady state: ${STEADY_MINUTES} min with ${n} agents (after 60 s to settle)`);
    await Bun.sleep(60_000);
    const s0 = controlPlane();
    await Bun.sleep(STEADY_MINUTES * 60_000);
    const s1 = controlPlane();
    await Bun.sleep(2_000); // the audit log is written after the response
    const steadyWindow = window(s0, s1);
    const steadyRequests = agentRequests(s0.at, s1.at).filter((e) => e.verb !== "watch");
    const steadyWatches = agentRequests(s0.at, s1.at).filter((e) => e.verb === "watch");
    const steadyRate = steadyRequests.length / steadyWindow.seconds;
    result.steady = {
      nodes: n,
      ...steadyWindow,
      apiserverRssMiB: s1.apiserverRssMiB,
      agentRequestsPerSecond: round(steadyRate, 3),
      watchReopensPerSecond: round(steadyWatches.length / steadyWindow.seconds, 3),
      byVerbAndResource: byKind(steadyRequests, steadyWindow.seconds),
      agentRssMiB: summary(agentRss),
    };

    // ------------------------------------------------ rollout
    progress(`rollout: one file of one unit changes on all ${n} nodes`);
    text = oscYaml(1, SHAPE);
    const checksum = sha256Hex(text);
    const r0 = controlPlane();
    // Change 1 rewrites a file of unit 0 (bench-osc.ts): every node restarts that unit.
    const trace = await traceRollout({ cluster, core, audit, agents, secretName, text, checksum, changedUnit: 0 });
    const r1 = controlPlane();
    await Bun.sleep(2_000); // the audit log is written after the response
    const rolloutEvents = agentRequests(r0.at, r1.at);
    const rolloutWindow = window(r0, r1);
    const rolloutRequests = rolloutEvents.filter((e) => e.verb !== "watch");
    result.rollout = {
      ...rolloutWindow,
      secretKiB: round(text.length / 1024, 1),
      // Secret replaced → the Node's checksum annotation PATCHed (audit), per node.
      toNodeAnnotatedMs: trace.at.patched,
      lastNodeMs: trace.at.patched.max,
      agentRequests: rolloutRequests.length,
      agentRequestsPerNode: round(rolloutRequests.length / n, 2),
      byVerbAndResource: byKind(rolloutRequests, rolloutWindow.seconds),
      trace,
    };

    // ------------------------------------------------ per node, and 5,000 nodes
    const perNodeRate = steadyRate / n;
    const perNodeApiserverCores = (steadyWindow.apiserverCores - baseline.apiserverCores) / n;
    const perNodeEtcdCores = (steadyWindow.etcdCores - baseline.etcdCores) / n;
    const rolloutCpuPerNode = ((r1.apiserver - r0.apiserver) - baseline.apiserverCores * rolloutWindow.seconds) / n;
    const secretBytes = Buffer.byteLength(JSON.stringify(secretBody(secretName, text)));
    // What one agent keeps a watch open on: the distinct resources its watch requests named.
    const watched = [...new Set(audit.by(agents[0]?.user ?? "").filter((e) => e.verb === "watch").map((e) => e.objectRef?.resource ?? "?"))].sort();
    const watchesPerAgent = watched.length;
    result.perNode = {
      requestsPerSecond: round(perNodeRate, 4),
      requestsPerHour: round(perNodeRate * 3600, 0),
      apiserverMillicores: round(perNodeApiserverCores * 1000, 3),
      etcdMillicores: round(perNodeEtcdCores * 1000, 3),
      rolloutApiserverCpuMs: round(rolloutCpuPerNode * 1000, 1),
    };
    result.extrapolated = {
      nodes: TARGET,
      note: "linear in the node count: every agent's requests are its own (no list of all nodes, no shared watch); the API server's own baseline added once",
      requestsPerSecond: `${round(perNodeRate, 4)} req/s per node × ${TARGET} = ${round(perNodeRate * TARGET, 1)} req/s`,
      apiserverCores: `${round(baseline.apiserverCores, 3)} idle + ${round(perNodeApiserverCores * 1000, 3)} m per node × ${TARGET} = ${round(baseline.apiserverCores + perNodeApiserverCores * TARGET, 2)} cores`,
      etcdCores: `${round(baseline.etcdCores, 3)} idle + ${round(perNodeEtcdCores * 1000, 3)} m per node × ${TARGET} = ${round(baseline.etcdCores + perNodeEtcdCores * TARGET, 2)} cores`,
      openWatches: `${watchesPerAgent} watches per agent (${watched.join(", ")}) × ${TARGET} = ${watchesPerAgent * TARGET}`,
      rolloutApiserverCpu: `${round(rolloutCpuPerNode * 1000, 1)} ms per node × ${TARGET} = ${round(rolloutCpuPerNode * TARGET, 1)} CPU-seconds, spread over the rollout`,
      rolloutWatchBytes: `one watch event with the Secret (${round(secretBytes / 1024, 1)} KiB as JSON) per node × ${TARGET} = ${round((secretBytes * TARGET) / 1048576, 1)} MiB sent by the API server`,
    };
  }
} finally {
  progress(`stopping ${agents.length} nodes`);
  for (const a of [...agents].reverse()) await a.node.stop().catch((err: unknown) => console.error(`stopping ${a.name}: ${String(err)}`));
  await cluster.stop();
}

// A run with a changed agent environment is a variant, kept beside the plain one, not over it.
const saved = saveResult(`${MODE === "rollout" ? "fleet-rollout" : "fleet"}${Object.keys(AGENT_ENV).length > 0 ? "-agent-env" : ""}`, result, result.date as string);
if (MODE === "rollout") {
  const scenarios = result.scenarios as ScenarioResult[];
  console.error(
    [
      "",
      `${"scenario".padEnd(22)} ${"k".padStart(3)} ${"nodes".padStart(5)} ${"max slot holders".padStart(16)} ${"max disrupted".padStart(13)} ${"nodes touched".padStart(13)} ${"duration".padStart(9)} ${"N/k × per node".padStart(15)}`,
      ...scenarios.map((x) => `${x.name.padEnd(22)} ${String(x.k).padStart(3)} ${String(x.nodes).padStart(5)} ${String(x.maxConcurrentSlotHolders).padStart(16)} ${String(x.maxConcurrentlyDisrupted).padStart(13)} ${String(x.nodesTouched).padStart(13)} ${`${x.durationS} s`.padStart(9)} ${x.idealS !== undefined ? `${x.idealS} s (${x.perNodeS} s)`.padStart(15) : "".padStart(15)}`),
      ...scenarios.flatMap((x) => x.notes.map((note) => `  ${x.name}: ${note}`)),
      `written to ${saved} and docs/fleet-rollout.svg`,
    ].join("\n"),
  );
  process.exit(0);
}
const r = result as { steady: { nodes: number; agentRequestsPerSecond: number; apiserverCores: number; etcdCores: number }; baseline: { apiserverCores: number }; rollout: { lastNodeMs: number; toNodeAnnotatedMs: { median: number }; trace: Awaited<ReturnType<typeof traceRollout>> }; extrapolated: Record<string, string> };
console.error(
  [
    "",
    `${r.steady.nodes} nodes: ${r.steady.agentRequestsPerSecond} agent requests/s, kube-apiserver ${r.steady.apiserverCores} cores (idle ${r.baseline.apiserverCores}), etcd ${r.steady.etcdCores} cores`,
    `rollout to all: median ${r.rollout.toNodeAnnotatedMs.median} ms, last node ${r.rollout.lastNodeMs} ms`,
    `rollout per phase (median ms): ${Object.entries(r.rollout.trace.phases).map(([k, v]) => `${k} ${v?.median ?? "?"}`).join(", ")}`,
    `rollout CPU: ${JSON.stringify(r.rollout.trace.cpu)}`,
    ...Object.entries(r.extrapolated).map(([k, v]) => `${TARGET} nodes, ${k}: ${v}`),
    `written to ${saved}`,
  ].join("\n"),
);
