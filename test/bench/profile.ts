// bun run bench:profile [-- --steady-minutes 3] [-- --memory-only]
//
// Where trellis's CPU time and memory go in the side-by-side benchmark's phases (test/bench/compare.ts),
// measured, not guessed: the agent runs on a real node under Bun's sampling CPU profiler (--cpu-prof,
// every 1 ms, passed through BUN_OPTIONS by a unit drop-in) as a readable build (`bun run build --
// --readable`: the same code with identifiers and line breaks kept, so the profile names trellis's
// functions). The bench OSC (500 files, 50 units) is applied first; then the agent is restarted under
// the profiler and goes through: start-up → first reconcile, 10 no-op re-checks, 5 changes (one unit
// each), and a steady state. Phase boundaries are written into the node's journal (logger), which
// puts them on the same clock as the agent's start. Before that, without the profiler, the agent's
// memory is broken down from /proc/PID/smaps_rollup (file-backed: pages of the binary; anonymous: heaps)
// and its /metrics (the JavaScript heap), and what holds the heap is read from a heap snapshot the agent
// writes on SIGUSR2 (TRELLIS_HEAP_SNAPSHOT, set for this node only): every object's retained size, by
// holder (lib/heap-snapshot.ts). --memory-only stops there.
// Writes test/bench/results/profile-<date>.json and prints the top functions per phase.
import { existsSync, readdirSync, readFileSync } from "node:fs";
import { parseArgs } from "node:util";
import { CoreV1Api } from "@kubernetes/client-node";
import { sha256Hex } from "../../src/api/desired.ts";
import { mainPid, startAgentNode, unitProperty, waitApplied } from "../harness/agent.ts";
import { repoRoot } from "../harness/binary.ts";
import { startCluster } from "../harness/cluster.ts";
import { runOk, waitFor } from "../harness/exec.ts";
import type { Node } from "../harness/node.ts";
import { type CpuProfile, profileWindow } from "./lib/cpuprofile.ts";
import { oscYaml, secretBody, starts } from "./lib/bench-osc.ts";
import { analyzeHeapSnapshot } from "./lib/heap-snapshot.ts";
import { journal } from "./lib/journal.ts";
import { procKiB } from "./lib/proc.ts";
import { saveResult } from "./lib/results.ts";

const { values: args } = parseArgs({ options: { "steady-minutes": { type: "string", default: "3" }, "memory-only": { type: "boolean", default: false } } });
const STEADY_MINUTES = Number(args["steady-minutes"]);
const profileDir = "/var/tmp/trellis-prof";
const progress = (msg: string) => console.error(`[${new Date().toISOString().slice(11, 19)}] ${msg}`);

const binary = `${repoRoot}/dist/trellis-profile`;
await runOk(["bun", "run", "build", "--", "--readable", "--outfile", binary], { cwd: repoRoot, timeoutMs: 300_000 });

/** A marker in the node's journal; returns its CLOCK_MONOTONIC time in µs. */
async function marker(node: Node, text: string): Promise<number> {
  await node.execOk(["logger", "-t", "trellis-bench", text]);
  const out = await node.execOk(["journalctl", "-t", "trellis-bench", "-o", "json", "--output-fields=MESSAGE", "--no-pager"]);
  const line = out.trim().split("\n").map((l) => JSON.parse(l) as { MESSAGE: string; __MONOTONIC_TIMESTAMP: string }).findLast((e) => e.MESSAGE === text);
  if (!line) throw new Error(`marker "${text}" not in the journal`);
  return Number(line.__MONOTONIC_TIMESTAMP);
}

