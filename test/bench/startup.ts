// bun test/bench/startup.ts [runs=10] — start-up time and peak RSS of `dist/trellis version`, and the
// binary's size (raw, gzip -9, zstd -19). Medians over `runs` runs after one warm-up.
import { statSync } from "node:fs";
import { trellisBinary } from "../harness/binary.ts";
import { runOk } from "../harness/exec.ts";

const runs = Number(process.argv[2] ?? 10);
const bin = await trellisBinary();

function once(): { ms: number; rssKiB: number } {
  const t0 = performance.now();
  const p = Bun.spawnSync([bin, "version"], { stdout: "ignore", stderr: "ignore" });
  const ms = performance.now() - t0;
  if (p.exitCode !== 0) throw new Error(`${bin} version exited ${p.exitCode}`);
  return { ms, rssKiB: Math.round((p.resourceUsage?.maxRSS ?? 0) / 1024) };
}
const median = (xs: number[]) => {
  const s = [...xs].sort((a, b) => a - b);
  const m = s.length >> 1;
  return s.length % 2 ? (s[m] as number) : ((s[m - 1] as number) + (s[m] as number)) / 2;
};

once();
const samples = Array.from({ length: runs }, once);
const size = statSync(bin).size;
const gz = Number((await runOk(["sh", "-c", `gzip -9 -c '${bin}' | wc -c`])).trim());
const zst = Number((await runOk(["sh", "-c", `zstd -19 -T0 -q -c '${bin}' | wc -c`])).trim());
const mib = (b: number) => `${(b / 1048576).toFixed(1)} MiB`;
console.log(
  JSON.stringify(
    {
      runs,
      versionStartupMsMedian: Number(median(samples.map((s) => s.ms)).toFixed(1)),
      versionStartupMsMin: Number(Math.min(...samples.map((s) => s.ms)).toFixed(1)),
      versionStartupMsMax: Number(Math.max(...samples.map((s) => s.ms)).toFixed(1)),
      versionPeakRssMiBMedian: Number((median(samples.map((s) => s.rssKiB)) / 1024).toFixed(1)),
      binary: { raw: mib(size), gzip9: mib(gz), zstd19: mib(zst) },
    },
    null,
    2,
  ),
);
