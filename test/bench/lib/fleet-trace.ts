// One rollout to every node of the fleet, traced end to end per node and per phase:
//   Secret replaced (the bench's call) → committed (the API server's audit record of the update)
//   → the agent's watch event (its "OSC Secret changed" log line) → its apply starting ("OSC applied",
//   less the apply's durationMs) → the changed unit's new process started (the unit's own record,
//   test/bench/lib/bench-osc.ts) → the apply finished ("OSC applied") → the Node PATCH that set the
//   checksum annotation received and answered by the API server (audit) → a watch on the Nodes (this
//   bench) seeing the annotation.
// And what the rollout cost in CPU, per process kind: each agent, each node's systemd and journald,
// kube-apiserver, etcd, this bench, and the machine as a whole (other helpers share it): the floor on 2
// cores is that CPU divided by the cores.
// All times are CLOCK_REALTIME of the one host (nodes have no time namespace), in ms after the replace call.
import type { CoreV1Api, V1Node } from "@kubernetes/client-node";
import { type AgentNode, mainPid } from "../../harness/agent.ts";
import type { Cluster } from "../../harness/cluster.ts";
import { waitFor } from "../../harness/exec.ts";
import { watchUntil } from "../../harness/watch.ts";
import { type AuditTail, auditMs } from "./audit.ts";
import { secretBody, starts } from "./bench-osc.ts";
import { journal } from "./journal.ts";
import { busyCores, cpuSecondsAt, hostCpu } from "./proc.ts";
import { ThreadTracker } from "./threads.ts";
import { round, summary, type Summary } from "./stats.ts";

const checksumAnnotation = "checksum/cloud-config-data";
const wallNow = () => performance.timeOrigin + performance.now();

export type TraceInput = {
  cluster: Cluster;
  core: CoreV1Api;
  audit: AuditTail;
  agents: AgentNode[];
  secretName: string;
  /** The new OSC, its checksum, and the index of the one unit it changes. */
  text: string;
  checksum: string;
  changedUnit: number;
};

/** Per node, ms after the replace call; undefined where the record is missing. */
type NodeTrace = {
  node: string;
  seen?: number;
  applyStart?: number;
  unitStarted?: number;
  applied?: number;
  /** The PATCH that set the annotation: received by the API server, and answered (audit). */
  patchReceived?: number;
  patched?: number;
  watched?: number;
  /** Metadata PATCHes of this Node by its agent in the window (1 expected: the checksum annotation). */
  metadataPatches: number;
  agentCpuMs: number;
  /** The agent's CPU from the start of its reconcile to the end of the apply (its "OSC applied" line). */
  reconcileCpuMs?: number;
  systemdCpuMs: number;
  journaldCpuMs: number;
};

type Pids = { agent: number; systemd: number; journald: number };

