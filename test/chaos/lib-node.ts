// What the node-fault scenarios (test/chaos/scenarios/agent-kill9.ts, agent-sigterm.ts, dbus-restart.ts,
// disk-full.ts) share: a real control plane and a real node running the compiled agent under its systemd
// unit, a large OSC whose every file, mode and unit the test knows, one look at the node that compares
// it with that OSC, and a watch that counts how often the Node's checksum annotation changed.
import { createHash } from "node:crypto";
import { existsSync } from "node:fs";
import { type KubeConfig, type V1Node, Watch } from "@kubernetes/client-node";
import { stringify } from "yaml";
import { type AgentNode, putOscSecret, startAgentNode } from "../harness/agent.ts";
import { type Cluster, startCluster } from "../harness/cluster.ts";
import { waitFor } from "../harness/exec.ts";
import type { Node } from "../harness/node.ts";
import { prng } from "../harness/prng.ts";

export const agentUnitName = "gardener-node-agent.service";
const statePath = "/var/lib/gardener-node-agent/trellis/state.json";
const checksumAnnotation = "checksum/cloud-config-data";
const sha = (b: string | Uint8Array) => createHash("sha256").update(b).digest("hex");

// ---------------------------------------------------------------------------------------------------
// The OSC: hundreds of files in several directories with varied modes, files that come and go, two
// larger base64 files, and units that record, each time they start, the content of the file they list.

const bulkCount = 300;
const modes = [0o644, 0o600, 0o640, 0o755, 0o400, 0o444, 0o750];
/** A directory the disk-full scenario mounts a small tmpfs on; its files come first in the OSC. */
export const fullDir = "/etc/chaos/full";
/** Where the units append the sha256 of their listed file each time they start (one file per unit). */
const startsDir = "/run/chaos-starts";
/** Never changes: its unit must never restart. */
const steadyUnit = "chaos-steady.service";
/** Each lists a file that changes in every version; w0's unit file changes in every version too. */
const workerUnits = ["chaos-w0.service", "chaos-w1.service", "chaos-w2.service"];

export type DesiredFile = { path: string; mode: number; sha256: string };
export type ChaosOsc = {
  version: number;
  yaml: string;
  checksum: string;
  files: Map<string, DesiredFile>;
  /** Unit name → the sha256 of its unit file and of the file it lists. */
  units: Map<string, { unitFileSha: string; listedSha: string }>;
};

/** `full[j]`: the generation of full-dir file j (3 pages each); none without a disk-full scenario. */
export function chaosOsc(version: number, full: number[] = []): ChaosOsc {
  const files: { path: string; permissions: number; content: { inline: { encoding: string; data: string } } }[] = [];
  const desired = new Map<string, DesiredFile>();
  const add = (path: string, mode: number, bytes: string | Uint8Array, encoding: "" | "b64" = "") => {
    const data = encoding === "b64" ? Buffer.from(bytes).toString("base64") : (bytes as string);
    files.push({ path, permissions: mode, content: { inline: { encoding, data } } });
    desired.set(path, { path, mode, sha256: sha(bytes) });
  };
  full.forEach((gen, j) => add(`${fullDir}/g${j}`, 0o644, `full ${j} generation ${gen}\n`.padEnd(12_000, "f")));
  for (let i = 0; i < bulkCount; i++) {
    // Every tenth file keeps its content and changes only its mode; all modes move on each version.
    const gen = i % 10 === 0 ? 0 : version;
    add(`/etc/chaos/d${i % 4}/f${i}`, modes[(i + version) % modes.length] as number, `bulk ${i} generation ${gen}\n${"x".repeat((i * 37) % 2000)}\n`);
  }
  if (version % 2 === 0) for (let j = 0; j < 20; j++) add(`/opt/chaos/extra/e${j}`, 0o644, `extra ${j}\n`);
  for (let k = 0; k < 2; k++) {
    const r = prng(version * 10 + k);
    add(`/opt/chaos/big${k}`, 0o600, Uint8Array.from({ length: 48_000 }, () => r.int(256)), "b64");
  }
  add("/etc/chaos/steady.conf", 0o644, "steady\n");

  const listed = (unit: string) => (unit === steadyUnit ? "/etc/chaos/steady.conf" : `/etc/chaos/d${(bulkCount - 1 - workerUnits.indexOf(unit)) % 4}/f${bulkCount - 1 - workerUnits.indexOf(unit)}`);
  const units = [steadyUnit, ...workerUnits].map((name) => {
    const file = listed(name);
    // No `$` or `%` (systemd would expand them); the restart limit is off: runs restart units hundreds of times.
    const content = `[Unit]
StartLimitIntervalSec=0
[Service]
${name === "chaos-w0.service" ? `Environment=GENERATION=${version}\n` : ""}ExecStartPre=/bin/mkdir -p ${startsDir}
ExecStart=/bin/sh -c 'sha256sum < ${file} >> ${startsDir}/${name}; exec sleep infinity'
[Install]
WantedBy=multi-user.target
`;
    return { name, file, content };
  });
  const yaml = stringify({
    apiVersion: "extensions.gardener.cloud/v1alpha1",
    kind: "OperatingSystemConfig",
    spec: {
      type: "debian",
      purpose: "reconcile",
      units: units.map((u) => ({ name: u.name, command: "start", enable: true, content: u.content, filePaths: [u.file] })),
      files,
    },
  });
  const unitShas = new Map(units.map((u) => [u.name, { unitFileSha: sha(u.content), listedSha: desired.get(u.file)?.sha256 as string }]));
  return { version, yaml, checksum: sha(yaml), files: desired, units: unitShas };
}

