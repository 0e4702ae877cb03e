// bun --preload ./build/shims/preload.ts test/bench/bootstrap.ts [runs=10] [workerRuns=5]
// From starting install.sh on a booted bare node to the node at work, with real components: install.sh
// pulls trellis through the containerd mirror, bootstrap gets its certificate through a CSR (approved by
// this script as soon as it appears, as an automatic approver would), the agent applies the OSC. Two
// series, each run on a fresh node:
// - stand-in: the bench OSC (a kubelet stand-in, an image file, containerd's config); phases install.sh
//   start → CSR created → certificate issued (approval + signing) → OSC applied, and finer ones from the
//   node's journal (lib/boot-phases.ts): cloud-init's hand-over to the init unit, pull + decompress +
//   verify + install of the binary, bootstrap's start, its CSR, the agent's unit written and started,
//   the agent's start-up, its first apply;
// - worker: a real kubelet with the OSC Gardener renders for the pool (test/harness/worker.ts); phases
//   install.sh start → CSR created → OSC applied (the Node annotated) → Node Ready (kubelet registered
//   and TLS-bootstrapped) → a Pod bound to the node Running and Ready.
// The trellis image is the release's (zstd -19 with a gzip -9 alternative, build/trellis-image.ts),
// so the pull is of the layer a node really pulls. Writes test/bench/results/bootstrap-<date>.json.
import { CertificatesV1Api } from "@kubernetes/client-node";
import { putOscSecret, waitApplied } from "../harness/agent.ts";
import { bareNode, bareOsc, installAndApprove, pushImage, pushTrellis } from "../harness/bare-node.ts";
import { trellisBinary } from "../harness/binary.ts";
import { grantCsrRbac } from "../harness/bootstrap.ts";
import { startCluster } from "../harness/cluster.ts";
import { runOk, waitFor } from "../harness/exec.ts";
import { startRegistry } from "../harness/registry.ts";
import { bringUpWorker, runWebPod, startWorkerWorld } from "../harness/worker.ts";
import { type BootMark, bootJournal } from "./lib/boot-phases.ts";
import { saveResult } from "./lib/results.ts";

const runs = Number(process.argv[2] ?? 10);
const workerRuns = Number(process.argv[3] ?? 5);
const secretName = "gardener-node-agent-bench";
const binary = await trellisBinary();

type Stat = { median: number; min: number; max: number };
function stat<T>(samples: T[], k: keyof T): Stat {
  const xs = samples.map((s) => s[k] as number).sort((a, b) => a - b);
  const median = xs.length % 2 ? (xs[(xs.length - 1) / 2] as number) : ((xs[xs.length / 2 - 1] as number) + (xs[xs.length / 2] as number)) / 2;
  return { median: Number(median.toFixed(3)), min: Number((xs[0] as number).toFixed(3)), max: Number((xs[xs.length - 1] as number).toFixed(3)) };
}
const result: Record<string, unknown> = { date: new Date().toISOString(), runs, workerRuns, binaryMiB: Number(((await Bun.file(binary).size) / 2 ** 20).toFixed(1)) };

