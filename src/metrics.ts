// A small Prometheus registry: counters, gauges and histograms with labels, rendered in the text
// exposition format (version 0.0.4). Written by hand because it is ~100 lines and a client library
// would be the largest dependency of the binary.
export type Labels = Record<string, string>;

type Series = { labels: Labels; value: number };
type HistogramSeries = { labels: Labels; buckets: number[]; sum: number; count: number };

export interface Counter {
  inc(labels?: Labels, by?: number): void;
}
export interface Gauge {
  set(value: number, labels?: Labels): void;
}
export interface Histogram {
  observe(value: number, labels?: Labels): void;
}

export interface Registry {
  counter(name: string, help: string): Counter;
  gauge(name: string, help: string): Gauge;
  histogram(name: string, help: string, buckets: number[]): Histogram;
  /** Series read when scraped (process memory, a watch's counters); a number is one unlabelled sample. */
  collect(name: string, help: string, read: () => number | { labels: Labels; value: number }[], type?: "gauge" | "counter"): void;
  render(): string;
}

export function createRegistry(): Registry {
  const metrics: { name: string; help: string; type: string; render: () => string[] }[] = [];
  const add = (name: string, help: string, type: string, render: () => string[]) => {
    if (metrics.some((m) => m.name === name)) throw new Error(`metric ${name} registered twice`);
    metrics.push({ name, help, type, render });
  };
  const scalar = (name: string, help: string, type: "counter" | "gauge") => {
    const series = new Map<string, Series>();
    const get = (labels: Labels) => {
      const key = labelText(labels);
      let s = series.get(key);
      if (!s) series.set(key, (s = { labels, value: 0 }));
      return s;
    };
    add(name, help, type, () => [...series.values()].map((s) => `${name}${labelText(s.labels)} ${formatValue(s.value)}`));
    return get;
  };
  return {
    counter(name, help) {
      const get = scalar(name, help, "counter");
      return { inc: (labels = {}, by = 1) => void (get(labels).value += by) };
    },
    gauge(name, help) {
      const get = scalar(name, help, "gauge");
      return { set: (value, labels = {}) => void (get(labels).value = value) };
    },
    histogram(name, help, buckets) {
      const bounds = [...buckets].sort((a, b) => a - b);
      const series = new Map<string, HistogramSeries>();
      add(name, help, "histogram", () =>
        [...series.values()].flatMap((s) => [
          ...bounds.map((le, i) => `${name}_bucket${labelText({ ...s.labels, le: String(le) })} ${s.buckets[i]}`),
          `${name}_bucket${labelText({ ...s.labels, le: "+Inf" })} ${s.count}`,
          `${name}_sum${labelText(s.labels)} ${formatValue(s.sum)}`,
          `${name}_count${labelText(s.labels)} ${s.count}`,
        ]),
      );
      return {
        observe(value, labels = {}) {
          const key = labelText(labels);
          let s = series.get(key);
          if (!s) series.set(key, (s = { labels, buckets: bounds.map(() => 0), sum: 0, count: 0 }));
          const h = s;
          h.buckets = h.buckets.map((n, i) => (value <= (bounds[i] as number) ? n + 1 : n));
          h.sum += value;
          h.count++;
        },
      };
    },
    collect(name, help, read, type = "gauge") {
      add(name, help, type, () => {
        const v = read();
        return typeof v === "number" ? [`${name} ${formatValue(v)}`] : v.map((s) => `${name}${labelText(s.labels)} ${formatValue(s.value)}`);
      });
    },
    render() {
      return `${metrics.flatMap((m) => [`# HELP ${m.name} ${m.help}`, `# TYPE ${m.name} ${m.type}`, ...m.render()]).join("\n")}\n`;
    },
  };
}

function labelText(labels: Labels): string {
  const keys = Object.keys(labels).sort();
  if (keys.length === 0) return "";
  const esc = (v: string) => v.replace(/\\/g, "\\\\").replace(/\n/g, "\\n").replace(/"/g, '\\"');
  return `{${keys.map((k) => `${k}="${esc(labels[k] as string)}"`).join(",")}}`;
}

function formatValue(v: number): string {
  return Number.isFinite(v) ? String(v) : v > 0 ? "+Inf" : v < 0 ? "-Inf" : "NaN";
}
