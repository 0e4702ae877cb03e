// Draws bench:fleet's scale results as an SVG: two log-log panels, requests/s and bytes/s at the API server
// against the pool's size, one line per agent and budget, with the pool's heartbeats (2·N per 10 s) and a
// tenth of them for scale. Pure: data in, text out (the house style of rollout-svg.ts).
import type { HeartbeatResult, PhaseResult } from "./fleet-scale.ts";

const esc = (s: string) => s.replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");

type Line = { name: string; colour: string; dashed?: boolean; points: { pool: number; value: number }[] };

const si = (v: number) => (v >= 1e6 ? `${(v / 1e6).toPrecision(3)} M` : v >= 1e3 ? `${(v / 1e3).toPrecision(3)} k` : v >= 1 ? v.toPrecision(3) : v.toPrecision(2));

function panel(lines: Line[], title: string, unit: string, left: number, top: number, w: number, h: number): string[] {
  const pools = [...new Set(lines.flatMap((l) => l.points.map((p) => p.pool)))].sort((a, b) => a - b);
  const values = lines.flatMap((l) => l.points.map((p) => p.value)).filter((v) => v > 0);
  const lo = 10 ** Math.floor(Math.log10(Math.min(...values)));
  const hi = 10 ** Math.ceil(Math.log10(Math.max(...values)));
  const x0 = Math.log10(Math.min(...pools) / 1.3);
  const x1 = Math.log10(Math.max(...pools) * 1.3);
  const x = (pool: number) => left + ((Math.log10(pool) - x0) / (x1 - x0)) * w;
  const y = (v: number) => top + h - ((Math.log10(Math.max(v, lo)) - Math.log10(lo)) / (Math.log10(hi) - Math.log10(lo))) * h;
  const out = [`<text x="${left}" y="${top - 10}" font-weight="bold">${esc(title)}</text>`, `<rect x="${left}" y="${top}" width="${w}" height="${h}" fill="none" stroke="#000"/>`];
  for (let d = lo; d <= hi; d *= 10) out.push(`<line x1="${left}" y1="${y(d)}" x2="${left + w}" y2="${y(d)}" stroke="#ddd"/><text x="${left - 4}" y="${y(d) + 4}" text-anchor="end">${si(d)}${unit}</text>`);
  for (const p of pools) out.push(`<line x1="${x(p)}" y1="${top}" x2="${x(p)}" y2="${top + h}" stroke="#eee"/><text x="${x(p)}" y="${top + h + 14}" text-anchor="middle">${p}</text>`);
  out.push(`<text x="${left + w / 2}" y="${top + h + 30}" text-anchor="middle">nodes in the pool</text>`);
  for (const l of lines) {
    const pts = l.points.filter((p) => p.value > 0);
    if (pts.length === 0) continue;
    out.push(`<polyline points="${pts.map((p) => `${x(p.pool)},${y(p.value)}`).join(" ")}" fill="none" stroke="${l.colour}" stroke-width="2"${l.dashed ? ' stroke-dasharray="5,4"' : ""}/>`);
    for (const p of pts) out.push(`<circle cx="${x(p.pool)}" cy="${y(p.value)}" r="3" fill="${l.colour}"/><text x="${x(p.pool) + 5}" y="${y(p.value) - 5}" fill="${l.colour}" font-size="10">${si(p.value)}</text>`);
  }
  return out;
}

export function scaleSvg(phases: PhaseResult[], heartbeats: HeartbeatResult[], title: string): string {
  const series = (name: string, colour: string, pick: (p: PhaseResult) => boolean, value: (p: PhaseResult) => number): Line => ({ name, colour, points: phases.filter(pick).map((p) => ({ pool: p.pool, value: value(p) })) });
  const isTrellis = (budget: string) => (p: PhaseResult) => p.agent === "trellis" && p.budget === budget;
  const gna = (p: PhaseResult) => p.agent === "gardener-node-agent";
  const hbLine = (name: string, colour: string, f: number, value: (h: HeartbeatResult) => number, dashed = false): Line => ({ name, colour, dashed, points: heartbeats.map((h) => ({ pool: h.pool, value: f * value(h) })) });
  const requests = [
    hbLine("heartbeats (2·N per 10 s)", "#777", 1, (h) => h.requestsPerS),
    hbLine("10 % of the heartbeats", "#777", 0.1, (h) => h.requestsPerS, true),
    series("gardener-node-agent serial", "#d23c3c", gna, (p) => p.realSpeed.requestsPerS),
    series("trellis k = 1", "#1f5fbf", isTrellis("1"), (p) => p.realSpeed.requestsPerS),
    series("trellis k = 10 %", "#2e9d4f", isTrellis("10%"), (p) => p.realSpeed.requestsPerS),
  ];
  const bytes = [
    hbLine("heartbeats (2·N per 10 s)", "#777", 1, (h) => h.bytesPerS),
    hbLine("10 % of the heartbeats", "#777", 0.1, (h) => h.bytesPerS, true),
    series("gardener-node-agent serial", "#d23c3c", gna, (p) => p.realSpeed.bytesPerS),
    series("trellis k = 1", "#1f5fbf", isTrellis("1"), (p) => p.realSpeed.bytesPerS),
    series("trellis k = 10 %", "#2e9d4f", isTrellis("10%"), (p) => p.realSpeed.bytesPerS),
  ];
  const width = 1100;
  const out = [
    `<svg xmlns="http://www.w3.org/2000/svg" width="${width}" height="470" font-family="sans-serif" font-size="11">`,
    `<text x="70" y="18" font-size="13" font-weight="bold">${esc(title)}</text>`,
    ...panel(requests, "requests/s (responses and watch opens)", "", 70, 60, 430, 320),
    ...panel(bytes, "bytes/s (responses and watch events)", "B", 620, 60, 430, 320),
  ];
  requests.forEach((l, i) => {
    const lx = 70 + (i % 3) * 330;
    const ly = 440 + Math.floor(i / 3) * 16;
    out.push(`<line x1="${lx}" y1="${ly - 4}" x2="${lx + 24}" y2="${ly - 4}" stroke="${l.colour}" stroke-width="2"${l.dashed ? ' stroke-dasharray="5,4"' : ""}/><text x="${lx + 30}" y="${ly}">${esc(l.name)}</text>`);
  });
  out.push("</svg>");
  return `${out.join("\n")}\n`;
}
