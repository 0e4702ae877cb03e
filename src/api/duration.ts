// Go's time.Duration text format ("1h30m", "2m30s", "500ms"), which Gardener's configs and
// annotations use. Returns milliseconds, or undefined when the text is not a duration.
const unitMs: Record<string, number> = { ns: 1e-6, us: 1e-3, "µs": 1e-3, ms: 1, s: 1000, m: 60_000, h: 3_600_000 };
const part = /(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)/y;

export function parseGoDuration(text: string): number | undefined {
  let s = text.trim();
  let sign = 1;
  if (s.startsWith("-") || s.startsWith("+")) {
    sign = s.startsWith("-") ? -1 : 1;
    s = s.slice(1);
  }
  if (s === "0") return 0;
  if (s === "") return undefined;
  let total = 0;
  part.lastIndex = 0;
  while (part.lastIndex < s.length) {
    const m = part.exec(s);
    if (!m) return undefined;
    total += Number(m[1]) * (unitMs[m[2] as string] as number);
  }
  return sign * total;
}

export function formatDuration(ms: number): string {
  if (ms % 3_600_000 === 0 && ms !== 0) return `${ms / 3_600_000}h`;
  if (ms % 60_000 === 0 && ms !== 0) return `${ms / 60_000}m`;
  if (ms % 1000 === 0) return `${ms / 1000}s`;
  return `${ms}ms`;
}

/** How long something has lasted, as Go prints a duration truncated to seconds ("45s", "1m5s", "2h0m3s"); under a second in ms. */
export function formatElapsed(ms: number): string {
  if (ms < 1000) return `${Math.max(0, Math.floor(ms))}ms`;
  const total = Math.floor(ms / 1000);
  const [h, m, s] = [Math.floor(total / 3600), Math.floor((total % 3600) / 60), total % 60];
  return h > 0 ? `${h}h${m}m${s}s` : m > 0 ? `${m}m${s}s` : `${s}s`;
}
