// What the control-plane and environment fault scenarios share (apiserver-down, etcd-down, registry-down,
// clock-jump, hostname-change): a real control plane and one systemd node running the compiled agent with
// a small OSC (two long-running units), and the checks every scenario makes after its fault — no managed
// unit restarted (MainPID, NRestarts, ActiveEnterTimestampMonotonic), the agent ready and its Lease renewed
// again, and a Secret change applied.
import { readFileSync } from "node:fs";
import { CoordinationV1Api } from "@kubernetes/client-node";
import { stringify } from "yaml";
import { type AgentNode, putOscSecret, startAgentNode, waitApplied } from "../harness/agent.ts";
import { upstream } from "../harness/bare-node.ts";
import { type Cluster, startCluster } from "../harness/cluster.ts";
import { waitFor } from "../harness/exec.ts";
import { mirrorHostsToml } from "../harness/kubelet-config.ts";
import type { Node } from "../harness/node.ts";
import { type Registry, startRegistry } from "../harness/registry.ts";

export const agentUnit = "gardener-node-agent.service";
/** The OSC's units: nothing in these scenarios may restart them. */
export const oscUnits = ["chaos-steady.service", "chaos-ticker.service"];
/** A file of the OSC no unit lists in its filePaths: changing it is a Secret change that restarts nothing. */
export const markerPath = "/etc/chaos/marker";
export const toolPath = "/opt/chaos/tool";

// Two long-running units that listen on nothing: the nodes share the host's network with every other
// test running at the same time, and a unit bound to a fixed port would fail against theirs.
const baseOsc = {
  apiVersion: "extensions.gardener.cloud/v1alpha1",
  kind: "OperatingSystemConfig",
  metadata: { name: "chaos", namespace: "kube-system" },
  spec: {
    type: "debian",
    purpose: "reconcile",
    units: [
      {
        name: "chaos-steady.service",
        command: "start",
        enable: true,
        content: "[Unit]\nDescription=chaos: a steady unit\n[Service]\nExecStart=/bin/sleep infinity\n[Install]\nWantedBy=multi-user.target\n",
        dropIns: [{ name: "10-restart.conf", content: "[Service]\nRestart=always\nRestartSec=1\n" }],
        filePaths: ["/etc/chaos/steady.conf"],
      },
      {
        name: "chaos-ticker.service",
        command: "start",
        enable: true,
        content: "[Unit]\nDescription=chaos: a ticker\n[Service]\nExecStart=/bin/sh -c 'while :; do cat /etc/chaos/ticker; sleep 5; done'\n[Install]\nWantedBy=multi-user.target\n",
        filePaths: ["/etc/chaos/ticker"],
      },
    ],
    files: [
      { path: "/etc/chaos/steady.conf", permissions: 0o644, content: { inline: { encoding: "", data: "steady\n" } } },
      { path: "/etc/chaos/ticker", permissions: 0o644, content: { inline: { encoding: "b64", data: "dGljawo=" } } },
    ] as unknown[],
  },
};

/** The base OSC plus the marker file holding `marker`, and with `image` an imageRef file at toolPath. */
export function chaosOsc(marker: string, image?: string): string {
  const osc = structuredClone(baseOsc);
  osc.spec.files.push({ path: markerPath, permissions: 0o644, content: { inline: { encoding: "", data: `${marker}\n` } } });
  if (image) osc.spec.files.push({ path: toolPath, permissions: 0o755, content: { imageRef: { image, filePathInImage: "/tool" } } });
  return stringify(osc);
}

export type Rig = {
  cluster: Cluster;
  agent: AgentNode;
  node: Node;
  secretName: string;
  registry?: Registry;
  /** Writes the Secret (through `via`, default the cluster's own API server) and returns its checksum. */
  putOsc(marker: string, o?: { image?: string; via?: Pick<Cluster, "admin"> }): Promise<string>;
  stop(): Promise<void>;
};

export type RigOptions = {
  prefix: string;
  /** Start an OCI registry too, mirrored in the node for registry.example.invalid. */
  registry?: boolean;
  /** Called after the node is set up and before the agent starts (e.g. a drop-in for its unit). */
  beforeStart?: (node: Node) => Promise<void>;
};

