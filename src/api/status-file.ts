// The running agent's status as it writes it for `trellis status` (src/status.ts writes, src/cli/status.ts
// reads). On /run: it describes this boot's agent process, and a reboot must not leave an old one behind.
import * as v from "valibot";
import { looseObject, object, record } from "./shapes.ts";

export const statusPath = "/run/trellis/status.json";

/**
 * A component's report. Besides ok/summary, `trellis status` shows these details in words when present:
 * `lastError` (string), `units` (the units that are not healthy: {unit, health, why}[]) and
 * `lastRenew` (ISO 8601 or null, shown as the lease's age); the others only for a component that is
 * not ok. Details are not validated here: one odd detail must not make the whole file unreadable.
 */
export const ComponentStatusSchema = looseObject({ ok: v.boolean(), summary: v.string(), at: v.string() });

export const StatusFileSchema = object({
  version: v.literal(1),
  pid: v.number(),
  startedAt: v.string(),
  /** Rewritten at least every heartbeatSeconds while the agent runs: an older file means it stopped or hangs. */
  writtenAt: v.string(),
  heartbeatSeconds: v.number(),
  /** Set by a clean shutdown. */
  stoppedAt: v.optional(v.string()),
  components: record(v.string(), ComponentStatusSchema),
});
export type StatusFile = v.InferOutput<typeof StatusFileSchema>;