export async function traceRollout(input: TraceInput) {
  const { cluster, core, audit, agents, checksum } = input;
  const pids: Pids[] = await Promise.all(
    agents.map(async (a) => ({ agent: await mainPid(a, "gardener-node-agent.service"), systemd: 1, journald: await mainPid(a, "systemd-journald.service") })),
  );
  const cpuOf = () =>
    agents.map((a, i) => {
      const p = pids[i] as Pids;
      return { agent: cpuSecondsAt(a.node.root, p.agent), systemd: cpuSecondsAt(a.node.root, p.systemd), journald: cpuSecondsAt(a.node.root, p.journald) };
    });
  const controlPlane = () => {
    const { apiserver, etcd } = cluster.pids();
    if (!apiserver || !etcd) throw new Error("the control plane is not running");
    return { apiserver: cpuSecondsAt("", apiserver), etcd: cpuSecondsAt("", etcd) };
  };
  const benchCpu = () => {
    const u = process.cpuUsage();
    return (u.user + u.system) / 1e6;
  };

  // One watch on all Nodes, open before the change: when each Node first carries the new checksum.
  const watched = new Map<string, number>();
  let listed = 0;
  let open!: () => void;
  const opened = new Promise<void>((resolve) => (open = resolve));
  const names = new Set(agents.map((a) => a.name));
  const allWatched = watchUntil(
    cluster.admin(),
    "every Node annotated with the new checksum",
    "/api/v1/nodes",
    undefined,
    (n: V1Node) => {
      const name = n.metadata?.name ?? "";
      if (!names.has(name)) return undefined;
      if (++listed === names.size) open();
      if (n.metadata?.annotations?.[checksumAnnotation] === checksum && !watched.has(name)) watched.set(name, wallNow());
      return watched.size === names.size ? true : undefined;
    },
    { timeoutMs: 300_000, describe: (n) => `${n.metadata?.name}: ${n.metadata?.annotations?.[checksumAnnotation]}` },
  );
  await opened;

  const threads = agents.map((a, i) => new ThreadTracker(a.node.root, (pids[i] as Pids).agent));
  for (const t of threads) t.start();
  const cpu0 = cpuOf();
  const cp0 = controlPlane();
  const bench0 = benchCpu();
  const host0 = hostCpu();
  const t0 = wallNow();
  await core.replaceNamespacedSecret({ name: input.secretName, namespace: "kube-system", body: secretBody(input.secretName, input.text) });
  const replaceReturned = wallNow() - t0;
  await allWatched;
  const lastWatched = Math.max(...watched.values()) - t0;
  // The window ends when every agent finished its reaction: its Node condition is the last request of it.
  const statusPatched = (a: AgentNode) => audit.by(a.user, t0).some((e) => e.verb === "patch" && e.objectRef?.resource === "nodes" && e.objectRef.subresource === "status");
  await waitFor("every agent to set its Node condition", () => agents.every(statusPatched), 60_000, 100);
  const t1 = wallNow();
  const cpu1 = cpuOf();
  const threadCpu = threads.map((t) => t.finish());
  const cp1 = controlPlane();
  const bench1 = benchCpu();
  const host1 = hostCpu();
  const windowS = (t1 - t0) / 1000;

  const committedEvent = audit
    .poll()
    .find((e) => e.verb === "update" && e.objectRef?.resource === "secrets" && e.objectRef.name === input.secretName && auditMs(e.stageTimestamp) >= t0);
  const committed = committedEvent ? auditMs(committedEvent.stageTimestamp) - t0 : undefined;

  const nodes: NodeTrace[] = await Promise.all(
    agents.map(async (a, i) => {
      const p = pids[i] as Pids;
      const lines = await journal(a.node, p.agent);
      const at = (l: { fields: Record<string, unknown> }) => Date.parse(String(l.fields.ts)) - t0;
      const after = lines.filter((l) => at(l) >= -1);
      const seenLine = after.find((l) => l.msg === "OSC Secret changed");
      const appliedLine = after.find((l) => l.msg === "OSC applied" && l.fields.checksum === checksum);
      const unitStarts = (await starts(a.node, input.changedUnit)).filter((ms) => ms >= t0);
      const patches = audit.by(a.user, t0, t0 + windowS * 1000).filter((e) => e.verb === "patch" && e.objectRef?.resource === "nodes" && !e.objectRef.subresource);
      const w = watched.get(a.name);
      const c0 = cpu0[i] as ReturnType<typeof cpuOf>[number];
      const c1 = cpu1[i] as ReturnType<typeof cpuOf>[number];
      return {
        node: a.name,
        seen: seenLine ? at(seenLine) : undefined,
        applyStart: appliedLine ? at(appliedLine) - Number(appliedLine.fields.durationMs) : undefined,
        unitStarted: unitStarts[0] !== undefined ? unitStarts[0] - t0 : undefined,
        applied: appliedLine ? at(appliedLine) : undefined,
        patchReceived: patches[0] ? auditMs(patches[0].requestReceivedTimestamp) - t0 : undefined,
        patched: patches[0] ? auditMs(patches[0].stageTimestamp) - t0 : undefined,
        watched: w !== undefined ? w - t0 : undefined,
        metadataPatches: patches.length,
        agentCpuMs: (c1.agent - c0.agent) * 1000,
        reconcileCpuMs: appliedLine && typeof appliedLine.fields.cpuMs === "number" ? appliedLine.fields.cpuMs : undefined,
        systemdCpuMs: (c1.systemd - c0.systemd) * 1000,
        journaldCpuMs: (c1.journald - c0.journald) * 1000,
      };
    }),
  );

  // Each phase per node: from one record to the next.
  const phase = (from: (n: NodeTrace) => number | undefined, to: (n: NodeTrace) => number | undefined): Summary | undefined => {
    const xs = nodes.flatMap((n) => {
      const a = from(n);
      const b = to(n);
      return a !== undefined && b !== undefined ? [b - a] : [];
    });
    return xs.length ? summary(xs) : undefined;
  };
  // The agents' CPU by thread (the runtime's JIT compiler, GC, file system and HTTP threads beside
  // the JavaScript thread), summed over the agents.
  const byThread = new Map<string, number>();
  const add = (key: string, s: number) => byThread.set(key, (byThread.get(key) ?? 0) + s);
  for (const t of threadCpu) {
    // One name for the main thread, whatever the binary is called (its comm is cut to 15 characters).
    for (const [role, s] of Object.entries(t.byThread)) add(role.startsWith("gardener-node") || role.startsWith("trellis") ? "main (JavaScript)" : role, s);
    add("threads that ended", t.unattributed);
  }
  const sum = (xs: number[]) => xs.reduce((s, x) => s + x, 0);
  const cpu = {
    agentsS: round(sum(nodes.map((n) => n.agentCpuMs)) / 1000, 2),
    perAgentMs: summary(nodes.map((n) => n.agentCpuMs)),
    // Of that, until the end of the apply (before the Node PATCH): the rest is the report and what follows it.
    perAgentToAppliedMs: nodes.some((n) => n.reconcileCpuMs !== undefined) ? summary(nodes.flatMap((n) => (n.reconcileCpuMs !== undefined ? [n.reconcileCpuMs] : []))) : undefined,
    agentsByThreadS: Object.fromEntries([...byThread].filter(([, s]) => s >= 0.005).sort((x, y) => y[1] - x[1]).map(([k, s]) => [k, round(s, 2)])),
    systemdS: round(sum(nodes.map((n) => n.systemdCpuMs)) / 1000, 2),
    journaldS: round(sum(nodes.map((n) => n.journaldCpuMs)) / 1000, 2),
    apiserverS: round(cp1.apiserver - cp0.apiserver, 2),
    etcdS: round(cp1.etcd - cp0.etcd, 2),
    benchS: round(bench1 - bench0, 2),
    hostBusyCores: busyCores(host0, host1),
  };
  const rolloutCpuS = cpu.agentsS + cpu.systemdS + cpu.journaldS + cpu.apiserverS + cpu.etcdS;
  // What had to run before the last Node could be annotated: every agent's reconcile up to the end of its
  // apply (its own count), and the rest of the rollout's CPU but the agents' (generous: the control plane's
  // work for the events and conditions after the annotation is in it too).
  const toAppliedS = sum(nodes.map((n) => n.reconcileCpuMs ?? n.agentCpuMs)) / 1000;
  const toAnnotatedCpuS = toAppliedS + rolloutCpuS - cpu.agentsS;
  const hostBusyS = cpu.hostBusyCores * windowS;
  return {
    nodes: nodes.length,
    windowS: round(windowS, 2),
    replaceCallMs: round(replaceReturned),
    committedMs: committed !== undefined ? round(committed) : undefined,
    lastWatchedMs: round(lastWatched),
    metadataPatchesPerNode: summary(nodes.map((n) => n.metadataPatches), 0),
    // When each record happened, ms after the replace call.
    at: {
      seen: summary(nodes.flatMap((n) => (n.seen !== undefined ? [n.seen] : []))),
      applyStart: summary(nodes.flatMap((n) => (n.applyStart !== undefined ? [n.applyStart] : []))),
      unitStarted: summary(nodes.flatMap((n) => (n.unitStarted !== undefined ? [n.unitStarted] : []))),
      applied: summary(nodes.flatMap((n) => (n.applied !== undefined ? [n.applied] : []))),
      patched: summary(nodes.flatMap((n) => (n.patched !== undefined ? [n.patched] : []))),
      watched: summary(nodes.flatMap((n) => (n.watched !== undefined ? [n.watched] : []))),
    },
    // How long each step took per node.
    phases: {
      delivery: committed !== undefined ? phase(() => committed, (n) => n.seen) : undefined,
      toApplyStart: phase((n) => n.seen, (n) => n.applyStart),
      applyToUnitStarted: phase((n) => n.applyStart, (n) => n.unitStarted),
      unitStartedToApplied: phase((n) => n.unitStarted, (n) => n.applied),
      appliedToPatchReceived: phase((n) => n.applied, (n) => n.patchReceived),
      patchInApiServer: phase((n) => n.patchReceived, (n) => n.patched),
      patchedToWatched: phase((n) => n.patched, (n) => n.watched),
    },
    cpu: {
      ...cpu,
      rolloutS: round(rolloutCpuS, 2),
      // What ran on the machine besides the rollout (other helpers' work, this bench).
      otherS: round(hostBusyS - rolloutCpuS, 2),
      // The CPU divided by the 2 cores: when the last node could be done (annotated) had nothing else run
      // and nothing waited. With every agent served alike (the kernel's fair share), the median is there too.
      floorOn2CoresMs: round((rolloutCpuS / 2) * 1000),
      floorAnnotatedOn2CoresMs: round((toAnnotatedCpuS / 2) * 1000),
    },
    perNode: nodes.map((n) => Object.fromEntries(Object.entries(n).map(([k, v]) => [k, typeof v === "number" ? round(v) : v]))),
  };
}
