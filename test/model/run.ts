// The model-based test's runner: many seeded schedules of one agent implementation under fault
// profiles, each checked against the invariants (truth.ts, invariants.ts).
//
//   bun test/model/run.ts --target old --profile death --seeds 200 --steps 3000
//   bun test/model/run.ts --target old --profile all --seed 17 --trace     (one schedule, its violations' traces)
//   bun test/model/run.ts --target old --profile all --seed 17 --dump      (one schedule, everything it did)
//
//   bun test/model/run.ts --target old --known     (replays the schedules of old-findings.ts: each must
//                                                    still violate its invariant)
//   bun test/model/run.ts --target old --profile holder-death --seeds 500 --until I1 --match dead
//                                                       (a search: stops at the first schedule violating I1
//                                                        with "dead" in its message; prints how long it took)
//   bun test/model/run.ts --target new --profile every --seeds 1000 --threads 2
//                                                       (on two cores: the violations are printed at the end)
//
// --profile takes a name of faults.ts, a comma-separated list, or "every" (each in turn). Prints each
// violated invariant with its seed and the end of its trace, then schedules and steps per second. Exits
// 1 when any schedule violated an invariant (0 with --expect-violations when one did, for the old code).
import { parseArgs } from "node:util";
import { profiles } from "./faults.ts";
import { findingSteps, oldFindings } from "./old-findings.ts";
import { runParallel, summary } from "./parallel.ts";
import { runSchedule, type ScheduleResult } from "./scheduler.ts";
import { targets } from "./targets.ts";

const { values } = parseArgs({
  options: {
    target: { type: "string", default: "old" },
    profile: { type: "string", default: "all" },
    seeds: { type: "string", default: "50" },
    from: { type: "string", default: "1" },
    seed: { type: "string" },
    steps: { type: "string", default: "3000" },
    "quiet-min": { type: "string", default: "20" },
    trace: { type: "boolean", default: false },
    dump: { type: "boolean", default: false },
    "trace-lines": { type: "string", default: "24" },
    quiet: { type: "boolean", default: false },
    until: { type: "string" },
    known: { type: "boolean", default: false },
    match: { type: "string" },
    "expect-violations": { type: "boolean", default: false },
    threads: { type: "string", default: "1" },
  },
});

const makeDriver = targets[values.target];
if (!makeDriver) throw new Error(`--target: one of ${Object.keys(targets).join(", ")}`);
const names = values.profile === "every" ? Object.keys(profiles) : values.profile.split(",");
for (const n of names) if (!profiles[n]) throw new Error(`--profile: ${n} is not one of ${Object.keys(profiles).join(", ")}, every`);
const seeds = values.seed !== undefined ? [Number(values.seed)] : Array.from({ length: Number(values.seeds) }, (_, i) => Number(values.from) + i);
const steps = Number(values.steps);
const quietMs = Number(values["quiet-min"]) * 60_000;
const traceLines = Number(values["trace-lines"]);

const driver = makeDriver();
await driver.prepare?.();

if (values.known) {
  let lost = 0;
  for (const f of oldFindings) {
    const r = await runSchedule({ driver, profile: profiles[f.profile] as (typeof profiles)[string], seed: f.seed, steps: findingSteps, quietMs });
    const v = r.violations.find((x) => x.invariant === f.invariant);
    if (!v) lost++;
    console.log(`${v ? "found" : "LOST "} defect ${f.defect}: ${f.profile} seed ${f.seed}, ${f.invariant}${v ? ` at ${(v.atMs / 1000).toFixed(1)}s` : ""}`);
    if (!v) console.log(`      expected: ${f.trace}`);
  }
  process.exit(lost === 0 ? 0 : 1);
}

