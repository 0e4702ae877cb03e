// In-memory stand-ins for what a controller reports into, for tests that run controllers in-process.
import type { ComponentStatus, StatusBoard } from "../../src/controllers/types.ts";
import type { Registry } from "../../src/metrics.ts";

/** A StatusBoard that only keeps the entries, plus `of(component)` to read one. */
export function memoryStatusBoard(): StatusBoard & { of(component: string): ComponentStatus | undefined } {
  const entries: Record<string, ComponentStatus> = {};
  return {
    set: (component, status) => void (entries[component] = { ...status, at: new Date().toISOString() } as ComponentStatus),
    snapshot: () => ({ ...entries }),
    of: (component) => entries[component],
  };
}

/** A sample's value in the registry's exposition text, e.g. `trellis_token_writes_total{secret="a"}`; undefined when absent. */
export function metricSample(metrics: Registry, series: string): number | undefined {
  const line = metrics.render().split("\n").find((l) => l.startsWith(`${series} `));
  return line === undefined ? undefined : Number(line.slice(series.length + 1));
}
