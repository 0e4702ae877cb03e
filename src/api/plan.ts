// A plan is data: made by src/plan, printed by `trellis plan`, persisted before an apply starts (so the
// schema below parses it back after a crash: it is read from outside), executed step by step. It carries hashes, not content: the
// executor takes content from the desired state it was made from.
import * as v from "valibot";
import { object } from "./shapes.ts";

const targets = [
  v.object({ type: v.literal("file") }),
  v.object({ type: v.literal("unit"), unit: v.string() }),
  v.object({ type: v.literal("drop-in"), unit: v.string(), name: v.string() }),
] as const;
const TargetSchema = v.variant("type", [...targets]);
/** What a removal may also take: a unit's whole drop-in directory, whoever wrote what is in it. */
const RemoveTargetSchema = v.variant("type", [...targets, v.object({ type: v.literal("drop-ins"), unit: v.string() })]);

const unitStep = <K extends string>(kind: K) => v.object({ kind: v.literal(kind), unit: v.string(), reason: v.string() });

export const StepSchema = v.variant("kind", [
  v.object({ kind: v.literal("write"), target: TargetSchema, path: v.string(), mode: v.number(), sha256: v.string(), reason: v.string() }),
  v.object({ kind: v.literal("remove"), target: RemoveTargetSchema, path: v.string(), reason: v.string() }),
  v.object({ kind: v.literal("daemon-reload"), reason: v.string() }),
  unitStep("enable"),
  unitStep("disable"),
  unitStep("stop"),
  unitStep("restart"),
]);

export const PlanSchema = object({ checksum: v.string(), steps: v.array(StepSchema) });

export type Target = v.InferOutput<typeof RemoveTargetSchema>;
export type Step = v.InferOutput<typeof StepSchema>;
export type Plan = v.InferOutput<typeof PlanSchema>;
