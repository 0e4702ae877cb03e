// Many schedules at once: each thread (a Bun Worker, schedule-worker.ts) runs its share of the schedules in
// a process of its own as far as the model is concerned — its own globals to swap (clock.ts
// installGlobals), its own client-node route (memory-http.ts) — so a run uses every core. Results come back
// as plain data: counts, and every violation with its seed and trace.
import type { Violation } from "./truth.ts";

export type Job = { profile: string; seed: number };

export type JobsRequest = { target: string; jobs: Job[]; steps: number; quietMs: number; traceLines: number };

export type Found = Violation & { profile: string; seed: number; count: number; head: string };

export type JobsResult = { schedules: number; steps: number; virtualMs: number; found: Found[] };

export async function runParallel(request: Omit<JobsRequest, "jobs"> & { jobs: Job[]; threads: number }): Promise<JobsResult & { seconds: number }> {
  const started = performance.now();
  const threads = Math.max(1, Math.min(request.threads, request.jobs.length));
  // Interleaved, so that every thread gets its share of each family (some families' schedules are slower).
  const shares = Array.from({ length: threads }, (_, t) => request.jobs.filter((_, i) => i % threads === t));
  const results = await Promise.all(shares.map((jobs) => inWorker({ target: request.target, jobs, steps: request.steps, quietMs: request.quietMs, traceLines: request.traceLines })));
  const total: JobsResult = { schedules: 0, steps: 0, virtualMs: 0, found: [] };
  for (const r of results) {
    total.schedules += r.schedules;
    total.steps += r.steps;
    total.virtualMs += r.virtualMs;
    total.found.push(...r.found);
  }
  total.found.sort((a, b) => (a.profile < b.profile ? -1 : a.profile > b.profile ? 1 : a.seed - b.seed));
  return { ...total, seconds: (performance.now() - started) / 1000 };
}

function inWorker(request: JobsRequest): Promise<JobsResult> {
  return new Promise((resolve, reject) => {
    const worker = new Worker(new URL("./schedule-worker.ts", import.meta.url).href);
    worker.onmessage = (e: MessageEvent<JobsResult | { error: string }>) => {
      void worker.terminate();
      if ("error" in e.data) reject(new Error(e.data.error));
      else resolve(e.data);
    };
    worker.onerror = (e) => {
      void worker.terminate();
      reject(new Error(`schedule worker: ${e.message}`));
    };
    worker.postMessage(request);
  });
}

/** One line per family and invariant: how many schedules, and the first seeds. */
export function summary(found: readonly Found[]): string[] {
  const by = new Map<string, number[]>();
  for (const f of found) by.set(`${f.profile} ${f.invariant}`, [...(by.get(`${f.profile} ${f.invariant}`) ?? []), f.seed]);
  return [...by].sort().map(([key, seeds]) => `${key}: ${seeds.length} schedule(s), seeds ${seeds.slice(0, 12).join(", ")}${seeds.length > 12 ? ", …" : ""}`);
}
