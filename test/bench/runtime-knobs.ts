// bun run bench:knobs [-- --variants base,smol,... --rounds 2 --idle-seconds 150 --settle-seconds 30 --changes 3 --startups 2]
//
// What Bun's runtime knobs do to the compiled agent (issue 14): each variant is the agent built and
// started one way — flags baked into the executable (`--compile-exec-argv`, `--compile-jit-policy`) or
// environment variables in a drop-in of its unit, as an operator would set them — on a real node
// (systemd in namespaces, containerd) against one real kube-apiserver, on the benchmark OSC (500 files,
// 50 units: test/bench/lib/bench-osc.ts). Per round, one fresh node per variant, and per variant:
//   1. first apply: Secret created → the Node annotated with its checksum;
//   2. start-up: `systemctl restart` → the first reconcile finished (the journal's "OSC applied" of
//      the new process, from systemd's ExecMainStartTimestampMonotonic: the same clock);
//   3. reaction: Secret replaced → the changed unit's new process started (its own $EPOCHREALTIME),
//      and the agent's CPU for that change (until the annotation + 500 ms);
//   4. idle: after `settle` seconds, every variant idles at once for `idle` seconds: CPU seconds
//      (utime + stime) split by thread (/proc/PID/task/*/stat sampled every 5 s), VmRSS every 10 s;
//   5. with the "shipped" variant, in its node after the last round: what executing itself costs
//      `trellis run` at start (`run --help` timed 30 times each with and without TRELLIS_RUNTIME_ENV=off,
//      alternating: the start-up figures of step 2 are too noisy on a shared machine to show 30 ms).
// Steps 1–3 take turns (the variants' order rotates from round to round), step 4 runs all variants
// at the same time, so that the shared 2-core machine's noise hits them alike; figures are CPU
// seconds, not wall time. The result (JSON on stdout, a table on stderr) is added to
// test/bench/results/knobs-<date>.json under `runs`, so a run of single knobs and a run of the
// chosen combination sit side by side.
import { existsSync, readFileSync } from "node:fs";
import { parseArgs } from "node:util";
import { CoreV1Api } from "@kubernetes/client-node";
import { sha256Hex } from "../../src/api/desired.ts";
import { type AgentNode, mainPid, startAgentNode, unitProperty, waitApplied } from "../harness/agent.ts";
import { repoRoot } from "../harness/binary.ts";
import { type Cluster, startCluster } from "../harness/cluster.ts";
import { runDir, runOk, waitFor } from "../harness/exec.ts";
import { AuditTail, waitWatching } from "./lib/audit.ts";
import { oscYaml, secretBody, starts, UNITS, unitName } from "./lib/bench-osc.ts";
import { journal } from "./lib/journal.ts";
import { cpuSeconds, hostCpu, busyCores, initClockTicks, machineInfo, memoryKiB } from "./lib/proc.ts";
import { saveResult } from "./lib/results.ts";
import { median, round, summary } from "./lib/stats.ts";
import { type ThreadCpu, ThreadTracker } from "./lib/threads.ts";

type Variant = {
  name: string;
  what: string;
  /** Baked into the executable; `shipped`: exactly what `bun run build` bakes in. */
  build?: { execArgv?: string[]; jitPolicy?: number; shipped?: boolean };
  /** Set in a drop-in of the agent's unit (Environment=). */
  env?: Record<string, string>;
};

