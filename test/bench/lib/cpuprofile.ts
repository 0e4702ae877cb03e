// Reading a .cpuprofile (the Chrome DevTools format Bun's --cpu-prof writes): where the samples of a
// time window went, by function, self and inclusive.
export type CpuProfile = {
  nodes: { id: number; callFrame: { functionName: string; url: string; lineNumber: number }; children?: number[] }[];
  startTime: number; // µs
  endTime: number;
  samples: number[];
  timeDeltas: number[];
};

export type FunctionTime = { fn: string; ms: number; percent: number };
export type WindowProfile = { sampledMs: number; idleMs: number; busyMs: number; self: FunctionTime[]; inclusive: FunctionTime[] };

const idleNames = new Set(["(idle)", "(root)"]);

/**
 * Samples between `fromMs` and `toMs` after the profile's start, the idle ones apart; the `top` functions
 * by self and by inclusive busy time. Bun's profiler takes no samples while the thread waits, so a
 * sample stands for the time to the next one but at most one sampling interval (`intervalMs`).
 */
export function profileWindow(p: CpuProfile, fromMs: number, toMs: number, intervalMs: number, top = 12): WindowProfile {
  const byId = new Map(p.nodes.map((n) => [n.id, n]));
  const parent = new Map<number, number>();
  for (const n of p.nodes) for (const c of n.children ?? []) parent.set(c, n.id);
  const label = (id: number) => {
    const f = (byId.get(id) as CpuProfile["nodes"][number]).callFrame;
    const where = f.url ? `${f.url.replace(/^\/\$bunfs\/root\//, "")}${f.lineNumber >= 0 ? `:${f.lineNumber + 1}` : ""}` : "";
    return `${f.functionName || "(anonymous)"}${where ? ` ${where}` : ""}`;
  };
  const self = new Map<string, number>();
  const inclusive = new Map<string, number>();
  let sampled = 0;
  let idle = 0;
  let t = 0;
  for (let i = 0; i < p.samples.length; i++) {
    t += (p.timeDeltas[i] ?? 0) / 1000;
    const dt = Math.min((p.timeDeltas[i + 1] ?? 0) / 1000, intervalMs);
    if (t < fromMs || t >= toMs) continue;
    sampled += dt;
    const id = p.samples[i] as number;
    const name = (byId.get(id) as CpuProfile["nodes"][number]).callFrame.functionName;
    if (idleNames.has(name)) {
      idle += dt;
      continue;
    }
    self.set(label(id), (self.get(label(id)) ?? 0) + dt);
    const seen = new Set<string>();
    for (let n: number | undefined = id; n !== undefined; n = parent.get(n)) {
      const l = label(n);
      if (seen.has(l) || idleNames.has((byId.get(n) as CpuProfile["nodes"][number]).callFrame.functionName)) continue;
      seen.add(l);
      inclusive.set(l, (inclusive.get(l) ?? 0) + dt);
    }
  }
  const busy = sampled - idle;
  const rank = (m: Map<string, number>) =>
    [...m]
      .sort((a, b) => b[1] - a[1])
      .slice(0, top)
      .map(([fn, ms]) => ({ fn, ms: Math.round(ms * 10) / 10, percent: busy > 0 ? Math.round((ms / busy) * 1000) / 10 : 0 }));
  return { sampledMs: Math.round(sampled), idleMs: Math.round(idle), busyMs: Math.round(busy), self: rank(self), inclusive: rank(inclusive) };
}