const threads = Number(values.threads);
if (threads > 1) {
  if (values.until || values.dump || values.known) throw new Error("--threads: not with --until, --dump or --known");
  const jobs = names.flatMap((profile) => seeds.map((seed) => ({ profile, seed })));
  const r = await runParallel({ target: values.target, jobs, steps, quietMs, traceLines, threads });
  const firstOfEach = new Set<string>();
  for (const f of r.found) {
    const key = `${f.profile} ${f.invariant}`;
    if (firstOfEach.has(key) && !values.trace) continue;
    firstOfEach.add(key);
    console.log(`\n${f.head}\n  ${f.invariant} at step ${f.step}, ${(f.atMs / 1000).toFixed(1)}s: ${f.message}${f.count > 1 ? ` (and ${f.count - 1} more)` : ""}`);
    if (!values.quiet) for (const line of f.trace) console.log(`      ${line}`);
  }
  console.log(`\n${driver.name}: ${r.schedules} schedule(s), ${r.steps} steps, ${(r.virtualMs / 3_600_000).toFixed(1)} h virtual, in ${r.seconds.toFixed(1)} s on ${threads} threads: ${(r.schedules / r.seconds).toFixed(1)} schedules/s, ${Math.round(r.steps / r.seconds)} steps/s`);
  const lines = summary(r.found);
  console.log(lines.length === 0 ? "no invariant violated" : lines.map((l) => `  ${l}`).join("\n"));
  process.exit(lines.length > 0 === values["expect-violations"] ? 0 : 1);
}

const until = values.until?.split(",");
const match = values.match !== undefined ? new RegExp(values.match) : undefined;
const wanted = (r: ScheduleResult) => r.violations.filter((v) => (!until || until.includes(v.invariant)) && (!match || match.test(v.message)));

const started = performance.now();
let schedules = 0;
let totalSteps = 0;
let virtualMs = 0;
const bySeed = new Map<string, number[]>();
search: for (const name of names) {
  const profile = profiles[name] as (typeof profiles)[string];
  for (const seed of seeds) {
    const t0 = performance.now();
    const r = await runSchedule({ driver, profile, seed, steps, quietMs, dump: values.dump });
    if (r.trace) for (const line of r.trace) console.log(line);
    schedules++;
    totalSteps += r.steps;
    virtualMs += r.virtualMs;
    for (const v of r.violations) bySeed.set(`${name} ${v.invariant}`, [...(bySeed.get(`${name} ${v.invariant}`) ?? []), seed]);
    const found = wanted(r);
    if (until && found.length === 0) continue;
    if (r.violations.length > 0 || values.trace) report(r, performance.now() - t0);
    if (until) {
      console.log(`\nfound after ${schedules} schedule(s), ${totalSteps} steps, ${((performance.now() - started) / 1000).toFixed(1)} s of search`);
      break search;
    }
  }
}
const seconds = (performance.now() - started) / 1000;

console.log(`\n${driver.name}: ${schedules} schedule(s), ${totalSteps} steps, ${(virtualMs / 3_600_000).toFixed(1)} h virtual, in ${seconds.toFixed(1)} s: ${(schedules / seconds).toFixed(1)} schedules/s, ${Math.round(totalSteps / seconds)} steps/s`);
if (bySeed.size === 0) console.log("no invariant violated");
for (const [key, s] of [...bySeed].sort()) console.log(`  ${key}: ${s.length} schedule(s), seeds ${s.slice(0, 12).join(", ")}${s.length > 12 ? ", …" : ""}`);
process.exitCode = bySeed.size > 0 === values["expect-violations"] ? 0 : 1;

function report(r: ScheduleResult, ms: number): void {
  const c = r.config;
  const head = `seed ${r.seed} [${r.profile}] ${c.nodes} nodes, k=${c.budget}, rollback ${c.rollback ? "on" : "off"}${c.overlays ? ", overlays" : ""}: ${r.steps} steps, ${(r.virtualMs / 60_000).toFixed(1)} min virtual, ${r.revisions} revisions, ${r.api.requests} requests (${r.api.conflicts} conflicts), ${ms.toFixed(0)} ms`;
  console.log(`\n${head}`);
  for (const v of r.violations) {
    console.log(`  ${v.invariant} at step ${v.step}, ${(v.atMs / 1000).toFixed(1)}s: ${v.message}${(r.counts[v.invariant] ?? 1) > 1 ? ` (and ${(r.counts[v.invariant] ?? 1) - 1} more)` : ""}`);
    if (!values.quiet) for (const line of v.trace.slice(-traceLines)) console.log(`      ${line}`);
  }
}