// Every knob alone. Names verified on Bun 1.4.5 (`strings`, BUN_JSC_dumpOptions=2, MIMALLOC_VERBOSE=1);
// the defaults there: GC timer 1000 ms, idle GCs "10,110,480", mimalloc purge_delay 100 ms,
// purge_holes on with a 100 ms minimum interval, scavenger on; JSC: 2 GC markers, concurrent JIT,
// 2 worklist threads, 1 DFG and 1 FTL compiler thread (so those two cannot go lower than they are).
const catalogue: Variant[] = [
  { name: "base", what: "no knobs" },
  { name: "shipped", what: "the build as shipped (build/compile.ts's flags and runtime variables)", build: { shipped: true } },
  { name: "shipped-env-off", what: "the build as shipped with TRELLIS_RUNTIME_ENV=off: its baked flags only, no re-execution", build: { shipped: true }, env: { TRELLIS_RUNTIME_ENV: "off" } },
  { name: "smol", what: "--compile-exec-argv=--smol", build: { execArgv: ["--smol"] } },
  { name: "jit-policy-10", what: "--compile-jit-policy=10 (tier-up thresholds × 10)", build: { jitPolicy: 10 } },
  { name: "gc-timer-30s", what: "BUN_GC_TIMER_INTERVAL=30000", env: { BUN_GC_TIMER_INTERVAL: "30000" } },
  { name: "gc-timer-off", what: "BUN_GC_TIMER_DISABLE=1", env: { BUN_GC_TIMER_DISABLE: "1" } },
  { name: "idle-gc-off", what: "BUN_IDLE_GC_SECONDS=0", env: { BUN_IDLE_GC_SECONDS: "0" } },
  { name: "mi-purge-1s", what: "MIMALLOC_PURGE_DELAY=1000", env: { MIMALLOC_PURGE_DELAY: "1000" } },
  { name: "mi-holes-off", what: "MIMALLOC_PURGE_HOLES=0", env: { MIMALLOC_PURGE_HOLES: "0" } },
  { name: "mi-holes-10s", what: "MIMALLOC_PURGE_HOLES_MIN_INTERVAL=10000", env: { MIMALLOC_PURGE_HOLES_MIN_INTERVAL: "10000" } },
  { name: "mi-scavenger-off", what: "MIMALLOC_SCAVENGER=0", env: { MIMALLOC_SCAVENGER: "0" } },
  { name: "jsc-1-marker", what: "BUN_JSC_numberOfGCMarkers=1", env: { BUN_JSC_numberOfGCMarkers: "1" } },
  { name: "jsc-serial-jit", what: "BUN_JSC_useConcurrentJIT=false", env: { BUN_JSC_useConcurrentJIT: "false" } },
  { name: "jsc-1-worklist", what: "BUN_JSC_maxNumberOfWorklistThreads=1, minNumberOfWorklistThreads=1", env: { BUN_JSC_maxNumberOfWorklistThreads: "1", BUN_JSC_minNumberOfWorklistThreads: "1" } },
  { name: "jsc-no-ftl", what: "BUN_JSC_useFTLJIT=false", env: { BUN_JSC_useFTLJIT: "false" } },
  { name: "jsc-no-warmup", what: "BUN_JSC_useWarmUpMarkedBlocks=false", env: { BUN_JSC_useWarmUpMarkedBlocks: "false" } },
];

const { values: args } = parseArgs({
  options: {
    variants: { type: "string", default: catalogue.filter((v) => !v.build?.shipped).map((v) => v.name).join(",") },
    /** More variants, each "name=VAR=value;VAR=value" or "name=--flag" (built in), for combinations. */
    extra: { type: "string", multiple: true, default: [] },
    rounds: { type: "string", default: "2" },
    "idle-seconds": { type: "string", default: "150" },
    "settle-seconds": { type: "string", default: "30" },
    changes: { type: "string", default: "3" },
    startups: { type: "string", default: "2" },
    label: { type: "string", default: "singles" },
  },
});

function parseExtra(spec: string): Variant {
  const [name, rest = ""] = spec.split(/=(.*)/s, 2) as [string, string?];
  const v: Variant = { name, what: rest, env: {}, build: {} };
  for (const part of rest.split(";").filter(Boolean)) {
    if (part.startsWith("--jit-policy=")) v.build = { ...v.build, jitPolicy: Number(part.slice(13)) };
    else if (part.startsWith("--")) v.build = { ...v.build, execArgv: [...(v.build?.execArgv ?? []), part] };
    else {
      const [k, val] = part.split(/=(.*)/s, 2) as [string, string];
      (v.env as Record<string, string>)[k] = val;
    }
  }
  return v;
}
const byName = new Map(catalogue.map((v) => [v.name, v]));
const variants: Variant[] = [
  ...(args.variants as string).split(",").filter(Boolean).map((n) => {
    const v = byName.get(n);
    if (!v) throw new Error(`unknown variant ${n}; known: ${[...byName.keys()].join(", ")}`);
    return v;
  }),
  ...(args.extra as string[]).map(parseExtra),
];
const ROUNDS = Number(args.rounds);
const IDLE_S = Number(args["idle-seconds"]);
const SETTLE_S = Number(args["settle-seconds"]);
const CHANGES = Number(args.changes);
const STARTUPS = Number(args.startups);

