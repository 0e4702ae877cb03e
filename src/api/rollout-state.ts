// What a node remembers of a rollout across restarts (its own file, written only by the rollout
// coordinator; apply writes state.json): the disruption slot it holds, the change it is gating, and the
// last OSC that passed its gate here (the rollback target, its bytes kept beside this file).
import * as v from "valibot";
import { baseDir } from "./paths.ts";
import { object } from "./shapes.ts";

export const rolloutStatePath = `${baseDir}/trellis/rollout.json`;
export const lastGoodOscPath = `${baseDir}/trellis/last-good-osc.yaml`;

/**
 * - gating: `checksum` was applied disruptively and its health gate runs;
 * - failed: its gate failed (no rollback, or no last good OSC): the slot stays taken, the rollout stops;
 * - rolled-back: its gate failed and the last good OSC was applied again; that one's gate runs;
 * - blocked: the rolled-back state passed its gate: the slot is free again, and `checksum` is not
 *   applied on this node again until the Secret changes.
 */
export const GateSchema = object({
  phase: v.picklist(["gating", "failed", "rolled-back", "blocked"]),
  checksum: v.string(),
  /** The units the change restarted or stopped that count as disruptive. */
  units: v.array(v.string()),
  /** When the apply finished (ISO 8601, for people: the gate itself times with a monotonic clock). */
  appliedAt: v.string(),
  failedCheck: v.optional(v.string()),
});

export const RolloutStateSchema = object({
  version: v.literal(1),
  /** The slot Lease this node holds, and for which reasons (an OSC change, a requested restart). */
  slot: v.optional(object({ name: v.string(), reasons: v.array(v.string()) })),
  gate: v.optional(GateSchema),
  /** checksum: of what was applied (overlays included); base: of its osc.yaml, what the Node annotation names. */
  lastGood: v.optional(object({ checksum: v.string(), base: v.optional(v.string()), at: v.string() })),
});

export type Gate = v.InferOutput<typeof GateSchema>;
export type RolloutState = v.InferOutput<typeof RolloutStateSchema>;
export const emptyRolloutState = (): RolloutState => ({ version: 1 });
