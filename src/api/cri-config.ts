// The OSC's `spec.criConfig` (Gardener's CRIConfig, extensions.gardener.cloud/v1alpha1). Shapes only, as
// in osc.ts: unknown fields are dropped and reported, optional fields may be null as Go's encoder writes
// them. What the values mean (upstream names, URLs, plugin paths) is checked in src/plan/containerd.ts,
// which names the field of every problem.
import * as v from "valibot";
import { object as criObject, record } from "./shapes.ts";

const opt = <T extends v.GenericSchema>(schema: T) => v.optional(v.nullable(schema));

export const registryCapabilities = ["pull", "resolve", "push"] as const;

export const RegistryHostSchema = criObject({
  url: v.string(),
  /** Defaults to pull + resolve, as Gardener's. */
  capabilities: opt(v.array(v.picklist(registryCapabilities))),
  /** Paths of CA files (not their content); relative ones are relative to the registry's certs.d dir. */
  caCerts: opt(v.array(v.string())),
  overridePath: opt(v.boolean()),
});

export const RegistryConfigSchema = criObject({
  /** host[:port] as containerd names the directory under certs.d, or `_default`. */
  upstream: v.string(),
  server: opt(v.string()),
  hosts: opt(v.array(RegistryHostSchema)),
  /** Write hosts.toml only once every host answers (the mirror may be a pod that is not running yet). */
  readinessProbe: opt(v.boolean()),
});

export const PluginConfigSchema = criObject({
  /** Gardener's default is add. */
  op: opt(v.picklist(["add", "remove"])),
  /** Below `plugins`, e.g. ["io.containerd.grpc.v1.cri", "containerd", "runtimes", "runsc"]. */
  path: v.array(v.string()),
  /** A JSON object (apiextensions JSON in Go) merged at the path. */
  values: opt(record(v.string(), v.unknown())),
});

export const ContainerdConfigSchema = criObject({
  registries: opt(v.array(RegistryConfigSchema)),
  sandboxImage: opt(v.string()),
  plugins: opt(v.array(PluginConfigSchema)),
});

export const CriConfigSchema = criObject({
  // A string, not a picklist: an OSC naming another CRI is not invalid, trellis just has nothing to do
  // for it (gardener-node-agent likewise acts only on "containerd").
  name: v.string(),
  cgroupDriver: opt(v.picklist(["systemd", "cgroupfs"])),
  containerd: opt(ContainerdConfigSchema),
});

export type CriConfig = v.InferOutput<typeof CriConfigSchema>;
export type ContainerdConfig = v.InferOutput<typeof ContainerdConfigSchema>;
export type RegistryConfig = v.InferOutput<typeof RegistryConfigSchema>;
export type RegistryHost = v.InferOutput<typeof RegistryHostSchema>;
export type PluginConfig = v.InferOutput<typeof PluginConfigSchema>;
export type RegistryCapability = (typeof registryCapabilities)[number];

/** gardener-node-agent touches containerd's config only when the CRI is containerd and `containerd` is set. */
export function managesContainerd(cri: CriConfig | null | undefined): cri is CriConfig & { containerd: ContainerdConfig } {
  return cri != null && cri.name === "containerd" && cri.containerd != null;
}
