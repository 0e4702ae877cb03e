// Resident memory of agents idling side by side: each agent's process sampled every 10 s from /proc
// (spawns nothing), all in the same loop, so that every agent is measured over the same minutes.
import type { Node } from "../../harness/node.ts";
import { memoryKiB } from "./proc.ts";
import { type Summary, summary } from "./stats.ts";

export type IdleMemory = { rssMiB: Summary; rssAnonMiB: Summary; rssFileShmemMiB: Summary };

const SAMPLE_MS = 10_000;

/** Samples each process's VmRSS, RssAnon and RssFile + RssShmem every 10 s for `minutes`; one result per target, in order. */
export async function sampleIdleMemory(targets: { node: Node; pid: number }[], minutes: number): Promise<IdleMemory[]> {
  const samples = targets.map(() => ({ rss: [] as number[], anon: [] as number[], file: [] as number[] }));
  for (let i = 0; i < Math.max(1, Math.round((minutes * 60_000) / SAMPLE_MS)); i++) {
    await Bun.sleep(SAMPLE_MS);
    for (const [k, t] of targets.entries()) {
      const m = await memoryKiB(t.node, t.pid);
      const s = samples[k] as (typeof samples)[number];
      s.rss.push(m.vmRssKiB / 1024);
      s.anon.push(m.rssAnonKiB / 1024);
      s.file.push(m.rssFileShmemKiB / 1024);
    }
  }
  return samples.map((s) => ({ rssMiB: summary(s.rss), rssAnonMiB: summary(s.anon), rssFileShmemMiB: summary(s.file) }));
}