export async function startRig(o: RigOptions): Promise<Rig> {
  const secretName = `osc-chaos-${o.prefix}`;
  const cluster = await startCluster({ controllerManager: false });
  let registry: Registry | undefined;
  let agent: AgentNode | undefined;
  const stop = async () => {
    await agent?.node.stop();
    await registry?.stop();
    await cluster.stop();
  };
  try {
    if (o.registry) registry = await startRegistry();
    agent = await startAgentNode(cluster, { prefix: o.prefix, secretName, start: false });
    if (registry) await agent.node.writeFile(`/etc/containerd/certs.d/${upstream}/hosts.toml`, mirrorHostsToml(upstream, registry.host), 0o644);
    await o.beforeStart?.(agent.node);
    await agent.node.execOk(["systemctl", "enable", "--now", agentUnit]);
    const putOsc: Rig["putOsc"] = (marker, p = {}) => putOscSecret({ ...cluster, ...p.via }, secretName, chaosOsc(marker, p.image));
    await waitApplied(agent, await putOsc("start"), 60_000);
    return { cluster, agent, node: agent.node, secretName, registry, putOsc, stop };
  } catch (err) {
    await stop();
    throw err;
  }
}

// ---------------------------------------------------------------- units

export type UnitState = { MainPID: string; NRestarts: string; ActiveEnterTimestampMonotonic: string };
const unitProps = ["MainPID", "NRestarts", "ActiveEnterTimestampMonotonic"] as const;

export async function unitStates(node: Node, units = [...oscUnits, agentUnit]): Promise<Record<string, UnitState>> {
  const states: Record<string, UnitState> = {};
  for (const unit of units) {
    const lines = (await node.execOk(["systemctl", "show", `--property=${unitProps.join(",")}`, unit])).trim().split("\n");
    const props = Object.fromEntries(lines.map((l) => [l.slice(0, l.indexOf("=")), l.slice(l.indexOf("=") + 1)]));
    states[unit] = { MainPID: props.MainPID ?? "?", NRestarts: props.NRestarts ?? "?", ActiveEnterTimestampMonotonic: props.ActiveEnterTimestampMonotonic ?? "?" };
  }
  return states;
}

/** One line per unit whose process changed between two snapshots (MainPID "0" counts: the unit is not running). */
export function unitRestarts(before: Record<string, UnitState>, after: Record<string, UnitState>): string[] {
  const changed: string[] = [];
  for (const [unit, b] of Object.entries(before)) {
    const a = after[unit];
    if (!a) continue;
    const diffs = unitProps.filter((p) => a[p] !== b[p]).map((p) => `${p} ${b[p]} → ${a[p]}`);
    if (diffs.length > 0 || a.MainPID === "0") changed.push(`${unit} ${diffs.length > 0 ? diffs.join(", ") : "not running"}`);
  }
  return changed;
}

// ---------------------------------------------------------------- the agent's own view

const curl = (node: Node, port: number, path: string) => node.exec(["curl", "-s", "-m", "5", "-o", "/dev/null", "-w", "%{http_code}", `http://127.0.0.1:${port}${path}`]);

/** Waits until the agent's /readyz answers 200 (every component reports ok); returns the ms it took. */
export async function waitAgentReady(rig: Rig, timeoutMs: number): Promise<number> {
  const started = performance.now();
  try {
    await waitFor(`${rig.agent.name}: /readyz 200`, async () => (await curl(rig.node, rig.agent.healthPort, "/readyz")).stdout === "200", timeoutMs, 250);
  } catch (err) {
    // The reasons /readyz gives name the component that is not ok.
    const body = (await rig.node.exec(["curl", "-s", "-m", "5", `http://127.0.0.1:${rig.agent.healthPort}/readyz`])).stdout.trim();
    throw new Error(`${err instanceof Error ? err.message : String(err)}; /readyz says: ${body.slice(0, 500)}`);
  }
  return Math.round(performance.now() - started);
}

/** A sample of the agent's /metrics (an unlabelled series), or undefined. */
export async function agentMetric(rig: Rig, series: string): Promise<number | undefined> {
  const text = (await rig.node.exec(["curl", "-s", "-m", "5", `http://127.0.0.1:${rig.agent.metricsPort}/metrics`])).stdout;
  const line = text.split("\n").find((l) => l.startsWith(`${series} `));
  return line === undefined ? undefined : Number(line.slice(series.length + 1));
}

/**
 * The Lease renewals that failed since the counter read `before`, waiting up to `timeoutMs` for the first
 * (0 if none came): a renewal sent just before the fault fails only when its request times out, 10 s later.
 */