const [cluster, registry] = await Promise.all([startCluster(), startRegistry()]);
try {
  await grantCsrRbac(cluster);
  const version = JSON.parse(await runOk([binary, "version", "--json"])).version as string;
  await pushTrellis(registry, "bench", binary, version, { release: true });
  await pushImage(registry, "tools/tool", "v1", { "usr/bin/tool": { content: "#!/bin/sh\necho tool\n", mode: 0o755 } });
  const checksum = await putOscSecret(cluster, secretName, bareOsc({ mirror: registry.host, agentTag: "bench" }));
  const csrs = cluster.admin().makeApiClient(CertificatesV1Api);
  const samples: { totalS: number; toCsrS: number; certificateS: number; applyS: number }[] = [];
  const fine: Record<string, number>[] = [];
  let reExtracted = 0;
  for (let i = 0; i < runs; i++) {
    const bare = await bareNode(cluster, registry, "bench", secretName);
    try {
      const { csr: name, startedMs: t0, csrSeenMs: t1 } = await installAndApprove(cluster, registry, bare, "bench");
      await waitFor("the certificate", async () => ((await csrs.readCertificateSigningRequest({ name })).status?.certificate ? true : undefined), 60_000, 20);
      const t2 = performance.now();
      await waitApplied(bare, checksum, 120_000);
      const t3 = performance.now();
      samples.push({ totalS: (t3 - t0) / 1000, toCsrS: (t1 - t0) / 1000, certificateS: (t2 - t1) / 1000, applyS: (t3 - t2) / 1000 });
      const j = await bootJournal(bare.node);
      fine.push(phasesOf(t0, j.marks, t3));
      if (j.agentImageExtractedMs !== undefined) reExtracted++;
      console.error(`run ${i + 1}/${runs}: ${((t3 - t0) / 1000).toFixed(2)} s`);
    } finally {
      await bare.stop();
    }
  }
  result.installToApplied = stat(samples, "totalS");
  result.phases = { installToCsrCreated: stat(samples, "toCsrS"), csrApprovedToCertificate: stat(samples, "certificateS"), certificateToOscApplied: stat(samples, "applyS") };
  result.journalPhases = Object.fromEntries(Object.keys(fine[0] ?? {}).map((k) => [k, stat(fine, k)]));
  result.agentReExtractedItsBinary = `${reExtracted} of ${runs} runs`;
  result.samples = samples;
} finally {
  await registry.stop();
  await cluster.stop();
}

/**
 * Seconds per phase of one run, from the journal's marks (performance.now() ms) and the benchmark's own
 * start and end; a phase whose mark is missing is left out.
 */
function phasesOf(startMs: number, m: Partial<Record<BootMark, number>>, appliedMs: number): Record<string, number> {
  const spans: [string, number | undefined, number | undefined][] = [
    ["cloudInitToInitUnit", startMs, m.initRunning],
    ["pullAndInstall", m.initRunning, m.installed],
    ["bootstrapStart", m.installed, m.bootstrapStarted],
    ["bootstrapToCsrCreated", m.bootstrapStarted, m.csrCreated],
    ["csrCreatedToKubeconfig", m.csrCreated, m.kubeconfigWritten],
    ["kubeconfigToAgentQueued", m.kubeconfigWritten, m.agentQueued],
    ["agentQueuedToStarted", m.agentQueued, m.agentStarted],
    ["agentStartedToOscApplied", m.agentStarted, m.oscApplied],
    ["oscAppliedToNodeAnnotationSeen", m.oscApplied, appliedMs],
  ];
  return Object.fromEntries(spans.flatMap(([k, a, b]) => (a !== undefined && b !== undefined ? [[k, (b - a) / 1000]] : [])));
}

// The worker series: its own control plane (kube-controller-manager signs kubelet's certificates) and registry.
if (workerRuns > 0) {
  const world = await startWorkerWorld({ release: true });
  try {
    const workers: { toCsrS: number; toAppliedS: number; toReadyS: number; toPodReadyS: number }[] = [];
    for (let i = 0; i < workerRuns; i++) {
      const w = await bringUpWorker(world, "bootw");
      try {
        await runWebPod(world, w, `web-${i}`);
        const s = (ms: number) => (ms - w.startedMs) / 1000;
        workers.push({ toCsrS: s(w.csrSeenMs), toAppliedS: s(w.appliedMs), toReadyS: s(w.readyMs), toPodReadyS: s(performance.now()) });
        console.error(`worker ${i + 1}/${workerRuns}: Node Ready ${s(w.readyMs).toFixed(2)} s, Pod Ready ${(workers.at(-1)?.toPodReadyS ?? 0).toFixed(2)} s after install.sh started`);
      } finally {
        await w.bare.stop();
      }
    }
    result.worker = {
      installToCsrCreated: stat(workers, "toCsrS"),
      installToOscApplied: stat(workers, "toAppliedS"),
      installToNodeReady: stat(workers, "toReadyS"),
      installToPodReady: stat(workers, "toPodReadyS"),
      samples: workers,
    };
  } finally {
    await world.stop();
  }
}
saveResult("bootstrap", result, (result.date as string).slice(0, 10));
