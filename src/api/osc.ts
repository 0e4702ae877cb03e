// OperatingSystemConfig (extensions.gardener.cloud/v1alpha1) as gardener-node-agent reads it from the
// OSC Secret's `osc.yaml`. Every field of Gardener v1.150's type is listed: those the agent acts on are
// typed, those that concern the control plane and not the node are accepted as they are
// (docs/gardener-fields.md says which and why). A key that is no field of Gardener's is dropped, as
// Gardener's non-strict decoder drops it, and reported (desired.ts, with unknownKeys): a newer Gardener's
// field must not block a pool, nor be passed over unsaid. The schema checks shapes; desired.ts checks meaning.
import * as v from "valibot";
import { object } from "./shapes.ts";
import { CriConfigSchema } from "./cri-config.ts";

/** A field for the control plane (extension controllers, gardenlet), not for the node: accepted, not read. */
const controlPlaneOnly = v.optional(v.unknown());

const unitCommand = v.picklist(["start", "restart", "stop"]);

export const DropInSchema = object({ name: v.string(), content: v.string() });

export const UnitSchema = object({
  name: v.string(),
  command: v.optional(v.nullable(unitCommand)),
  enable: v.optional(v.nullable(v.boolean())),
  content: v.optional(v.nullable(v.string())),
  dropIns: v.optional(v.nullable(v.array(DropInSchema))),
  filePaths: v.optional(v.nullable(v.array(v.string()))),
});

export const FileContentSchema = object({
  inline: v.optional(v.nullable(object({ encoding: v.optional(v.string(), ""), data: v.string() }))),
  secretRef: v.optional(v.nullable(object({ name: v.string(), dataKey: v.string() }))),
  imageRef: v.optional(v.nullable(object({ image: v.string(), filePathInImage: v.string() }))),
  transmitUnencoded: v.optional(v.nullable(v.boolean())),
});

export const FileSchema = object({
  path: v.string(),
  permissions: v.optional(v.nullable(v.pipe(v.number(), v.integer(), v.minValue(0), v.maxValue(0o7777)))),
  content: FileContentSchema,
  hostName: v.optional(v.nullable(v.string())),
});

// Gardener's in-place node updates (gardenlet sets them for a pool with an in-place update strategy).
// Times stay text: only whether they changed matters, as gardener-node-agent compares them.
const rotationSchema = v.optional(v.nullable(object({ lastInitiationTime: v.optional(v.nullable(v.string())) })));
export const InPlaceUpdatesSchema = object({
  operatingSystemVersion: v.optional(v.string(), ""),
  kubelet: v.optional(v.string(), ""),
  credentialsRotation: v.optional(v.nullable(object({ certificateAuthorities: rotationSchema, serviceAccountKey: rotationSchema }))),
});

export const OperatingSystemConfigSchema = object({
  apiVersion: v.literal("extensions.gardener.cloud/v1alpha1"),
  kind: v.literal("OperatingSystemConfig"),
  metadata: controlPlaneOnly,
  spec: object({
    type: controlPlaneOnly,
    class: controlPlaneOnly,
    providerConfig: controlPlaneOnly,
    purpose: v.optional(v.nullable(v.string())),
    units: v.optional(v.nullable(v.array(UnitSchema))),
    files: v.optional(v.nullable(v.array(FileSchema))),
    criConfig: v.optional(v.nullable(CriConfigSchema)),
    inPlaceUpdates: v.optional(v.nullable(InPlaceUpdatesSchema)),
  }),
  status: v.optional(
    v.nullable(
      object({
        providerStatus: controlPlaneOnly,
        conditions: controlPlaneOnly,
        lastError: controlPlaneOnly,
        lastOperation: controlPlaneOnly,
        observedGeneration: controlPlaneOnly,
        state: controlPlaneOnly,
        resources: controlPlaneOnly,
        cloudConfig: controlPlaneOnly,
        extensionUnits: v.optional(v.nullable(v.array(UnitSchema))),
        extensionFiles: v.optional(v.nullable(v.array(FileSchema))),
        inPlaceUpdates: v.optional(
          v.nullable(object({ osUpdate: v.optional(v.nullable(object({ command: v.string(), args: v.optional(v.nullable(v.array(v.string()))) }))) })),
        ),
      }),
    ),
  ),
});

export type OperatingSystemConfig = v.InferOutput<typeof OperatingSystemConfigSchema>;
export type OscUnit = v.InferOutput<typeof UnitSchema>;
export type OscFile = v.InferOutput<typeof FileSchema>;
export type InPlaceUpdates = v.InferOutput<typeof InPlaceUpdatesSchema>;
