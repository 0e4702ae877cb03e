// bun test/bench/install.ts [--runs 10] [--no-real] [--no-sizes]
//
// How long install.sh takes on a fresh node: from starting it as cloud-init does to the moment it
// execs `gardener-node-agent bootstrap` (its "running … bootstrap" line in the unit's journal, which it
// writes right before the exec). Median/min/max over `runs` fresh nodes, for each way in: containerd
// through a hosts.toml mirror, and curl through the same mirror on a node without containerd; with a
// tiny fixture image (the script's own cost) and with the real image of dist/trellis (build/image.ts as a
// release builds it: zstd -19 layers, then the same images with gzip -9 ones; a node with zstd pulls the
// 42 MiB zstd layer), and on a node without the zstd command (the gzip image). Also the real image's
// compressed sizes (both layers of that one build).
//
// To extend to install → OSC applied once `bootstrap` exists: give measure() another `until` that
// waits for the Node's checksum annotation instead of the journal line.
import { readFileSync, rmSync } from "node:fs";
import { parseArgs } from "node:util";
import { repoRoot, trellisBinary } from "../harness/binary.ts";
import { runDir, runOk, waitFor } from "../harness/exec.ts";
import { bootNode, type Node } from "../harness/node.ts";
import { writeLayout } from "../harness/oci.ts";
import { startRegistry, type Registry } from "../harness/registry.ts";

const { values } = parseArgs({
  options: { runs: { type: "string", default: "10" }, "no-real": { type: "boolean", default: false }, "no-sizes": { type: "boolean", default: false } },
});
const runs = Number(values.runs);
const upstream = "registry.example.invalid";
const installScript = readFileSync(`${repoRoot}/install.sh`);

type Sample = { ms: number };
type Until = (node: Node, startedUs: number) => Promise<number>;

/** Microseconds (CLOCK_REALTIME, as the journal's timestamps) at which install.sh was about to exec bootstrap. */
const bootstrapInvoked: Until = (node) =>
  waitFor(
    "install.sh to exec bootstrap",
    async () => {
      const out = await node.execOk(["journalctl", "-u", "gardener-node-init.service", "-o", "json", "--no-pager"]);
      for (const line of out.split("\n").filter((l) => l !== "")) {
        const entry = JSON.parse(line) as { MESSAGE?: string; __REALTIME_TIMESTAMP: string };
        if (typeof entry.MESSAGE === "string" && entry.MESSAGE.startsWith("trellis-install: running ")) return Number(entry.__REALTIME_TIMESTAMP);
      }
      return false;
    },
    120_000,
    20,
  );

/** Boots a fresh node per run, runs install.sh as cloud-init would, and times it until `until`. */
async function measure(registry: Registry, image: string, containerd: boolean, until: Until, withoutZstd = false): Promise<Sample[]> {
  const samples: Sample[] = [];
  for (let i = 0; i < runs; i++) {
    const node = await bootNode("bench-inst", { net: "host", containerd });
    try {
      if (withoutZstd) await node.execOk(["rm", "-f", "/usr/bin/zstd"]); // the node's overlay only
      await node.writeFile(`/etc/containerd/certs.d/${upstream}/hosts.toml`, `server = "https://127.0.0.1:1"\n\n[host."http://${registry.host}"]\n  capabilities = ["pull", "resolve"]\n`);
      await node.writeFile("/var/lib/cloud/instance/scripts/part-001", installScript, 0o700);
      const startedUs = Math.round((performance.timeOrigin + performance.now()) * 1000);
      await node.execOk(["sh", "/var/lib/cloud/instance/scripts/part-001"], { env: { TRELLIS_IMAGE: image } });
      const doneUs = await until(node, startedUs);
      samples.push({ ms: (doneUs - startedUs) / 1000 });
    } finally {
      await node.stop();
    }
  }
  return samples;
}

function summary(samples: Sample[]) {
  const ms = samples.map((s) => s.ms).sort((a, b) => a - b);
  const mid = ms.length >> 1;
  const median = ms.length % 2 ? (ms[mid] as number) : ((ms[mid - 1] as number) + (ms[mid] as number)) / 2;
  const r = (x: number) => Number(x.toFixed(1));
  return { runs: ms.length, medianMs: r(median), minMs: r(ms[0] as number), maxMs: r(ms[ms.length - 1] as number) };
}

async function push(registry: Registry, layout: string, tag: string, digest: string): Promise<string> {
  await runOk(["skopeo", "copy", "-q", "--all", "--preserve-digests", "--dest-tls-verify=false", `oci:${layout}:${tag}`, `docker://${registry.host}/trellis/agent:${tag}`]);
  return `${upstream}/trellis/agent:${tag}@${digest}`;
}

type ImageInfo = { layerBytes: number; binaryBytes: number };
async function imageJson(out: string) {
  const stdout = await runOk(["bun", "run", "image", "--", "--no-build", "--arch", "amd64", "--out", out, "--json"], { cwd: repoRoot, timeoutMs: 900_000 });
  return JSON.parse(stdout.trim().split("\n").pop() as string) as { index: string; tag: string; images: ImageInfo[]; alternatives: ImageInfo[] };
}

const registry = await startRegistry();
const dir = runDir("bench-install");
const result: Record<string, unknown> = { runs, host: { cpus: navigator.hardwareConcurrency } };
try {
  const fixtureAgent = "#!/bin/sh\n# FIXTURE standing in for gardener-node-agent\nexit 0\n";
  const fixture = writeLayout(`${dir}/fixture`, "bench-fixture", [
    { platform: { os: "linux", architecture: "amd64" }, layers: [{ "gardener-node-agent": { content: fixtureAgent, mode: 0o755 } }] },
  ]);
  const fixtureRef = await push(registry, `${dir}/fixture`, "bench-fixture", fixture.root.digest);
  const times: Record<string, unknown> = {};
  for (const containerd of [true, false]) times[`fixture, ${containerd ? "containerd" : "curl"}`] = summary(await measure(registry, fixtureRef, containerd, bootstrapInvoked));

  const real = values["no-real"] && values["no-sizes"] ? undefined : (await trellisBinary(), await imageJson(`${dir}/real`));
  if (real && !values["no-real"]) {
    const realRef = await push(registry, `${dir}/real`, real.tag, real.index);
    for (const containerd of [true, false]) {
      const how = containerd ? "containerd" : "curl";
      times[`real image, ${how}`] = summary(await measure(registry, realRef, containerd, bootstrapInvoked));
      times[`real image, ${how}, no zstd on the node (gzip image)`] = summary(await measure(registry, realRef, containerd, bootstrapInvoked, true));
    }
  }
  result.installToBootstrapMs = times;

  if (real && !values["no-sizes"]) {
    const mib = (b: number) => Number((b / 2 ** 20).toFixed(1));
    const [zst, gz] = [real.images[0], real.alternatives[0]];
    result.imageLayerMiB = { binary: mib(zst?.binaryBytes ?? 0), zstd19: mib(zst?.layerBytes ?? 0), gzip9: mib(gz?.layerBytes ?? 0) };
  }
} finally {
  await registry.stop();
  rmSync(dir, { recursive: true, force: true });
}
console.log(JSON.stringify(result, null, 2));