export async function renewFailuresSince(rig: Rig, before: number, timeoutMs: number): Promise<number> {
  const failures = async () => ((await agentMetric(rig, "trellis_lease_renew_failures_total")) ?? 0) - before;
  return await waitFor("a failed Lease renewal", async () => {
    const n = await failures();
    return n >= 1 ? n : undefined;
  }, timeoutMs, 250).catch(() => failures());
}

export async function leaseRenewTime(rig: Rig): Promise<string | undefined> {
  const leases = rig.cluster.admin().makeApiClient(CoordinationV1Api);
  const lease = await leases.readNamespacedLease({ name: `gardener-node-agent-${rig.agent.name}`, namespace: "kube-system" });
  return lease.spec?.renewTime === undefined ? undefined : new Date(lease.spec.renewTime).toISOString();
}

/** Waits until the Lease's renewTime differs from `previous`; returns the new one and the ms waited. */
export async function waitLeaseRenewed(rig: Rig, previous: string | undefined, timeoutMs: number): Promise<{ renewTime: string; ms: number }> {
  const started = performance.now();
  const renewTime = await waitFor(`${rig.agent.name}: its Lease renewed`, async () => {
    const t = await leaseRenewTime(rig);
    return t !== undefined && t !== previous ? t : undefined;
  }, timeoutMs, 250);
  return { renewTime, ms: Math.round(performance.now() - started) };
}

/** Writes the Secret with a new marker and waits until the agent applied it and the file is on the node; returns the ms. */
export async function applyChange(rig: Rig, marker: string, timeoutMs: number, o: Parameters<Rig["putOsc"]>[1] = {}): Promise<number> {
  const started = performance.now();
  await waitApplied(rig.agent, await rig.putOsc(marker, o), timeoutMs, 250);
  const onDisk = (await rig.node.readFile(markerPath)).trim();
  if (onDisk !== marker) throw new Error(`${markerPath} holds ${JSON.stringify(onDisk)}, not ${JSON.stringify(marker)}`);
  return Math.round(performance.now() - started);
}

/**
 * When the agent's watch of its OSC Secret was received by the API server after `since` (ms since the
 * epoch), from the audit log (ResponseStarted of a watch by the agent's user): the moment it reconnected.
 */
export function waitSecretWatch(rig: Rig, since: number, timeoutMs: number, auditLog = rig.cluster.auditLog): Promise<number> {
  return waitFor(`${rig.agent.name}: a watch of its Secret after ${new Date(since).toISOString()}`, () => {
    for (const line of readFileSync(auditLog, "utf8").split("\n")) {
      if (!line.includes('"verb":"watch"') || !line.includes(rig.agent.user) || !line.includes('"resource":"secrets"')) continue;
      const e = JSON.parse(line) as { stage: string; user: { username: string }; requestReceivedTimestamp: string };
      const at = Date.parse(e.requestReceivedTimestamp);
      if (e.stage === "ResponseStarted" && e.user.username === rig.agent.user && at >= since) return at;
    }
    return undefined;
  }, timeoutMs, 250);
}

/** The agent's journal (its JSON log lines) since `since` (ms since the epoch, the host's clock). */
export async function agentJournal(node: Node, since: number): Promise<string> {
  return node.execOk(["journalctl", "--no-pager", "-o", "cat", "-u", agentUnit, `--since=@${Math.floor(since / 1000)}`]);
}

/** Runs `iterations` injections of one fault; an iteration that throws counts as failed with its message. */
export async function iterate(
  iterations: number,
  log: (line: string) => void,
  one: (i: number) => Promise<string[]>,
): Promise<{ passed: number; failures: string[] }> {
  let passed = 0;
  const failures: string[] = [];
  for (let i = 1; i <= iterations; i++) {
    const problems = await one(i).catch((err: unknown) => [`threw: ${err instanceof Error ? err.message : String(err)}`]);
    if (problems.length === 0) passed++;
    else failures.push(...problems.map((p) => `iteration ${i}: ${p}`));
    log(`iteration ${i}/${iterations}: ${problems.length === 0 ? "ok" : problems.join("; ")}`);
  }
  return { passed, failures };
}

/** Figures over the iterations: the largest value of each (the bound the docs state). */
export function maxFigures(all: Record<string, number>[]): Record<string, number> {
  const out: Record<string, number> = {};
  for (const f of all) for (const [k, v] of Object.entries(f)) out[k] = Math.max(out[k] ?? -Infinity, v);
  return out;
}