// ---------------------------------------------------------------------------------------------------
// The node as it is.

export type NodeLook = {
  files: Map<string, { mode: number; uid: number; gid: number; sha256: string }>;
  temps: string[];
  units: Map<string, { active: string; mainPid: number; unitFileMode: number; unitFileSha: string; starts: number; lastStartSha: string }>;
  /** The agent's state file still holds an unfinished plan. */
  unfinished: boolean;
  agentPid: number;
};

const lookScript = `
cd /
temps() { for d in /etc/chaos /opt/chaos /etc/systemd/system /var/lib/gardener-node-agent /run/trellis; do find $d -name '*.trellis-tmp-*' 2>/dev/null; done | sort; }
# A temp file of a write in flight (the agent writes its status file now and then) is gone a moment
# later, and the next one has another name: only one that is still there on a second look was left behind.
first=$(temps)
[ -z "$first" ] || temps | comm -12 - <(echo "$first") | sed 's/^/TEMP /'
find /etc/chaos /opt/chaos -type f -printf 'FILE %m %U %G %p\\n' 2>/dev/null
find /etc/chaos /opt/chaos -type f -print0 2>/dev/null | xargs -0 -r sha256sum | sed 's/^/SHA /'
for u in ${[steadyUnit, ...workerUnits].join(" ")}; do
  f=/etc/systemd/system/$u
  echo "UNIT $u $(systemctl is-active $u) $(systemctl show -P MainPID $u) $(stat -c %a $f 2>/dev/null || echo -) $(sha256sum < $f 2>/dev/null | cut -c1-64) $(cat ${startsDir}/$u 2>/dev/null | wc -l) $(tail -n1 ${startsDir}/$u 2>/dev/null | cut -c1-64)"
done
echo "UNFINISHED $(grep -c '"progress"' ${statePath} 2>/dev/null)"
echo "AGENT $(systemctl show -P MainPID ${agentUnitName})"
`;

