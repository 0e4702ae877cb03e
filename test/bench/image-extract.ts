// bun test/bench/image-extract.ts [runs=5] — pull + extract of one 100 MiB random binary through the
// real registry (Debian's docker-registry on 127.0.0.1, via a hosts.toml mirror, as on a node), with
// src/host/registry/store.ts: resolve the tag, fetch manifest and config, stream the layer (hash, decompress,
// scan the tar, write the file, fsync, rename). Each run is a fresh process with an empty cache directory
// (so its peak RSS is the extraction's own, not the 100 MiB test image's); a final run with the cache warm
// shows what an unchanged tag costs. Layers gzip (level 6, the usual) and zstd (level 3).
// Prints JSON: median/min/max milliseconds per compression and the runs' peak RSS.
import { createHash, randomBytes } from "node:crypto";
import { mkdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { createImageStore } from "../../src/host/registry/store.ts";
import { createLogger } from "../../src/log.ts";
import { runDir, runOk } from "../harness/exec.ts";
import { writeLayout } from "../harness/oci.ts";
import { startRegistry } from "../harness/registry.ts";

// Child mode: one extraction, timed inside the process; prints {ms, pulled, sha256, maxRssMiB}.
if (process.argv[2] === "--child") {
  const [cacheDir, hostsDir, image, filePathInImage] = process.argv.slice(3) as [string, string, string, string];
  const store = createImageStore({ cacheDir, hostsDir, arch: "amd64", log: createLogger({ level: "warn" }) });
  const t0 = performance.now();
  const got = await store.extract({ image, filePathInImage });
  const ms = performance.now() - t0;
  // VmHWM, not getrusage's maxRSS: Linux carries ru_maxrss over from the parent (whose 100 MiB test image would show).
  const hwmKiB = Number(/^VmHWM:\s+(\d+) kB$/m.exec(readFileSync("/proc/self/status", "utf8"))?.[1]);
  console.log(JSON.stringify({ ms, pulled: got.pulled, sha256: got.sha256, maxRssMiB: hwmKiB / 1024 }));
  process.exit(0);
}

const runs = Number(process.argv[2] ?? 5);
const size = 100 << 20;

const median = (xs: number[]) => {
  const s = [...xs].sort((a, b) => a - b);
  const m = s.length >> 1;
  return s.length % 2 ? (s[m] as number) : ((s[m - 1] as number) + (s[m] as number)) / 2;
};
const round = (x: number) => Number(x.toFixed(1));

const dir = runDir("bench-image-extract");
const registry = await startRegistry();
try {
  const content = randomBytes(size);
  const sha256 = createHash("sha256").update(content).digest("hex");
  const upstream = "registry.example.invalid";
  mkdirSync(`${dir}/certs.d/${upstream}`, { recursive: true });
  writeFileSync(`${dir}/certs.d/${upstream}/hosts.toml`, `[host."http://${registry.host}"]\n  capabilities = ["pull", "resolve"]\n`);
  const results: Record<string, unknown> = {};

  for (const [compression, level] of [
    ["gzip", 6],
    ["zstd", 3],
  ] as const) {
    const layout = `${dir}/layout-${compression}`;
    const written = writeLayout(layout, "v1", { platform: { os: "linux", architecture: "amd64" }, layers: [{ "opt/bin/big": { content, mode: 0o755 } }] }, { compression, level });
    await registry.push(layout, `bench/${compression}`, "v1");
    rmSync(layout, { recursive: true, force: true });
    const req = { image: `${upstream}/bench/${compression}:v1`, filePathInImage: "/opt/bin/big" };

    type Run = { ms: number; pulled: boolean; sha256: string; maxRssMiB: number };
    const extract = async (cacheDir: string): Promise<Run> =>
      JSON.parse(await runOk(["bun", import.meta.path, "--child", cacheDir, `${dir}/certs.d`, req.image, req.filePathInImage])) as Run;
    const samples: number[] = [];
    const rss: number[] = [];
    let cacheDir = "";
    for (let i = 0; i < runs; i++) {
      if (cacheDir) rmSync(cacheDir, { recursive: true, force: true });
      cacheDir = `${dir}/cache-${compression}-${i}`;
      const got = await extract(cacheDir);
      if (got.sha256 !== sha256 || !got.pulled) throw new Error(`run ${i}: wrong result ${JSON.stringify(got)}`);
      samples.push(got.ms);
      rss.push(got.maxRssMiB);
    }
    const warm = await extract(cacheDir);
    if (warm.pulled) throw new Error("the warm run downloaded again");
    rmSync(cacheDir, { recursive: true, force: true });

    results[compression] = {
      layerBytes: written.images[0]?.layers[0]?.size,
      medianMs: round(median(samples)),
      minMs: round(Math.min(...samples)),
      maxMs: round(Math.max(...samples)),
      medianMiBPerSecond: round(size / 1048576 / (median(samples) / 1000)),
      cachedUnchangedTagMs: round(warm.ms),
      samplesMs: samples.map(round),
      peakRssMiB: round(Math.max(...rss)),
      cachedPeakRssMiB: round(warm.maxRssMiB),
    };
  }
  console.log(
    JSON.stringify(
      {
        what: "pull + extract of a 100 MiB random binary from a single-layer image, real registry on 127.0.0.1, a fresh process and empty cache each run",
        runs,
        fileBytes: size,
        results,
      },
      null,
      2,
    ),
  );
} finally {
  await registry.stop();
  rmSync(dir, { recursive: true, force: true });
}