const benchStart = performance.now();
const progress = (msg: string) => console.error(`[${((performance.now() - benchStart) / 1000).toFixed(1).padStart(7)} s] ${msg}`);
const wallNow = () => performance.timeOrigin + performance.now();
const sleep = (ms: number) => Bun.sleep(ms);
/** Round r goes through the variants starting at the r-th. */
const rotate = <T>(xs: T[], r: number): T[] => xs.map((_, i) => xs[(i + r) % xs.length] as T);

// ---------------------------------------------------------------- binaries

/** Builds one executable per distinct set of baked flags (the others share the plain build). */
async function buildVariants(dir: string): Promise<Map<string, string>> {
  const out = new Map<string, string>();
  const built = new Map<string, string>();
  for (const v of variants) {
    const execArgv = v.build?.execArgv ?? [];
    const jitPolicy = v.build?.jitPolicy ?? 1;
    const shipped = v.build?.shipped === true;
    const key = shipped ? "shipped" : `${execArgv.join(" ")}|${jitPolicy}`;
    let path = built.get(key);
    if (!path) {
      path = `${dir}/trellis-${built.size}`;
      // An empty --exec-argv and --runtime-env take out what build/compile.ts bakes in: "base" is no knobs at all.
      const knobs = shipped ? [] : [`--exec-argv=${execArgv.join(" ")}`, "--jit-policy", String(jitPolicy), "--runtime-env="];
      await runOk(["bun", "run", "build/compile.ts", "--outfile", path, ...knobs], { cwd: repoRoot, timeoutMs: 300_000 });
      built.set(key, path);
    }
    out.set(v.name, path);
  }
  return out;
}

// ---------------------------------------------------------------- one variant on one node

type Run = {
  variant: Variant;
  agent: AgentNode;
  secretName: string;
  firstApplyMs?: number;
  startupMs: number[];
  reactionMs: number[];
  reactionCpuMs: number[];
  idle?: ThreadCpu & { rssMiB: ReturnType<typeof summary> };
};

const dropIn = (env: Record<string, string>) =>
  `[Service]\n${Object.entries(env)
    .map(([k, v]) => `Environment=${k}=${v}`)
    .join("\n")}\n`;

async function startVariant(cluster: Cluster, v: Variant, binary: string, round: number): Promise<Run> {
  const secretName = `osc-knobs-${round}-${v.name}`;
  const agent = await startAgentNode(cluster, { prefix: `kn${round}-${v.name}`.slice(0, 13).replace(/-$/, ""), secretName, binary, containerd: true, start: false });
  if (v.env && Object.keys(v.env).length > 0) {
    await agent.node.writeFile("/etc/systemd/system/gardener-node-agent.service.d/50-knobs.conf", dropIn(v.env));
    await agent.node.execOk(["systemctl", "daemon-reload"]);
  }
  await agent.node.execOk(["systemctl", "enable", "--now", "--no-block", "gardener-node-agent.service"]);
  return { variant: v, agent, secretName, startupMs: [], reactionMs: [], reactionCpuMs: [] };
}

async function restartAndTime(r: Run): Promise<number> {
  const node = r.agent.node;
  // The unit is Type=notify: this returns once the new process said READY (its first reconcile).
  await node.execOk(["systemctl", "restart", "gardener-node-agent.service"], { timeoutMs: 120_000 });
  const pid = await mainPid(r.agent, "gardener-node-agent.service");
  const startUs = Number(await unitProperty(node, "gardener-node-agent.service", "ExecMainStartTimestampMonotonic"));
  const done = await waitFor(`${r.variant.name}'s first reconcile after a restart`, async () => (await journal(node, pid)).find((l) => l.msg === "OSC applied"), 60_000, 50);
  return (done.monoUs - startUs) / 1000;
}

// ---------------------------------------------------------------- the benchmark