export async function lookAtNode(node: Node): Promise<NodeLook> {
  const out = await node.execOk(["bash", "-c", lookScript], { timeoutMs: 60_000 });
  const look: NodeLook = { files: new Map(), temps: [], units: new Map(), unfinished: false, agentPid: 0 };
  const shas = new Map<string, string>();
  for (const line of out.split("\n")) {
    const [kind, ...f] = line.split(" ");
    if (kind === "TEMP") look.temps.push(f[0] as string);
    else if (kind === "FILE") look.files.set(f[3] as string, { mode: Number.parseInt(f[0] as string, 8), uid: Number(f[1]), gid: Number(f[2]), sha256: "" });
    else if (kind === "SHA") shas.set(f[2] as string, f[0] as string); // "SHA <sha>  <path>"
    else if (kind === "UNIT") {
      const [name, active, pid, mode, fileSha, starts, last] = f as string[];
      look.units.set(name as string, { active: active as string, mainPid: Number(pid), unitFileMode: Number.parseInt(mode as string, 8), unitFileSha: fileSha ?? "", starts: Number(starts), lastStartSha: last ?? "" });
    } else if (kind === "UNFINISHED") look.unfinished = Number(f[0]) > 0;
    else if (kind === "AGENT") look.agentPid = Number(f[0]);
  }
  for (const [path, file] of look.files) file.sha256 = shas.get(path) ?? "";
  return look;
}

/**
 * How the node differs from `want` (empty: exactly the desired state): every file with its bytes, mode
 * and owner (root), no other file, no temp file, the unit files, every unit active and last started with
 * the content its listed file has now. `foreign`: paths other tools own there (not compared).
 */
export function differences(look: NodeLook, want: ChaosOsc, foreign: string[] = []): string[] {
  const out: string[] = [];
  for (const t of look.temps) out.push(`temp file left: ${t}`);
  for (const [path, d] of want.files) {
    const f = look.files.get(path);
    if (!f) out.push(`missing ${path}`);
    else {
      if (f.sha256 !== d.sha256) out.push(`${path}: content ${f.sha256.slice(0, 12)}, want ${d.sha256.slice(0, 12)} (torn or stale)`);
      if (f.mode !== d.mode) out.push(`${path}: mode 0${f.mode.toString(8)}, want 0${d.mode.toString(8)}`);
      if (f.uid !== 0 || f.gid !== 0) out.push(`${path}: owner ${f.uid}:${f.gid}, want 0:0`);
    }
  }
  for (const path of look.files.keys()) if (!want.files.has(path) && !foreign.includes(path) && !look.temps.includes(path)) out.push(`unexpected file ${path}`);
  for (const [name, u] of want.units) {
    const l = look.units.get(name);
    if (!l) out.push(`unit ${name} not looked at`);
    else {
      if (l.unitFileSha !== u.unitFileSha) out.push(`unit file of ${name}: content ${l.unitFileSha.slice(0, 12)}, want ${u.unitFileSha.slice(0, 12)}`);
      if (l.unitFileMode !== 0o600) out.push(`unit file of ${name}: mode 0${l.unitFileMode.toString(8)}, want 0600`);
      if (l.active !== "active") out.push(`unit ${name} is ${l.active}`);
      if (l.lastStartSha !== u.listedSha) out.push(`unit ${name} last started with ${l.lastStartSha.slice(0, 12) || "nothing"}, its file is ${u.listedSha.slice(0, 12)} now`);
    }
  }
  if (look.unfinished) out.push("the agent's state still holds an unfinished plan");
  return out;
}

/**
 * The unit starts between two looks that were not owed: the steady unit must never start again; a unit
 * whose listed file did not change must not restart; with `exactlyOnce`, a changed one starts exactly once.
 */
export function unexpectedStarts(before: NodeLook, after: NodeLook, from: ChaosOsc, to: ChaosOsc, exactlyOnce: boolean): string[] {
  const out: string[] = [];
  for (const [name, u] of to.units) {
    const n = (after.units.get(name)?.starts ?? 0) - (before.units.get(name)?.starts ?? 0);
    const owed = from.units.get(name)?.listedSha !== u.listedSha || from.units.get(name)?.unitFileSha !== u.unitFileSha;
    if (!owed && n !== 0) out.push(`unit ${name} started ${n} time(s) though nothing of it changed`);
    if (owed && exactlyOnce && n !== 1) out.push(`unit ${name} started ${n} time(s), want exactly 1`);
    if (owed && n < 1) out.push(`unit ${name} was not restarted though its file changed`);
  }
  return out;
}

