// A plan is data: printed by `trellis plan`, persisted before an apply starts (so the schema below
// parses it back after a crash), executed step by step. It carries hashes, not content: the
// executor takes content from the desired state it was made from.
import * as v from "valibot";
import { object } from "../api/shapes.ts";

const TargetSchema = v.variant("type", [
  v.object({ type: v.literal("file") }),
  v.object({ type: v.literal("unit"), unit: v.string() }),
  v.object({ type: v.literal("drop-in"), unit: v.string(), name: v.string() }),
]);

const unitStep = <K extends string>(kind: K) => v.object({ kind: v.literal(kind), unit: v.string(), reason: v.string() });

export const StepSchema = v.variant("kind", [
  v.object({ kind: v.literal("write"), target: TargetSchema, path: v.string(), mode: v.number(), sha256: v.string(), reason: v.string() }),
  v.object({ kind: v.literal("remove"), target: TargetSchema, path: v.string(), reason: v.string() }),
  v.object({ kind: v.literal("daemon-reload"), reason: v.string() }),
  unitStep("enable"),
  unitStep("disable"),
  unitStep("stop"),
  unitStep("restart"),
]);

export const PlanSchema = object({ checksum: v.string(), steps: v.array(StepSchema) });

export type Target = v.InferOutput<typeof TargetSchema>;
export type Step = v.InferOutput<typeof StepSchema>;
export type Plan = v.InferOutput<typeof PlanSchema>;

/** What is on the node now, as far as the plan needs to know. */
export type Observed = {
  /** Every path the plan may touch: sha256 and mode, or null when missing. */
  files: ReadonlyMap<string, { sha256: string; mode: number } | null>;
  /** Paths reached through a symlink: the path each lands on (Files.landsAt), where it differs. */
  landsAt?: ReadonlyMap<string, string>;
  /** systemd's view of the units involved; undefined when systemd is not consulted (`plan --root`). */
  units?: ReadonlyMap<string, { unitFileState: string; activeState: string }>;
};
