// bun --preload ./build/shims/preload.ts test/bench/bootstrap.ts [runs=10]
// From starting install.sh on a booted bare node to the first OSC applied (the Node annotated with its
// checksum), with real components: install.sh pulls trellis through the containerd mirror, bootstrap
// gets its certificate through a CSR (approved by this script as soon as it appears, as an automatic
// approver would), the agent applies the OSC (a kubelet stand-in, an image file, containerd's config).
// Each run uses a fresh node. Phases: install.sh start → CSR created → certificate issued (approval +
// signing) → OSC applied. Writes test/bench/results/bootstrap-<date>.json.
import { CertificatesV1Api } from "@kubernetes/client-node";
import { putOscSecret, waitApplied } from "../harness/agent.ts";
import { bareNode, bareOsc, installAndApprove, pushImage, pushTrellis } from "../harness/bare-node.ts";
import { trellisBinary } from "../harness/binary.ts";
import { grantCsrRbac } from "../harness/bootstrap.ts";
import { startCluster } from "../harness/cluster.ts";
import { runOk, waitFor } from "../harness/exec.ts";
import { startRegistry } from "../harness/registry.ts";
import { saveResult } from "./lib/results.ts";

const runs = Number(process.argv[2] ?? 10);
const secretName = "gardener-node-agent-bench";
const binary = await trellisBinary();
const [cluster, registry] = await Promise.all([startCluster(), startRegistry()]);
try {
  await grantCsrRbac(cluster);
  const version = JSON.parse(await runOk([binary, "version", "--json"])).version as string;
  await pushTrellis(registry, "bench", binary, version);
  await pushImage(registry, "tools/tool", "v1", { "usr/bin/tool": { content: "#!/bin/sh\necho tool\n", mode: 0o755 } });
  const checksum = await putOscSecret(cluster, secretName, bareOsc({ mirror: registry.host, agentTag: "bench" }));
  const csrs = cluster.admin().makeApiClient(CertificatesV1Api);
  const samples: { totalS: number; toCsrS: number; certificateS: number; applyS: number }[] = [];
  for (let i = 0; i < runs; i++) {
    const bare = await bareNode(cluster, registry, "bench", secretName);
    try {
      const { csr: name, startedMs: t0, csrSeenMs: t1 } = await installAndApprove(cluster, registry, bare, "bench");
      await waitFor("the certificate", async () => ((await csrs.readCertificateSigningRequest({ name })).status?.certificate ? true : undefined), 60_000, 20);
      const t2 = performance.now();
      await waitApplied(bare, checksum, 120_000);
      const t3 = performance.now();
      samples.push({ totalS: (t3 - t0) / 1000, toCsrS: (t1 - t0) / 1000, certificateS: (t2 - t1) / 1000, applyS: (t3 - t2) / 1000 });
      console.error(`run ${i + 1}/${runs}: ${((t3 - t0) / 1000).toFixed(2)} s`);
    } finally {
      await bare.stop();
    }
  }
  const stat = (k: keyof (typeof samples)[number]) => {
    const xs = samples.map((s) => s[k]).sort((a, b) => a - b);
    const median = xs.length % 2 ? (xs[(xs.length - 1) / 2] as number) : ((xs[xs.length / 2 - 1] as number) + (xs[xs.length / 2] as number)) / 2;
    return { median: Number(median.toFixed(3)), min: Number((xs[0] as number).toFixed(3)), max: Number((xs[xs.length - 1] as number).toFixed(3)) };
  };
  const result = {
    date: new Date().toISOString(),
    runs,
    binaryMiB: Number(((await Bun.file(binary).size) / 2 ** 20).toFixed(1)),
    installToApplied: stat("totalS"),
    phases: { installToCsrCreated: stat("toCsrS"), csrApprovedToCertificate: stat("certificateS"), certificateToOscApplied: stat("applyS") },
    samples,
  };
  saveResult("bootstrap", result, result.date.slice(0, 10));
} finally {
  await registry.stop();
  await cluster.stop();
}