/** Restarts a unit got beyond the one owed (kill -9 between a restart and its checkpoint redoes it). */
function redoneRestarts(before: NodeLook, after: NodeLook, from: ChaosOsc, to: ChaosOsc): number {
  let n = 0;
  for (const [name, u] of to.units) {
    const owed = from.units.get(name)?.listedSha !== u.listedSha || from.units.get(name)?.unitFileSha !== u.unitFileSha;
    n += Math.max(0, (after.units.get(name)?.starts ?? 0) - (before.units.get(name)?.starts ?? 0) - (owed ? 1 : 0));
  }
  return n;
}

// ---------------------------------------------------------------------------------------------------
// The Node's checksum annotation, watched: every change of its value is one entry, in order.

export type AnnotationWatch = {
  changes: string[];
  /** Resolves once the annotation holds `value`. */
  until(value: string, timeoutMs: number): Promise<void>;
  stop(): void;
};

function watchChecksumAnnotation(kc: KubeConfig, nodeName: string): AnnotationWatch {
  const changes: string[] = [];
  let current: string | undefined;
  let stopped = false;
  let abort: AbortController | undefined;
  let resourceVersion: string | undefined;
  const waiters = new Set<() => void>();
  const open = async (): Promise<void> => {
    try {
      abort = await new Watch(kc).watch(
        "/api/v1/nodes",
        { fieldSelector: `metadata.name=${nodeName}`, ...(resourceVersion ? { resourceVersion } : {}) },
        (phase, n: V1Node) => {
          if (phase !== "ADDED" && phase !== "MODIFIED") return;
          resourceVersion = n.metadata?.resourceVersion;
          const value = n.metadata?.annotations?.[checksumAnnotation];
          if (value === current) return;
          current = value;
          if (value !== undefined) changes.push(value);
          for (const w of waiters) w();
        },
        (err) => {
          // A resourceVersion too old to resume from: start over from the Node as it is.
          if (err && String(err).includes("410")) resourceVersion = undefined;
          reopen();
        },
      );
      if (stopped) abort.abort();
    } catch {
      resourceVersion = undefined;
      reopen();
    }
  };
  const reopen = () => void (stopped || setTimeout(() => void open(), 200));
  void open();
  return {
    changes,
    until: (value, timeoutMs) =>
      new Promise<void>((resolve, reject) => {
        const check = () => {
          if (current !== value) return;
          cleanup();
          resolve();
        };
        const timer = setTimeout(() => {
          cleanup();
          reject(new Error(`timed out after ${timeoutMs} ms waiting for the Node's ${checksumAnnotation} to become ${value.slice(0, 12)} (it is ${current?.slice(0, 12) ?? "unset"})`));
        }, timeoutMs);
        const cleanup = () => {
          clearTimeout(timer);
          waiters.delete(check);
        };
        waiters.add(check);
        check();
      }),
    stop: () => {
      stopped = true;
      abort?.abort();
    },
  };
}

// ---------------------------------------------------------------------------------------------------
// The rig: control plane, node, agent, annotation watch; the first OSC applied.

export type Rig = {
  cluster: Cluster;
  agent: AgentNode;
  node: Node;
  annotation: AnnotationWatch;
  put(osc: ChaosOsc): Promise<void>;
  stop(): Promise<void>;
};

/** `prepare` runs in the node before the agent first starts (e.g. mounting a tmpfs). */
export async function startRig(prefix: string, first: ChaosOsc, prepare: (node: Node) => Promise<void> = async () => {}): Promise<Rig> {
  const secretName = `gardener-node-agent-${prefix}`;
  const cluster = await startCluster({ controllerManager: false });
  let agent: AgentNode | undefined;
  let annotation: AnnotationWatch | undefined;
  const stop = async () => {
    annotation?.stop();
    await agent?.node.stop();
    await cluster.stop();
  };
  try {
    agent = await startAgentNode(cluster, { prefix, secretName, start: false });
    await prepare(agent.node);
    annotation = watchChecksumAnnotation(cluster.admin(), agent.name);
    const put = async (osc: ChaosOsc) => {
      await putOscSecret(cluster, secretName, osc.yaml);
    };
    await put(first);
    await agent.node.execOk(["systemctl", "enable", "--now", agentUnitName]);
    await annotation.until(first.checksum, 120_000);
    return { cluster, agent, node: agent.node, annotation, put, stop };
  } catch (err) {
    await stop();
    throw err;
  }
}

