// The model-based test of the new rollout design (test/model/new-driver.ts: the real startRollout, state
// machine and pool protocol on every simulated node) in CI: 1,112 schedules of each of the 9 fault families
// (10,008 in all), each 500 steps with faults and then up to 10 virtual minutes of quiet time (`bun run
// model` runs them at length). Two threads (parallel.ts), one per core of the CI machine. Any violated
// invariant fails its family's test, which prints each one's seed, the command that replays it and the
// end of its trace.
//
// Also the schedules that find today's code's defects (old-findings.ts), replayed against the new design:
// the same seeds and families, with the same steps, must violate nothing.
import { describe, expect, test } from "bun:test";
import { profiles } from "./faults.ts";
import { newDriver } from "./new-driver.ts";
import { findingSteps, oldFindings } from "./old-findings.ts";
import { type Found, runParallel, summary } from "./parallel.ts";
import { runSchedule } from "./scheduler.ts";

const perFamily = 1_112;
const steps = 500;
const quietMs = 10 * 60_000;
const threads = 2;
const traceLines = 30;

const replay = (f: { profile: string; seed: number }, s: number, quietMin: number) => `bun run model -- --target new --profile ${f.profile} --seed ${f.seed} --steps ${s} --quiet-min ${quietMin} --trace`;

function report(found: readonly Found[], s: number, quietMin: number): string {
  const lines = summary(found);
  const firstOfEach = new Map<string, Found>();
  for (const f of found) if (!firstOfEach.has(`${f.profile} ${f.invariant}`)) firstOfEach.set(`${f.profile} ${f.invariant}`, f);
  for (const f of firstOfEach.values()) {
    lines.push("", f.head, `  ${f.invariant} at step ${f.step}, ${(f.atMs / 1000).toFixed(1)}s: ${f.message}${f.count > 1 ? ` (and ${f.count - 1} more)` : ""}`, `  replay: ${replay(f, s, quietMin)}`);
    for (const t of f.trace) lines.push(`      ${t}`);
  }
  return lines.join("\n");
}

describe("model: the new design under faults", () => {
  for (const profile of Object.keys(profiles)) {
    test(`${profile}: ${perFamily} schedules violate no invariant`, async () => {
      const jobs = Array.from({ length: perFamily }, (_, i) => ({ profile, seed: i + 1 }));
      const r = await runParallel({ target: "new", jobs, steps, quietMs, traceLines, threads });
      console.log(`new design, ${profile}: ${r.schedules} schedules, ${r.steps} steps, ${(r.virtualMs / 3_600_000).toFixed(0)} h virtual, in ${r.seconds.toFixed(1)} s`);
      if (r.found.length > 0) console.log(report(r.found, steps, quietMs / 60_000));
      expect(r.schedules).toBe(jobs.length);
      expect(summary(r.found)).toEqual([]);
      // About 12 s a family on two free cores; a busy machine (other suites beside it) takes several times that.
    }, 300_000);
  }

  test("the schedules that find today's code's defects find none in the new design", async () => {
    const found: Found[] = [];
    for (const f of oldFindings) {
      const r = await runSchedule({ driver: newDriver(), profile: profiles[f.profile] as (typeof profiles)[string], seed: f.seed, steps: findingSteps, world: { traceLines } });
      for (const v of r.violations) found.push({ ...v, profile: f.profile, seed: f.seed, count: r.counts[v.invariant] ?? 1, head: `old finding "${f.defect}": ${f.profile} seed ${f.seed}` });
    }
    if (found.length > 0) console.log(report(found, findingSteps, 20));
    expect(summary(found)).toEqual([]);
  }, 120_000);
});
