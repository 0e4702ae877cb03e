// A node's hold on the serial lease while its apply keeps failing, and when it gave the lease up for an
// OSC, kept across agent restarts (its own file, written only by the OSC controller): an agent in a crash
// loop must not start a new hold, or a new cool-off, at every start, or it blocks the pool's rollout for
// good. Times are readings of src/host/boot-clock.ts, as the reconciliation delay's start.
import * as v from "valibot";
import { baseDir } from "./paths.ts";
import { object } from "./shapes.ts";

export const serialHoldPath = `${baseDir}/trellis/serial-hold.json`;

const BootClockReadingSchema = object({ bootId: v.string(), uptimeMs: v.number(), wallMs: v.number() });

export const SerialHoldStateSchema = object({
  version: v.literal(1),
  /** The OSC whose apply keeps failing under the lease: since when, how often, the last error. */
  hold: v.optional(object({ checksum: v.string(), since: BootClockReadingSchema, failures: v.number(), lastError: v.string() })),
  /** The OSC this node gave the lease up for, and when. */
  gaveUp: v.optional(object({ checksum: v.string(), at: BootClockReadingSchema })),
});
export type SerialHoldState = v.InferOutput<typeof SerialHoldStateSchema>;
