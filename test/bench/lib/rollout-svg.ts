// Draws a fleet rollout as an SVG: one lane per node with a bar from the moment it took a disruption slot
// to the moment it gave it back (green: its change passed the gate; red: it failed; dark: never given
// back), a tick where its unit restarted, and below, the number of nodes disrupted at every instant
// against the budget k. Scenarios are separated by vertical lines with their names. Pure: data in, text out.

export type Hold = { node: string; from: number; to: number; outcome: "passed" | "failed" | "held" };
export type Phase = { name: string; from: number; to: number; k: number };
export type RolloutPicture = { nodes: string[]; holds: Hold[]; restarts: { node: string; at: number }[]; disrupted: { at: number; n: number }[]; phases: Phase[] };

const esc = (s: string) => s.replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");

export function rolloutSvg(p: RolloutPicture, title: string): string {
  const lane = 6;
  const left = 70;
  const width = 1100;
  const top = 40;
  const chart = 120;
  const t0 = Math.min(...p.phases.map((x) => x.from));
  const t1 = Math.max(...p.phases.map((x) => x.to));
  const x = (t: number) => left + ((Math.min(Math.max(t, t0), t1) - t0) / Math.max(1, t1 - t0)) * (width - left - 10);
  const laneOf = new Map(p.nodes.map((n, i) => [n, i]));
  const lanesBottom = top + p.nodes.length * lane;
  const chartTop = lanesBottom + 30;
  const maxK = Math.max(1, ...p.phases.map((ph) => ph.k), ...p.disrupted.map((d) => d.n));
  const y = (n: number) => chartTop + chart - (n / maxK) * chart;
  const colour = { passed: "#2e9d4f", failed: "#d23c3c", held: "#555" } as const;
  const out: string[] = [
    `<svg xmlns="http://www.w3.org/2000/svg" width="${width}" height="${chartTop + chart + 40}" font-family="sans-serif" font-size="11">`,
    `<text x="${left}" y="16" font-size="13" font-weight="bold">${esc(title)}</text>`,
    `<text x="4" y="${top + 8}">nodes (${p.nodes.length})</text>`,
  ];
  for (const ph of p.phases) {
    out.push(`<line x1="${x(ph.from)}" y1="${top - 12}" x2="${x(ph.from)}" y2="${chartTop + chart}" stroke="#aaa" stroke-dasharray="3,3"/>`);
    out.push(`<text x="${x(ph.from) + 3}" y="${top - 4}">${esc(ph.name)}</text>`);
  }
  for (const h of p.holds) {
    const i = laneOf.get(h.node);
    if (i === undefined) continue;
    out.push(`<rect x="${x(h.from)}" y="${top + i * lane}" width="${Math.max(1, x(h.to) - x(h.from))}" height="${lane - 1}" fill="${colour[h.outcome]}"/>`);
  }
  for (const r of p.restarts) {
    const i = laneOf.get(r.node);
    if (i !== undefined) out.push(`<rect x="${x(r.at)}" y="${top + i * lane}" width="1.5" height="${lane - 1}" fill="#000"/>`);
  }
  // The disrupted count as steps, and k for each phase.
  out.push(`<text x="4" y="${chartTop + 10}">disrupted</text>`, `<line x1="${left}" y1="${y(0)}" x2="${width - 10}" y2="${y(0)}" stroke="#000"/>`);
  for (const ph of p.phases) out.push(`<line x1="${x(ph.from)}" y1="${y(ph.k)}" x2="${x(ph.to)}" y2="${y(ph.k)}" stroke="#d23c3c" stroke-width="1.5"/><text x="${x(ph.to) - 30}" y="${y(ph.k) - 3}" fill="#d23c3c">k=${ph.k}</text>`);
  let path = `M ${x(t0)} ${y(0)}`;
  let last = 0;
  for (const d of [...p.disrupted].sort((a, b) => a.at - b.at)) {
    path += ` L ${x(d.at)} ${y(last)} L ${x(d.at)} ${y(d.n)}`;
    last = d.n;
  }
  path += ` L ${x(t1)} ${y(last)}`;
  out.push(`<path d="${path}" fill="none" stroke="#1f5fbf" stroke-width="1.5"/>`);
  out.push(`<text x="${left}" y="${chartTop + chart + 16}">0 s</text><text x="${width - 60}" y="${chartTop + chart + 16}">${Math.round((t1 - t0) / 1000)} s</text>`);
  out.push(
    `<text x="${left + 120}" y="${chartTop + chart + 30}">bars: slot held (green: passed its gate, red: failed, grey: never given back); black ticks: unit restarted; blue: nodes disrupted; red line: k</text>`,
    "</svg>",
  );
  return `${out.join("\n")}\n`;
}

/** How many intervals overlap at each of their edges: the disrupted count over time, and its maximum. */
export function overlap(intervals: { from: number; to: number }[]): { series: { at: number; n: number }[]; max: number } {
  const edges = intervals.flatMap((i) => [
    { at: i.from, d: 1 },
    { at: i.to, d: -1 },
  ]);
  // At the same instant an end comes before a start: a slot handed over is not two disrupted nodes.
  edges.sort((a, b) => a.at - b.at || a.d - b.d);
  let n = 0;
  let max = 0;
  const series: { at: number; n: number }[] = [];
  for (const e of edges) {
    n += e.d;
    max = Math.max(max, n);
    series.push({ at: e.at, n });
  }
  return { series, max };
}
