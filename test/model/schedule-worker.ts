// A thread of parallel.ts: runs the schedules it is given, one after the other, and posts back what it
// found. The driver is prepared once per thread (the old code is loaded once).
import { profiles } from "./faults.ts";
import type { Found, JobsRequest, JobsResult } from "./parallel.ts";
import { runSchedule } from "./scheduler.ts";
import { targets } from "./targets.ts";

declare const self: Worker;

self.onmessage = async (e: MessageEvent<JobsRequest>) => {
  try {
    self.postMessage(await run(e.data));
  } catch (err) {
    self.postMessage({ error: err instanceof Error ? (err.stack ?? err.message) : String(err) });
  }
};

async function run(r: JobsRequest): Promise<JobsResult> {
  const make = targets[r.target];
  if (!make) throw new Error(`no target ${r.target}`);
  const driver = make();
  await driver.prepare?.();
  const out: JobsResult = { schedules: 0, steps: 0, virtualMs: 0, found: [] };
  for (const job of r.jobs) {
    const profile = profiles[job.profile];
    if (!profile) throw new Error(`no profile ${job.profile}`);
    const s = await runSchedule({ driver, profile, seed: job.seed, steps: r.steps, quietMs: r.quietMs, world: { traceLines: r.traceLines } });
    out.schedules++;
    out.steps += s.steps;
    out.virtualMs += s.virtualMs;
    const c = s.config;
    const head = `seed ${s.seed} [${s.profile}] ${c.nodes} nodes, k=${c.budget}, rollback ${c.rollback ? "on" : "off"}${c.overlays ? ", overlays" : ""}: ${s.steps} steps, ${(s.virtualMs / 60_000).toFixed(1)} min virtual, ${s.revisions} revisions`;
    for (const v of s.violations) out.found.push({ ...v, profile: job.profile, seed: job.seed, count: s.counts[v.invariant] ?? 1, head } satisfies Found);
  }
  return out;
}
