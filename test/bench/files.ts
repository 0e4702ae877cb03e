// bun test/bench/files.ts [runs=100] [DIR...] — medians of src/host/files.ts with root "/" (as on a node):
// writeAtomic of 1 KiB and 1 MiB (temp file, fsync, rename, directory fsync) and sha256 of 1 MiB, in a
// scratch directory under each DIR (default /dev/shm, a tmpfs, /tmp and /var/tmp). Prints JSON with each
// DIR's filesystem type (stat -f calls ext4 "ext2/ext3").
import { mkdtempSync, rmSync } from "node:fs";
import { createFiles } from "../../src/host/files.ts";
import { runOk } from "../harness/exec.ts";

const runs = Number(process.argv[2] ?? 100);
const dirs = process.argv.length > 3 ? process.argv.slice(3) : ["/dev/shm", "/tmp", "/var/tmp"];

const median = (xs: number[]) => {
  const s = [...xs].sort((a, b) => a - b);
  const m = s.length >> 1;
  return s.length % 2 ? (s[m] as number) : ((s[m - 1] as number) + (s[m] as number)) / 2;
};

/** Median milliseconds of `runs` calls of `fn`, after one warm-up call. */
async function time(fn: () => Promise<unknown>): Promise<number> {
  await fn();
  const samples: number[] = [];
  for (let i = 0; i < runs; i++) {
    const t0 = performance.now();
    await fn();
    samples.push(performance.now() - t0);
  }
  return Number(median(samples).toFixed(3));
}

const kib = new Uint8Array(1024).fill(0x61);
const mib = new Uint8Array(1 << 20).fill(0x62);
const files = createFiles("/");
const results: Record<string, unknown> = {};
for (const dir of dirs) {
  const scratch = mkdtempSync(`${dir.replace(/\/$/, "")}/trellis-bench-files-`);
  try {
    results[dir] = {
      fs: (await runOk(["stat", "-f", "-c", "%T", scratch])).trim(),
      writeAtomic1KiBMs: await time(() => files.writeAtomic(`${scratch}/etc/small.conf`, kib, 0o644)),
      writeAtomic1MiBMs: await time(() => files.writeAtomic(`${scratch}/etc/large.bin`, mib, 0o644)),
      sha256Of1MiBMs: await time(() => files.sha256(`${scratch}/etc/large.bin`)),
    };
  } finally {
    rmSync(scratch, { recursive: true, force: true });
  }
}
console.log(JSON.stringify({ runs, results }, null, 2));