await initClockTicks();
const machine = await machineInfo();
progress(`variants: ${variants.map((v) => v.name).join(", ")}; ${ROUNDS} round(s), ${IDLE_S} s idle each`);
const binaries = await buildVariants(runDir("knobs"));
const cluster = await startCluster({ controllerManager: false });
const core = cluster.admin().makeApiClient(CoreV1Api);
const audit = new AuditTail(cluster.auditLog);
const rounds: { round: number; order: string[]; hostCpuBusyCores: number; runs: Run[] }[] = [];
let live: Run[] = [];
let reexecCost: Record<string, unknown> | undefined;

/** `run --help` timed in the node, alternately with the runtime variables and without (TRELLIS_RUNTIME_ENV=off). */
async function measureReexec(r: Run, times = 30): Promise<Record<string, unknown>> {
  const script = `TIMEFORMAT='%3R %3U %3S'; for i in $(seq 1 ${times}); do for m in off on; do if [ $m = off ]; then export TRELLIS_RUNTIME_ENV=off; else unset TRELLIS_RUNTIME_ENV; fi; t=$( { time /opt/bin/gardener-node-agent run --help >/dev/null 2>&1; } 2>&1 ); echo "$m $t"; done; done`;
  const rows = (await r.agent.node.execOk(["bash", "-c", script], { timeoutMs: 300_000 })).trim().split("\n").map((l) => l.split(" "));
  const of = (m: string) => rows.filter((x) => x[0] === m).map((x) => ({ wallMs: Number(x[1]) * 1000, cpuMs: (Number(x[2]) + Number(x[3])) * 1000 }));
  const [off, on] = [of("off"), of("on")];
  return {
    runs: times,
    withoutWallMs: summary(off.map((x) => x.wallMs)),
    withWallMs: summary(on.map((x) => x.wallMs)),
    withoutCpuMs: summary(off.map((x) => x.cpuMs)),
    withCpuMs: summary(on.map((x) => x.cpuMs)),
    note: "`gardener-node-agent run --help` in the shipped variant's node: with its runtime variables it executes itself once (and the executed process prints the help); TRELLIS_RUNTIME_ENV=off does not",
  };
}

