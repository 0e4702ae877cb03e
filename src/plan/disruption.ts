// Whether a plan disrupts the node: it restarts or stops a unit that counts (the Secret's
// disruptive-units patterns; kubelet and containerd always). A plan that only writes files no unit
// lists, or enables units, disrupts nothing and is never held back by a rollout budget. Pure.
import type { Plan } from "../api/plan.ts";

export const alwaysDisruptive: readonly string[] = ["kubelet.service", "containerd.service"];

const globCache = new Map<string, RegExp>();
function glob(pattern: string): RegExp {
  let re = globCache.get(pattern);
  if (!re) {
    re = new RegExp(`^${pattern.replace(/[.+^${}()|[\]\\]/g, "\\$&").replace(/\*/g, ".*").replace(/\?/g, ".")}$`);
    globCache.set(pattern, re);
  }
  return re;
}

/** Whether `unit` matches one of the patterns (`*` any run of characters, `?` one), or always counts. */
export function countsAsDisruptive(unit: string, patterns: readonly string[]): boolean {
  return alwaysDisruptive.includes(unit) || patterns.some((p) => glob(p).test(unit));
}

/** The units the plan restarts or stops that count as disruptive, in plan order, each once. */
export function disruptedUnits(plan: Plan, patterns: readonly string[]): string[] {
  const units = plan.steps.flatMap((s) => ((s.kind === "restart" || s.kind === "stop") && countsAsDisruptive(s.unit, patterns) ? [s.unit] : []));
  return [...new Set(units)];
}