export type Injection = {
  /** The apply had finished before the fault landed (it hit an idle agent). */
  missed: boolean;
  /** The agent's state held an unfinished plan right after the fault. */
  interrupted: boolean;
  /** Lines the fault printed (`KEY value`). */
  output: Map<string, string>;
};

/**
 * Puts `osc` into the Secret and runs `fault` (shell, inside the node, `$pid` the agent's main PID, `$t0`
 * the instant in ns the plan was seen persisted)
 * `delayMs` after the agent persisted its plan for it: inside the node, so the instant is exact to the
 * millisecond however slow the API round trips are.
 */
async function injectDuringApply(rig: Rig, osc: ChaosOsc, delayMs: number, fault: string): Promise<Injection> {
  const armed = "/run/chaos-armed";
  const script = `
pid=$(systemctl show -P MainPID ${agentUnitName})
[ "$pid" -gt 0 ] || { echo "the agent is not running" >&2; exit 3; }
touch ${armed}
missed=0
until grep -q '"progress":{"checksum":"${osc.checksum}"' ${statePath} 2>/dev/null; do
  if grep -q '"lastApplied":{"checksum":"${osc.checksum}"' ${statePath} 2>/dev/null; then missed=1; break; fi
done
t0=$(date +%s%N)
rm -f ${armed}
sleep ${(delayMs / 1000).toFixed(3)}
grep -q '"lastApplied":{"checksum":"${osc.checksum}"' ${statePath} 2>/dev/null && missed=1
${fault}
echo "MISSED $missed"
echo "INTERRUPTED $(grep -c '"progress"' ${statePath} 2>/dev/null)"
`;
  const running = rig.node.exec(["timeout", "120", "sh", "-c", script], { timeoutMs: 130_000 });
  await waitFor("the fault to be armed in the node", () => existsSync(`${rig.node.root}${armed}`), 30_000, 2);
  await rig.put(osc);
  const r = await running;
  if (r.code !== 0) throw new Error(`the fault script exited ${r.code}: ${r.stderr}`);
  const output = new Map(r.stdout.trim().split("\n").map((l) => [l.split(" ")[0] as string, l.split(" ").slice(1).join(" ")]));
  return { missed: output.get("MISSED") === "1", interrupted: Number(output.get("INTERRUPTED")) > 0, output };
}

/** The agent's log lines (JSON) in the node's journal that contain `text`. */
export async function agentLogLines(node: Node, text: string): Promise<string[]> {
  const out = await node.execOk(["journalctl", "-u", agentUnitName, "-o", "cat", "--no-pager"], { timeoutMs: 60_000 });
  return out.split("\n").filter((l) => l.includes(text));
}

/** A random delay in [0, maxMs) from the scenario's seeded PRNG, for the instant a fault lands. */
export function faultClock(seed: number) {
  const r = prng(seed);
  return { delayMs: (maxMs: number) => r.int(Math.max(1, Math.round(maxMs))), rand: r };
}

export type RoundsOptions = {
  rig: Rig;
  /** The version the node is at; rounds apply the next ones. */
  from: number;
  rounds: number;
  seed: number;
  log: (line: string) => void;
  /** The fault, as shell run in the node (`$pid`: the agent's main PID). */
  fault: (round: number) => string;
  /** Each unit owed a restart starts exactly once (no redone restarts). */
  exactlyOnce: boolean;
  /** More checks after a round converged; failures as lines. */
  check?: (i: Injection, before: NodeLook, after: NodeLook) => Promise<string[]>;
  convergeTimeoutMs?: number;
};

export type RoundsResult = { passed: number; failures: string[]; interrupted: number; missed: number; redone: number; convergeMs: number[] };

/**
 * Rounds of: a new version of the OSC, the fault at a random instant of its apply (seeded: within the
 * time an undisturbed apply of this OSC takes, measured first), convergence (the Node's annotation), and
 * the checks: exactly the desired state, no unit started that was not owed, the annotation changed once.
 */
