// OperatingSystemConfig (extensions.gardener.cloud/v1alpha1) as gardener-node-agent reads it from the
// OSC Secret's `osc.yaml`. Only the fields the agent uses are typed; unknown fields pass through so a
// newer Gardener does not break the agent. The schema checks shapes; desired.ts checks meaning.
import * as v from "valibot";
import { looseObject, object } from "./shapes.ts";
import { CriConfigSchema } from "./cri-config.ts";

const unitCommand = v.picklist(["start", "restart", "stop"]);

export const DropInSchema = object({ name: v.string(), content: v.string() });

export const UnitSchema = looseObject({
  name: v.string(),
  command: v.optional(v.nullable(unitCommand)),
  enable: v.optional(v.nullable(v.boolean())),
  content: v.optional(v.nullable(v.string())),
  dropIns: v.optional(v.nullable(v.array(DropInSchema))),
  filePaths: v.optional(v.nullable(v.array(v.string()))),
});

export const FileContentSchema = looseObject({
  inline: v.optional(v.nullable(object({ encoding: v.optional(v.string(), ""), data: v.string() }))),
  secretRef: v.optional(v.nullable(object({ name: v.string(), dataKey: v.string() }))),
  imageRef: v.optional(v.nullable(object({ image: v.string(), filePathInImage: v.string() }))),
  transmitUnencoded: v.optional(v.nullable(v.boolean())),
});

export const FileSchema = looseObject({
  path: v.string(),
  permissions: v.optional(v.nullable(v.pipe(v.number(), v.integer(), v.minValue(0), v.maxValue(0o7777)))),
  content: FileContentSchema,
  hostName: v.optional(v.nullable(v.string())),
});

// Gardener's in-place node updates (gardenlet sets them for a pool with an in-place update strategy).
// Times stay text: only whether they changed matters, as gardener-node-agent compares them.
const rotationSchema = v.optional(v.nullable(looseObject({ lastInitiationTime: v.optional(v.nullable(v.string())) })));
export const InPlaceUpdatesSchema = looseObject({
  operatingSystemVersion: v.optional(v.string(), ""),
  kubelet: v.optional(v.string(), ""),
  credentialsRotation: v.optional(v.nullable(looseObject({ certificateAuthorities: rotationSchema, serviceAccountKey: rotationSchema }))),
});

export const OperatingSystemConfigSchema = looseObject({
  apiVersion: v.literal("extensions.gardener.cloud/v1alpha1"),
  kind: v.literal("OperatingSystemConfig"),
  spec: looseObject({
    purpose: v.optional(v.nullable(v.string())),
    units: v.optional(v.nullable(v.array(UnitSchema))),
    files: v.optional(v.nullable(v.array(FileSchema))),
    criConfig: v.optional(v.nullable(CriConfigSchema)),
    inPlaceUpdates: v.optional(v.nullable(InPlaceUpdatesSchema)),
  }),
  status: v.optional(
    v.nullable(
      looseObject({
        extensionUnits: v.optional(v.nullable(v.array(UnitSchema))),
        extensionFiles: v.optional(v.nullable(v.array(FileSchema))),
        inPlaceUpdates: v.optional(
          v.nullable(looseObject({ osUpdate: v.optional(v.nullable(object({ command: v.string(), args: v.optional(v.nullable(v.array(v.string()))) }))) })),
        ),
      }),
    ),
  ),
});

export type OperatingSystemConfig = v.InferOutput<typeof OperatingSystemConfigSchema>;
export type OscUnit = v.InferOutput<typeof UnitSchema>;
export type OscFile = v.InferOutput<typeof FileSchema>;
export type InPlaceUpdates = v.InferOutput<typeof InPlaceUpdatesSchema>;
