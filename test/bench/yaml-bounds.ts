// Hostile and large osc.yaml documents through the `yaml` package's plain parse (what trellis did
// before src/api/yaml.ts) and through trellis's bounded parse: wall time and the process's peak RSS,
// each case in a fresh process. Everything a Secret can carry (1 MiB) is parsed, the worst of it is
// measured here; what is refused, is refused by a bound. `bun run bench:yaml` (about 3 minutes: the plain
// parse is cut off at 30 s).
import { parse } from "yaml";
import { parseYaml } from "../../src/api/yaml.ts";
import { generated } from "../fixtures/accepted-input/generate.ts";
import { oscYaml } from "./lib/bench-osc.ts";
import { saveResult } from "./lib/results.ts";

/** Lines of `line(i)`, joined, up to about `bytes` in all. */
const lines = (bytes: number, line: (i: number) => string) => {
  const out: string[] = [];
  for (let i = 0, n = 0; n < bytes; i++) n += (out[out.push(line(i)) - 1] as string).length + 1;
  return out.join("\n");
};

const cases: Record<string, () => string> = {
  "the benchmark OSC (1 MiB, 500 files, 50 units)": () => oscYaml(0),
  "an OSC of 1 MiB, 110 000 small keys in flow mappings": () => new TextDecoder().decode((generated.megabyteOfSmallKeys as () => Uint8Array)()),
  "block mapping of 1 MiB, 100 000 short keys": () => `spec:\n${lines(1_040_000, (i) => `  k${i.toString(36)}: 1`)}\n`,
  "block sequence of 1 MiB, 260 000 items": () => `spec:\n${lines(1_040_000, () => "- 1")}\n`,
  "flow list of 500 000 items (1 MiB)": () => `spec: [${"1,".repeat(520_000)}]\n`,
  "flow mapping of 70 000 keys (0.7 MiB)": () => `spec:\n  x: {${Array.from({ length: 70_000 }, (_, i) => `k${i}: 1`).join(",")}}\n`,
  "flow list of 1 MiB over 145 000 lines, 290 000 items": () => `spec: [${Array(145_000).fill("1,1").join(",\n  ")}]\n`,
  "block mapping of 60 000 keys (0.7 MiB)": () => `spec:\n${Array.from({ length: 60_000 }, (_, i) => `  k${i}: 1`).join("\n")}\n`,
  "1 MiB of commas in a flow list (invalid)": () => `spec: [${",".repeat(1_040_000)}]\n`,
  "4000 nested brackets and one alias (8 KB)": () => `spec:\n  x: &a ${"[".repeat(4000)}${"]".repeat(4000)}\n  y: *a\n`,
  "10 000 nested brackets and one alias (20 KB)": () => `spec:\n  x: &a ${"[".repeat(10_000)}${"]".repeat(10_000)}\n  y: *a\n`,
  "200 000 nested brackets (0.4 MiB)": () => `${"[".repeat(200_000)}${"]".repeat(200_000)}`,
  "a billion laughs (nine levels of ten aliases)": () =>
    ["a: &a [x,x,x,x,x,x,x,x,x,x]", ..."bcdefghi".split("").map((c, i) => `${c}: &${c} [${Array(10).fill(`*${"abcdefghi"[i]}`).join(",")}]`)].join("\n"),
};

const [, , mode, name] = process.argv;
if (mode === "plain" || mode === "bounded") {
  const text = (cases[name as string] as () => string)();
  const t0 = performance.now();
  let outcome = "parsed";
  try {
    if (mode === "plain") parse(text, { version: "1.1", maxAliasCount: 100 });
    else {
      const r = parseYaml(text, "osc.yaml");
      if (!r.ok) outcome = (r.errors[0] as string).replace("osc.yaml: ", "refused: ");
    }
  } catch (err) {
    outcome = `threw: ${String(err).split("\n")[0]}`;
  }
  const ms = performance.now() - t0;
  console.log(JSON.stringify({ ms: Math.round(ms), peakRssMiB: Math.round(process.resourceUsage().maxRSS / 1024), outcome }));
  process.exit(0);
}

type Run = { ms?: number; peakRssMiB?: number; outcome: string };
const limitMs = 30_000;
async function measure(m: string, n: string): Promise<Run> {
  const proc = Bun.spawn(["bun", import.meta.path, m, n], { stdout: "pipe", stderr: "ignore", timeout: limitMs });
  const out = await new Response(proc.stdout).text();
  await proc.exited;
  return out.trim() ? (JSON.parse(out) as Run) : { outcome: `killed after ${limitMs / 1000} s` };
}

const baseline = await measure("bounded", "the benchmark OSC (1 MiB, 500 files, 50 units)");
const rows: { case: string; plain: Run; bounded: Run }[] = [];
for (const n of Object.keys(cases)) rows.push({ case: n, plain: await measure("plain", n), bounded: await measure("bounded", n) });
const show = (r: Run) => (r.ms === undefined ? r.outcome : `${r.ms} ms, ${r.peakRssMiB} MiB`);
console.error(`process peak RSS includes the runtime (${baseline.peakRssMiB} MiB with the benchmark OSC parsed)`);
for (const r of rows) console.error(`${r.case.padEnd(48)} plain: ${show(r.plain).padEnd(24)} bounded: ${show(r.bounded).padEnd(18)} ${r.bounded.outcome}`);
saveResult("yaml-bounds", { rows }, new Date().toISOString().slice(0, 10));