export async function faultRounds(o: RoundsOptions): Promise<RoundsResult> {
  const { rig } = o;
  const clock = faultClock(o.seed);
  // An undisturbed apply of a new version, to know how long the window for the fault is: from the
  // persisted plan to the finished one.
  let version = o.from + 1;
  const calibration = await injectDuringApply(rig, chaosOsc(version), 0, `while grep -q '"progress":{"checksum":"${chaosOsc(version).checksum}"' ${statePath}; do :; done; echo "APPLY_MS $(( ($(date +%s%N) - t0) / 1000000 ))"`);
  await rig.annotation.until(chaosOsc(version).checksum, 120_000);
  const applyMs = Number(calibration.output.get("APPLY_MS"));
  // A little beyond its end: faults also land on an agent finishing up (writing its state, reporting).
  const windowMs = Math.max(50, Math.round(applyMs * 1.1));
  o.log(`an undisturbed apply takes ${applyMs} ms from its persisted plan: faults land 0–${windowMs} ms after it`);
  const result: RoundsResult = { passed: 0, failures: [], interrupted: 0, missed: 0, redone: 0, convergeMs: [] };
  for (let round = 0; round < o.rounds; round++) {
    const prev = chaosOsc(version);
    const next = chaosOsc(++version);
    const delay = clock.delayMs(windowMs);
    try {
      const before = await lookAtNode(rig.node);
      const changes = rig.annotation.changes.length;
      const inj = await injectDuringApply(rig, next, delay, o.fault(round));
      const injected = performance.now();
      await rig.annotation.until(next.checksum, o.convergeTimeoutMs ?? 120_000);
      result.convergeMs.push(Math.round(performance.now() - injected));
      // A fault after the apply finished leaves an agent still starting: the next round needs it running.
      await agentReady(rig);
      const after = await lookAtNode(rig.node);
      const seen = rig.annotation.changes.slice(changes);
      const problems = [
        ...differences(after, next),
        ...unexpectedStarts(before, after, prev, next, o.exactlyOnce),
        ...(seen.length === 1 ? [] : [`the Node's checksum annotation changed ${seen.length} times (${seen.map((c) => c.slice(0, 12)).join(", ")}), want once`]),
        ...((await o.check?.(inj, before, after)) ?? []),
      ];
      if (inj.interrupted) result.interrupted++;
      if (inj.missed) result.missed++;
      result.redone += redoneRestarts(before, after, prev, next);
      if (problems.length === 0) result.passed++;
      else result.failures.push(`round ${round} (v${version}, fault at +${delay} ms): ${problems.slice(0, 5).join("; ")}${problems.length > 5 ? ` … ${problems.length} problems` : ""}`);
      if (round % 10 === 9 || round === o.rounds - 1) o.log(`${round + 1}/${o.rounds} rounds, ${result.passed} passed, ${result.interrupted} interrupted an unfinished plan`);
    } catch (err) {
      result.failures.push(`round ${round} (v${version}, fault at +${delay} ms): ${err instanceof Error ? err.message : String(err)}`);
    }
  }
  return result;
}

/** Waits until the agent's unit is active and the agent answers /readyz (its OSC applied, everything synced). */
async function agentReady(rig: Rig, timeoutMs = 60_000): Promise<void> {
  await waitFor(
    "the agent to be running and ready",
    async () => {
      const res = await fetch(`http://127.0.0.1:${rig.agent.healthPort}/readyz`).catch(() => undefined);
      return res?.status === 200 && (await unitActive(rig.node, agentUnitName));
    },
    timeoutMs,
    50,
  );
}

async function unitActive(node: Node, unit: string): Promise<boolean> {
  return (await node.exec(["systemctl", "is-active", "--quiet", unit])).code === 0;
}

/** Median and maximum of `xs` (0 for none). */
export function spread(xs: number[]): { median: number; max: number } {
  const s = [...xs].sort((a, b) => a - b);
  return { median: s[Math.floor(s.length / 2)] ?? 0, max: s.at(-1) ?? 0 };
}
