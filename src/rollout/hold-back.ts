// What holds work back on a node before it asks its pool for a slot, one reason at a time (kured's
// blockers): the node is paused, outside the canary selector, or — for work that disrupts — outside every
// maintenance window. The same question for every path that can disrupt a node. Pure.
import { pausedLabel, type RolloutSettings } from "../api/rollout.ts";
import { matches } from "../api/selector.ts";
import { nextOpening, openWindow } from "../api/windows.ts";
import type { HoldBack } from "./machine.ts";

/** A window is a wall-clock fact: the wait until it opens is looked at again at least this often. */
const windowRecheckMs = 15 * 60_000;

export function holdBack(o: { what: string; labels: Readonly<Record<string, string>>; settings: RolloutSettings; disrupts: string[]; now: Date }): HoldBack | undefined {
  if (o.labels[pausedLabel] === "true") return { reason: "Paused", message: `${o.what} waits: this node is paused (label ${pausedLabel}=true)`, retryAfterMs: 60_000 };
  const canary = o.settings.canary;
  if (canary && !matches(canary, o.labels)) return { reason: "NotSelected", message: `${o.what} waits: this node does not match the canary selector "${canary.text}"`, retryAfterMs: 60_000 };
  const windows = o.settings.windows;
  if (o.disrupts.length > 0 && windows && !openWindow(windows, o.now)) {
    const next = nextOpening(windows, o.now);
    return {
      reason: "OutsideMaintenanceWindow",
      message: `${o.what} restarts ${o.disrupts.join(", ")} and waits for a maintenance window${next ? ` (next: ${next.toISOString()})` : ""}`,
      retryAfterMs: Math.max(1000, Math.min((next?.getTime() ?? Number.POSITIVE_INFINITY) - o.now.getTime(), windowRecheckMs)),
    };
  }
  return undefined;
}