try {
  for (let round = 0; round < ROUNDS; round++) {
    const order = rotate(variants, round);
    progress(`round ${round + 1}/${ROUNDS}: booting ${order.length} nodes`);
    live = [];
    // Two boots at a time: every node's systemd, journald and containerd start on the same two cores.
    for (let i = 0; i < order.length; i += 2) {
      live.push(...(await Promise.all(order.slice(i, i + 2).map((v) => startVariant(cluster, v, binaries.get(v.name) as string, round)))));
    }
    for (const r of live) await waitWatching(audit, r.agent.user);

    // 1. first apply, one at a time
    const text0 = oscYaml(0);
    for (const r of live) {
      const t0 = wallNow();
      await core.createNamespacedSecret({ namespace: "kube-system", body: secretBody(r.secretName, text0) });
      await waitApplied(r.agent, sha256Hex(text0), 120_000, 20);
      r.firstApplyMs = wallNow() - t0;
    }
    progress(`first applies: ${live.map((r) => `${r.variant.name} ${round1(r.firstApplyMs)}`).join(", ")} ms`);

    // 2. start-up, taking turns
    for (let k = 0; k < STARTUPS; k++) {
      for (const r of rotate(live, k)) {
        r.startupMs.push(await restartAndTime(r));
        await sleep(1_000);
      }
    }
    progress(`start-up: ${live.map((r) => `${r.variant.name} ${round1(median(r.startupMs))}`).join(", ")} ms`);

    // 3. reaction to one Secret change, taking turns
    for (let i = 1; i <= CHANGES; i++) {
      const text = oscYaml(i);
      const u = (i - 1) % UNITS;
      for (const r of rotate(live, i)) {
        const pid = await mainPid(r.agent, "gardener-node-agent.service");
        const count = (await starts(r.agent.node, u)).length;
        const cpu0 = await cpuSeconds(r.agent.node, pid);
        const t0 = wallNow();
        await core.replaceNamespacedSecret({ name: r.secretName, namespace: "kube-system", body: secretBody(r.secretName, text) });
        const started = await waitFor(`${unitName(u)} to restart on ${r.variant.name}`, async () => (await starts(r.agent.node, u))[count], 60_000, 2);
        await waitApplied(r.agent, sha256Hex(text), 60_000, 20);
        await sleep(500); // the event and the Node's condition follow the annotation
        r.reactionMs.push(started - t0);
        r.reactionCpuMs.push(((await cpuSeconds(r.agent.node, pid)) - cpu0) * 1000);
      }
    }
    progress(`reaction: ${live.map((r) => `${r.variant.name} ${round1(median(r.reactionMs))} ms / ${round1(median(r.reactionCpuMs))} ms CPU`).join(", ")}`);

    // 4. idle, all at once
    progress(`idle: ${SETTLE_S} s to settle, then ${IDLE_S} s measured`);
    await sleep(SETTLE_S * 1000);
    const pids = await Promise.all(live.map((r) => mainPid(r.agent, "gardener-node-agent.service")));
    const trackers = live.map((r, i) => new ThreadTracker(r.agent.node.root, pids[i] as number));
    const rss: number[][] = live.map(() => []);
    const host0 = hostCpu();
    for (const t of trackers) t.start();
    for (let s = 5; s <= IDLE_S; s += 5) {
      await sleep(5_000);
      for (const t of trackers) t.sample();
      if (s % 10 === 0) for (const [i, r] of live.entries()) rss[i]?.push((await memoryKiB(r.agent.node, pids[i] as number)).vmRssKiB / 1024);
    }
    const idle = trackers.map((t) => t.finish());
    const busy = busyCores(host0, hostCpu());
    for (const [i, r] of live.entries()) {
      if ((await mainPid(r.agent, "gardener-node-agent.service")) !== pids[i]) throw new Error(`${r.variant.name} restarted while idle`);
      r.idle = { ...(idle[i] as ThreadCpu), rssMiB: summary(rss[i] as number[]) };
    }
    progress(`idle CPU: ${live.map((r) => `${r.variant.name} ${r.idle?.seconds.toFixed(2)} s`).join(", ")} (host ${busy} cores busy)`);
    rounds.push({ round, order: order.map((v) => v.name), hostCpuBusyCores: busy, runs: live });
    const shipped = live.find((r) => r.variant.name === "shipped");
    if (shipped && round === ROUNDS - 1) {
      reexecCost = await measureReexec(shipped);
      progress(`re-execution: run --help ${JSON.stringify(reexecCost.withoutWallMs)} ms without, ${JSON.stringify(reexecCost.withWallMs)} ms with`);
    }
    for (const r of [...live].reverse()) await r.agent.node.stop();
    live = [];
  }
} finally {
  for (const r of [...live].reverse()) await r.agent.node.stop().catch((err: unknown) => console.error(`stopping node ${r.agent.name}: ${String(err)}`));
  await cluster.stop();
}

function round1(x: number | undefined): number {
  return round(x ?? NaN, 0);
}

// ---------------------------------------------------------------- summary and output

const perRound = (name: string) => rounds.map((rd) => rd.runs.find((r) => r.variant.name === name) as Run);
const roles = new Set<string>();
for (const rd of rounds) for (const r of rd.runs) for (const k of Object.keys(r.idle?.byThread ?? {})) roles.add(k);
// What each executable has baked in (the shipped build's change as the code does).
const baked = new Map<string, unknown>();
for (const [name, path] of binaries) {
  const { execArgv, runtimeEnv } = JSON.parse(await runOk([path, "version", "--json"])) as { execArgv: string[]; runtimeEnv: Record<string, string> };
  baked.set(name, { execArgv, runtimeEnv });
}
const summaryByVariant = variants.map((v) => {
  const runs = perRound(v.name);
  const base = perRound(variants[0]?.name as string);
  const idle = runs.map((r) => r.idle as NonNullable<Run["idle"]>);
  const byThread: Record<string, number> = {};
  for (const role of roles) byThread[role] = round(median(idle.map((x) => x.byThread[role] ?? 0)), 3);
  return {
    name: v.name,
    what: v.what,
    build: v.build,
    env: v.env,
    baked: baked.get(v.name),
    idleCpuSecondsPerRound: idle.map((x) => round(x.seconds, 2)),
    idleCpuSeconds: round(median(idle.map((x) => x.seconds)), 2),
    /** Per round against the first variant of the same round (the same machine load), then the median. */
    idleCpuVsFirst: round(median(idle.map((x, i) => x.seconds / ((base[i] as Run).idle as ThreadCpu).seconds)), 2),
    idleCpuSecondsPer10Min: round((median(idle.map((x) => x.seconds)) * 600) / IDLE_S, 2),
    idleCpuByThread: byThread,
    unattributed: round(median(idle.map((x) => x.unattributed)), 3),
    rssMiBMedian: round(median(idle.map((x) => x.rssMiB.median)), 1),
    rssMiBMax: round(Math.max(...idle.map((x) => x.rssMiB.max)), 1),
    startupMs: summary(runs.flatMap((r) => r.startupMs)),
    reactionMs: summary(runs.flatMap((r) => r.reactionMs)),
    reactionCpuMs: summary(runs.flatMap((r) => r.reactionCpuMs)),
    firstApplyMs: summary(runs.map((r) => r.firstApplyMs as number)),
    threadsAtEnd: idle.at(-1)?.threadsAtEnd,
  };
});

