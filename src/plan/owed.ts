// Restarts an earlier, unfinished apply still owed the node — trellis's own apply superseded by a newer OSC
// (src/apply/apply.ts), or gardener-node-agent's apply of the OSC trellis takes the node over in
// (src/apply/gardener-record.ts) — added to a plan: for units that are still desired and not to be
// stopped, unless the plan restarts or stops them already; before the agent's own restart, which stays last.
import type { Desired } from "../api/desired.ts";
import type { Plan, Step } from "../api/plan.ts";

export function withOwedRestarts(plan: Plan, owed: Step[], desired: Desired, selfUnit: string): Plan {
  const running = new Set(desired.units.filter((u) => u.enable && u.command !== "stop").map((u) => u.name));
  const planned = new Set(plan.steps.flatMap((s) => (s.kind === "restart" || s.kind === "stop" ? [s.unit] : [])));
  const extra = owed.filter((s): s is Extract<Step, { kind: "restart" }> => s.kind === "restart" && running.has(s.unit) && !planned.has(s.unit));
  if (extra.length === 0) return plan;
  const carried = extra.map((s) => ({ ...s, reason: `${s.reason} (owed by an unfinished apply)` }));
  const self = plan.steps.filter((s) => s.kind === "restart" && s.unit === selfUnit);
  const rest = plan.steps.filter((s) => !self.includes(s));
  const ordered = [...rest, ...carried.filter((s) => s.unit !== selfUnit), ...self, ...carried.filter((s) => s.unit === selfUnit)];
  return { ...plan, steps: ordered };
}
