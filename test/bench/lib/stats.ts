// Summaries of benchmark samples: median, nearest-rank percentiles, spread.
export const round = (x: number, digits = 1) => Number(x.toFixed(digits));

const sorted = (xs: number[]) => [...xs].sort((a, b) => a - b);

export function median(xs: number[]): number {
  const s = sorted(xs);
  const m = s.length >> 1;
  return s.length % 2 ? (s[m] as number) : ((s[m - 1] as number) + (s[m] as number)) / 2;
}

/** Nearest-rank percentile: with 30 samples p99 is the largest one. */
export function percentile(xs: number[], p: number): number {
  const s = sorted(xs);
  return s[Math.min(s.length - 1, Math.ceil((p / 100) * s.length) - 1)] as number;
}

export type Summary = { n: number; median: number; p99: number; min: number; max: number };

export function summary(xs: number[], digits = 1): Summary {
  return {
    n: xs.length,
    median: round(median(xs), digits),
    p99: round(percentile(xs, 99), digits),
    min: round(Math.min(...xs), digits),
    max: round(Math.max(...xs), digits),
  };
}