const date = new Date().toISOString().slice(0, 10);
const resultPath = new URL(`./results/knobs-${date}.json`, import.meta.url).pathname;
const previous = existsSync(resultPath) ? (JSON.parse(readFileSync(resultPath, "utf8")) as { runs?: unknown[] }) : {};
const thisRun = {
  label: args.label,
  finishedAt: new Date().toISOString(),
  benchSeconds: round((performance.now() - benchStart) / 1000),
  machine,
  bun: Bun.version,
  settings: { rounds: ROUNDS, idleSeconds: IDLE_S, settleSeconds: SETTLE_S, changes: CHANGES, startups: STARTUPS },
  note:
    "idle: CPU seconds (utime+stime) over idleSeconds with every variant idling at once, each on its own node, after one first apply of the benchmark OSC, the start-ups and the changes; by thread from /proc/PID/task/*/stat (the main thread is named after the executable, gardener-node-a); idleCpuVsFirst: per round against the first variant, then the median; startup: systemd's start of the process → the journal's 'OSC applied' of the first reconcile; reaction: Secret replaced → the changed unit's new process; reactionCpu: the agent's CPU for that change",
  hostCpuBusyCoresWhileIdle: rounds.map((r) => r.hostCpuBusyCores),
  ...(reexecCost ? { reexecCost } : {}),
  variants: summaryByVariant,
  rounds: rounds.map((rd) => ({
    round: rd.round,
    order: rd.order,
    runs: rd.runs.map((r) => ({ variant: r.variant.name, firstApplyMs: round(r.firstApplyMs ?? NaN), startupMs: r.startupMs.map((x) => round(x)), reactionMs: r.reactionMs.map((x) => round(x)), reactionCpuMs: r.reactionCpuMs.map((x) => round(x)), idle: r.idle })),
  })),
};
saveResult("knobs", { date, runs: [...((previous.runs as unknown[]) ?? []), thisRun] }, date);

const col = (s: string | number, w: number) => String(s).padStart(w);
const top = [...roles].sort((a, b) => (summaryByVariant[0]?.idleCpuByThread[b] ?? 0) - (summaryByVariant[0]?.idleCpuByThread[a] ?? 0)).slice(0, 6);
console.error(
  [
    "",
    `${"variant".padEnd(18)}${col("idle CPU s", 11)}${col("vs first", 9)}${top.map((t) => col(t.slice(0, 12), 13)).join("")}${col("RSS MiB", 9)}${col("start ms", 9)}${col("react ms", 9)}${col("react CPU", 10)}${col("1st apply", 10)}`,
    ...summaryByVariant.map(
      (s) =>
        `${s.name.padEnd(18)}${col(s.idleCpuSeconds, 11)}${col(s.idleCpuVsFirst, 9)}${top.map((t) => col(s.idleCpuByThread[t] ?? 0, 13)).join("")}${col(s.rssMiBMedian, 9)}${col(s.startupMs.median, 9)}${col(s.reactionMs.median, 9)}${col(s.reactionCpuMs.median, 10)}${col(s.firstApplyMs.median, 10)}`,
    ),
    `written to test/bench/results/knobs-${date}.json`,
  ].join("\n"),
);
