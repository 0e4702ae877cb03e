// When this node first saw the OSC it is holding back for the reconciliation delay, kept across agent
// restarts so that a restart does not start the wait over (its own file, written only by the OSC
// controller). A reading of src/host/boot-clock.ts: the time since boot measures the wait within a boot,
// the wall clock across a reboot.
import * as v from "valibot";
import { baseDir } from "./paths.ts";
import { object } from "./shapes.ts";

export const delayStartPath = `${baseDir}/trellis/delay-start.json`;

export const DelayStartSchema = object({
  version: v.literal(1),
  checksum: v.string(),
  bootId: v.string(),
  uptimeMs: v.number(),
  wallMs: v.number(),
});
export type DelayStart = v.InferOutput<typeof DelayStartSchema>;
