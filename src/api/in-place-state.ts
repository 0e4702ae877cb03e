// An in-place update this node has started (src/plan/in-place.ts tells what it asks for): kept until
// it is finished, each part cleared as it is done, because the apply records the new OSC as applied
// before kubelet has proved healthy, and the next reconcile (of this OSC or a newer one) would otherwise
// see no in-place work left and report the update done.
import * as v from "valibot";
import { baseDir } from "./paths.ts";
import { object } from "./shapes.ts";

export const inPlaceStatePath = `${baseDir}/trellis/in-place.json`;

const versionChange = v.optional(object({ from: v.string(), to: v.string() }));

export const InPlaceChangesSchema = object({
  operatingSystem: versionChange,
  kubeletMinorVersion: versionChange,
  /** kubeReserved or evictionHard thresholds of kubelet's configuration changed. */
  kubeletConfig: v.boolean(),
  cpuManagerPolicy: v.boolean(),
  certificateAuthorities: v.boolean(),
  serviceAccountKey: v.boolean(),
});
export type InPlaceChanges = v.InferOutput<typeof InPlaceChangesSchema>;

export const InPlaceStateSchema = object({
  pending: v.optional(
    object({
      checksum: v.string(),
      changes: InPlaceChangesSchema,
    }),
  ),
  /**
   * The OS update command trellis started (src/plan/os-update.ts), written before it runs: kept apart
   * from `pending`, so that a new OSC while the machine has yet to restart does not forget it.
   */
  osUpdate: v.optional(
    object({
      version: v.string(),
      /** The boot of the machine it ran in (src/host/boot-clock.ts, machineBoot). */
      boot: v.string(),
      finished: v.boolean(),
      failed: v.optional(v.string()),
    }),
  ),
});
export type InPlaceState = v.InferOutput<typeof InPlaceStateSchema>;