const cluster = await startCluster({ controllerManager: false });
const kubelet = Bun.serve({ hostname: "127.0.0.1", port: 10248, fetch: () => new Response("ok") });
const core = cluster.admin().makeApiClient(CoreV1Api);
const secretName = "osc-profile";
const result: Record<string, unknown> = { date: new Date().toISOString().slice(0, 10), steadyMinutes: STEADY_MINUTES };
const heapSnapshot = "/var/tmp/trellis-heap.json";
const a = await startAgentNode(cluster, { prefix: "profile", secretName, binary, containerd: true, environment: { TRELLIS_HEAP_SNAPSHOT: heapSnapshot } });
try {
  const waitAnnotated = (text: string) => waitApplied(a, sha256Hex(text), 120_000, 20);
  let text = oscYaml(0);
  await core.createNamespacedSecret({ namespace: "kube-system", body: secretBody(secretName, text) });
  await waitAnnotated(text);
  // Memory is read without the profiler (which keeps every sample in memory), after the work the
  // side-by-side benchmark does before its steady state: 30 changes and 10 no-op re-checks.
  progress("bench OSC applied; 30 changes and 10 no-op re-checks without the profiler, for the memory breakdown");
  for (let i = 1; i <= 40; i++) {
    const t = i <= 30 ? oscYaml(i) : `${oscYaml(30)}# no-op ${i}\n`;
    await core.replaceNamespacedSecret({ name: secretName, namespace: "kube-system", body: secretBody(secretName, t) });
    await waitAnnotated(t);
  }
  await Bun.sleep(30_000);
  const plainPid = await mainPid(a, "gardener-node-agent.service");
  const { Rss, Anonymous } = procKiB(a.node.root, plainPid, "smaps_rollup", ["Rss", "Anonymous"]);
  const metrics = await (await fetch(`http://127.0.0.1:${a.metricsPort}/metrics`)).text();
  const gauge = (name: string) => Number(new RegExp(`^${name} (\\S+)$`, "m").exec(metrics)?.[1] ?? NaN);
  const mib = (bytes: number) => Math.round(bytes / 104857.6) / 10;
  result.memoryAfterWorkMiB = {
    rss: mib(Rss * 1024),
    anonymous: mib(Anonymous * 1024),
    fileBacked: mib((Rss - Anonymous) * 1024),
    jsHeapUsed: mib(gauge("nodejs_heap_size_used_bytes")),
    jsHeapTotal: mib(gauge("nodejs_heap_size_total_bytes")),
    external: mib(gauge("nodejs_external_memory_bytes")),
    note: "30 s after 30 changes and 10 no-op re-checks of the 1 MiB OSC, no profiler. fileBacked: pages of the executable (Bun runtime + bytecode) and libraries; anonymous: the JS heap, malloc (Bun's own and the native parts), stacks; jsHeap*/external: the agent's /metrics (process.memoryUsage())",
  };
  // After the figures above: the snapshot's own work (a full collection, the JSON) changes them.
  await a.node.execOk(["kill", "-USR2", String(plainPid)]);
  const heap = analyzeHeapSnapshot(await waitFor("the heap snapshot", () => existsSync(`${a.node.root}${heapSnapshot}`) && readFileSync(`${a.node.root}${heapSnapshot}`, "utf8"), 60_000, 200));
  result.heapAfterWork = { totalMiB: mib(heap.totalBytes), objects: heap.objects, retainedBy: heap.tree };
  progress(`memory: ${JSON.stringify(result.memoryAfterWorkMiB)}`);
  progress(`heap snapshot: ${mib(heap.totalBytes)} MiB in ${heap.objects} objects; retained, by holder:\n${heap.tree.join("\n")}`);
  if (!args["memory-only"]) {
    text = oscYaml(30);
    progress("restarting the agent under the profiler");

    await a.node.writeFile(
      "/etc/systemd/system/gardener-node-agent.service.d/90-profile.conf",
      `[Service]\nEnvironment=BUN_OPTIONS="--cpu-prof --cpu-prof-dir=${profileDir} --cpu-prof-interval=1000"\n`,
    );
    await a.node.execOk(["mkdir", "-p", profileDir]);
    await a.node.execOk(["systemctl", "daemon-reload"]);
    await a.node.execOk(["systemctl", "restart", "gardener-node-agent.service"]);
    const startUs = Number(await unitProperty(a.node, "gardener-node-agent.service", "ExecMainStartTimestampMonotonic"));
    const pid = await mainPid(a, "gardener-node-agent.service");
    const ms = (us: number) => (us - startUs) / 1000;
    const applied = await waitFor("the first reconcile", async () => (await journal(a.node, pid)).find((l) => l.msg === "OSC applied"), 60_000, 50);
    const windows: Record<string, [number, number]> = { "start-up → first reconcile": [0, ms(applied.monoUs)] };
    await Bun.sleep(3_000);

    const noop0 = await marker(a.node, "no-op re-checks");
    for (let k = 1; k <= 10; k++) {
      const t = `${text}# no-op ${k}\n`;
      await core.replaceNamespacedSecret({ name: secretName, namespace: "kube-system", body: secretBody(secretName, t) });
      await waitAnnotated(t);
      await Bun.sleep(500);
    }
    windows["10 no-op re-checks"] = [ms(noop0), ms(await marker(a.node, "no-op done"))];
    await Bun.sleep(3_000);

    const change0 = await marker(a.node, "changes");
    for (let i = 1; i <= 5; i++) {
      const count = (await starts(a.node, 30 + i - 1)).length;
      text = oscYaml(30 + i);
      await core.replaceNamespacedSecret({ name: secretName, namespace: "kube-system", body: secretBody(secretName, text) });
      await waitFor("the unit's restart", async () => (await starts(a.node, 30 + i - 1)).length > count, 30_000, 5);
      await waitAnnotated(text);
      await Bun.sleep(500);
    }
    windows["5 changes (one unit each)"] = [ms(change0), ms(await marker(a.node, "changes done"))];

    progress(`steady state for ${STEADY_MINUTES} min`);
    await Bun.sleep(30_000);
    const steady0 = await marker(a.node, "steady");
    await Bun.sleep(STEADY_MINUTES * 60_000);
    windows[`steady ${STEADY_MINUTES} min`] = [ms(steady0), ms(await marker(a.node, "steady done"))];

    await a.node.execOk(["systemctl", "stop", "gardener-node-agent.service"]);
    const dir = `${a.node.root}${profileDir}`;
    const file = await waitFor("the profile file", () => readdirSync(dir).find((f) => f.endsWith(".cpuprofile")), 10_000, 100);
    const profile = JSON.parse(readFileSync(`${dir}/${file}`, "utf8")) as CpuProfile;
    result.windows = Object.fromEntries(Object.entries(windows).map(([name, [from, to]]) => [name, { fromMs: Math.round(from), toMs: Math.round(to), ...profileWindow(profile, from, to, 1) }]));
  }
} finally {
  await a.node.stop();
  kubelet.stop(true);
  await cluster.stop();
}

saveResult("profile", result, result.date as string);
for (const [name, w] of Object.entries((result.windows ?? {}) as Record<string, ReturnType<typeof profileWindow>>)) {
  console.error(`\n${name}: ${w.busyMs} ms busy of ${w.sampledMs} ms sampled`);
  console.error(`  self:      ${w.self.slice(0, 8).map((f) => `${f.fn} ${f.percent}%`).join("; ")}`);
  console.error(`  inclusive: ${w.inclusive.slice(0, 8).map((f) => `${f.fn} ${f.percent}%`).join("; ")}`);
}
console.error(`\nmemory (no profiler): ${JSON.stringify(result.memoryAfterWorkMiB)}`);
