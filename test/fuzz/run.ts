// `bun run fuzz [--seed S] [--cases N]`: N generated cases (default 100 000) through the resolver and
// planner (property.ts) in a worker; a case that runs longer than --hang-ms or takes the process above
// --max-rss-mb is stopped and counted as a finding. Prints cases/s, outcomes, findings with the command
// that replays each, the seed and the peak RSS; exits 1 when something was found.
// `bun run fuzz --seed S --case N [--save NAME]` replays one case in process, prints it and its
// findings, and with --save writes it to test/fixtures/fuzz/NAME.json, which test/unit/fuzz.test.ts replays.
import { rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { parseArgs } from "node:util";
import { fixturesDir } from "./case.ts";
import { generateCase } from "./generate.ts";
import { createEnv, disposeEnv, type Finding, runCase } from "./property.ts";
import type { Job, Report } from "./worker.ts";

const { values } = parseArgs({
  args: Bun.argv.slice(2),
  options: {
    seed: { type: "string" },
    cases: { type: "string", default: "100000" },
    case: { type: "string" },
    save: { type: "string" },
    "hang-ms": { type: "string", default: "30000" },
    "max-rss-mb": { type: "string", default: "2048" },
  },
});
const seed = values.seed !== undefined ? Number(values.seed) >>> 0 : (Math.random() * 2 ** 32) >>> 0;

async function replay(index: number): Promise<number> {
  const c = generateCase(seed, index);
  const env = createEnv();
  try {
    const r = await runCase(c, env);
    console.log(JSON.stringify(c, null, 2));
    console.log(`seed ${seed} case ${index}: ${r.outcome} in ${r.ms.toFixed(1)} ms, ${r.findings.length} finding(s)`);
    for (const f of r.findings) console.log(`  ${f.property}: ${f.detail}`);
    if (values.save) {
      const path = join(fixturesDir, `${values.save}.json`);
      writeFileSync(path, `${JSON.stringify(c, null, 2)}\n`);
      console.log(`saved ${path}`);
    }
    return r.findings.length > 0 ? 1 : 0;
  } finally {
    disposeEnv(env);
  }
}

async function campaign(cases: number): Promise<number> {
  const hangMs = Number(values["hang-ms"]);
  const maxRss = Number(values["max-rss-mb"]) * 1024 * 1024;
  const outcomes = new Map<string, number>();
  const findings = new Map<string, { count: number; first: { index: number; detail: string }[] }>();
  const note = (index: number, f: Finding) => {
    // Grouped by what went wrong, not by which hash, mode or duration it happened with.
    const gist = (f.detail.split("\n")[0] ?? "").replace(/[0-9a-f]{12,}/g, "H").replace(/\b0[0-7]{3,4}\b/g, "M").replace(/\d+(\.\d+)? ms/g, "N ms");
    const key = `${f.property}: ${gist.slice(0, 160)}`;
    const entry = findings.get(key) ?? { count: 0, first: [] };
    entry.count++;
    if (entry.first.length < 3) entry.first.push({ index, detail: f.detail });
    findings.set(key, entry);
  };
  const started = performance.now();
  let done = 0;
  let peakRss = 0;
  let slowest = { index: -1, ms: 0 };
  let next = 0;
  console.log(`fuzz: seed ${seed}, ${cases} cases`);
  while (next < cases) {
    // One worker per run of cases; a stopped case ends its worker and the next one starts after it.
    next = await new Promise<number>((resolve) => {
      const worker = new Worker(new URL("./worker.ts", import.meta.url).href);
      let current = next;
      let dir: string | undefined;
      let lastSign = performance.now();
      const stop = (property: string, detail: string) => {
        clearInterval(watch);
        worker.terminate();
        if (dir) rmSync(dir, { recursive: true, force: true });
        note(current, { property, detail });
        outcomes.set("stopped", (outcomes.get("stopped") ?? 0) + 1);
        done++;
        resolve(current + 1);
      };
      const watch = setInterval(() => {
        const rss = process.memoryUsage().rss;
        peakRss = Math.max(peakRss, rss);
        if (rss > maxRss) stop("bounded memory", `RSS ${(rss / 2 ** 20).toFixed(0)} MiB > ${values["max-rss-mb"]} MiB`);
        else if (performance.now() - lastSign > hangMs) stop("no hang", `no answer within ${hangMs} ms`);
      }, 100);
      let lastPrint = performance.now();
      worker.onmessage = (event: MessageEvent<Report>) => {
        const m = event.data;
        lastSign = performance.now();
        if (m.type === "env") dir = m.dir;
        else if (m.type === "start") current = m.index;
        else if (m.type === "done") {
          done++;
          outcomes.set(m.outcome, (outcomes.get(m.outcome) ?? 0) + 1);
          for (const f of m.findings) note(m.index, f);
          if (m.ms > slowest.ms) slowest = { index: m.index, ms: m.ms };
          if (lastSign - lastPrint > 10_000) {
            lastPrint = lastSign;
            console.log(`  ${done} cases, ${rate(done, started)} cases/s, ${[...findings.values()].reduce((n, f) => n + f.count, 0)} finding(s), peak RSS ${mib(peakRss)}`);
          }
        } else {
          clearInterval(watch);
          worker.terminate();
          resolve(cases);
        }
      };
      worker.onerror = (event) => stop("no exception", `worker error: ${event.message}`);
      worker.postMessage({ seed, from: next, to: cases } satisfies Job);
    });
  }
  const seconds = (performance.now() - started) / 1000;
  const total = [...findings.values()].reduce((n, f) => n + f.count, 0);
  console.log(`fuzz: seed ${seed}: ${done} cases in ${seconds.toFixed(1)} s (${rate(done, started)} cases/s), peak RSS ${mib(peakRss)}, slowest case ${slowest.index} ${slowest.ms.toFixed(0)} ms`);
  console.log(`  outcomes: ${[...outcomes].sort().map(([k, n]) => `${k} ${n}`).join(", ")}`);
  console.log(`  findings: ${total}${total ? ` in ${findings.size} kind(s)` : ""}`);
  for (const [key, f] of findings) {
    console.log(`  ${f.count}× ${key}`);
    for (const x of f.first) console.log(`      bun run fuzz --seed ${seed} --case ${x.index}    # ${x.detail.split("\n")[0]?.slice(0, 200)}`);
  }
  return total > 0 ? 1 : 0;
}

function rate(n: number, since: number): string {
  return (n / ((performance.now() - since) / 1000)).toFixed(0);
}

const mib = (bytes: number) => `${(bytes / 2 ** 20).toFixed(0)} MiB`;

process.exit(values.case !== undefined ? await replay(Number(values.case)) : await campaign(Number(values.cases)));
