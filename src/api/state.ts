// What trellis keeps on the node between runs (parsed at the edge like everything read from outside).
// `Owned` is the inventory of what trellis itself wrote — files, unit files, drop-ins — with the
// hash it wrote. It is updated step by step as an apply progresses, so a unit or file written by an
// apply that later failed is still known to be trellis's and can be removed (gardener#10972).
import * as v from "valibot";
import { object, record } from "./shapes.ts";
import { PlanSchema } from "./plan.ts";

export const OwnedSchema = object({
  version: v.literal(1),
  files: record(v.string(), object({ sha256: v.string(), mode: v.number() })),
  units: record(
    v.string(),
    object({
      /** Hash of the unit file trellis wrote; absent for a host unit trellis only adds drop-ins to or (en|dis)ables. */
      sha256: v.optional(v.string()),
      enable: v.optional(v.boolean()),
      /** The OSC's command when last applied: "stop" → "start" must start the unit again. */
      command: v.optional(v.picklist(["start", "restart", "stop"])),
      /** unitSpecDigest of the unit when last applied: any difference makes it a changed unit, as in gardener-node-agent. */
      spec: v.optional(v.string()),
      dropIns: record(v.string(), v.string()),
    }),
  ),
});
export type Owned = v.InferOutput<typeof OwnedSchema>;
export type OwnedUnit = Owned["units"][string];

export const emptyOwned = (): Owned => ({ version: 1, files: {}, units: {} });

// An apply in progress: the plan, persisted before its first step, and which steps are done.
// Written at checkpoints; steps after the last checkpoint run again on resume (they are idempotent).
export const ProgressSchema = object({
  checksum: v.string(),
  plan: PlanSchema,
  done: v.array(v.number()),
});
export type Progress = v.InferOutput<typeof ProgressSchema>;

// One file, so ownership and progress always change together in one atomic rename.
export const AgentStateSchema = object({
  version: v.literal(1),
  owned: OwnedSchema,
  progress: v.optional(ProgressSchema),
  lastApplied: v.optional(
    object({
      checksum: v.string(),
      at: v.string(),
      /** What the apply that brought this checksum did (absent in states written before it was kept). */
      steps: v.optional(v.number()),
      restarted: v.optional(v.array(v.string())),
    }),
  ),
});
export type AgentState = v.InferOutput<typeof AgentStateSchema>;
export const emptyState = (): AgentState => ({ version: 1, owned: emptyOwned() });
