// The OperatingSystemConfig the differential test evolves step by step, as data: each step derives the
// next OSC from the last one both agents were meant to apply, and the YAML both Secrets carry is this
// object serialised (or, for a step about YAML itself, a text a step renders).
import { stringify } from "yaml";

export type FileContent = {
  inline?: { encoding: string; data: string };
  secretRef?: { name: string; dataKey: string };
  imageRef?: { image: string; filePathInImage: string };
  [unknownField: string]: unknown;
};
export type OscFile = { path: string; permissions?: number; hostName?: string; content: FileContent };
export type DropIn = { name: string; content: string };
export type OscUnit = { name: string; enable?: boolean; command?: "start" | "restart" | "stop"; content?: string; dropIns?: DropIn[]; filePaths?: string[] };
export type RegistryHost = { url: string; capabilities?: string[]; caCerts?: string[]; overridePath?: boolean };
export type Registry = { upstream: string; server?: string; hosts?: RegistryHost[]; readinessProbe?: boolean };
export type Plugin = { path: string[]; values?: Record<string, unknown>; op?: "add" | "remove" };
export type CriConfig = {
  name: "containerd";
  cgroupDriver?: "systemd" | "cgroupfs";
  containerd?: { sandboxImage?: string; registries?: Registry[]; plugins?: Plugin[] };
};
export type InPlaceUpdates = {
  operatingSystemVersion: string;
  kubelet: string;
  credentialsRotation?: { certificateAuthorities?: { lastInitiationTime: string }; serviceAccountKey?: { lastInitiationTime: string } };
};

export type Osc = {
  apiVersion: "extensions.gardener.cloud/v1alpha1";
  kind: "OperatingSystemConfig";
  metadata: { name: string; namespace: string; annotations?: Record<string, string> };
  spec: {
    type: string;
    purpose: string;
    units: OscUnit[];
    files: OscFile[];
    criConfig?: CriConfig;
    inPlaceUpdates?: InPlaceUpdates;
    [unknownField: string]: unknown;
  };
  status?: {
    extensionUnits?: OscUnit[];
    extensionFiles?: OscFile[];
    inPlaceUpdates?: { osUpdate?: { command: string; args?: string[] } };
  };
};

export const inline = (data: string): FileContent => ({ inline: { encoding: "", data } });
export const b64 = (data: string): FileContent => ({ inline: { encoding: "b64", data: Buffer.from(data).toString("base64") } });

/** A service that runs until stopped; `tag` makes each unit's file its own. */
export const serviceUnit = (tag: string, extra = ""): string =>
  `[Unit]\nDescription=parity ${tag}\n[Service]\nExecStart=/bin/sleep infinity\n${extra}[Install]\nWantedBy=multi-user.target\n`;

export function emptyOsc(): Osc {
  return {
    apiVersion: "extensions.gardener.cloud/v1alpha1",
    kind: "OperatingSystemConfig",
    metadata: { name: "parity", namespace: "kube-system" },
    spec: { type: "debian", purpose: "reconcile", units: [], files: [] },
  };
}

export function render(osc: Osc): string {
  return stringify(osc, { lineWidth: 0 });
}

/** The unit names an OSC mentions (spec and status). */
export function unitNames(osc: Osc): string[] {
  return [...osc.spec.units, ...(osc.status?.extensionUnits ?? [])].map((u) => u.name);
}

// ---------------------------------------------------------------- editing helpers for the steps

export function unit(osc: Osc, name: string): OscUnit {
  const u = osc.spec.units.find((x) => x.name === name);
  if (!u) throw new Error(`the scenario's OSC has no unit ${name}`);
  return u;
}

export function file(osc: Osc, path: string): OscFile {
  const f = osc.spec.files.find((x) => x.path === path);
  if (!f) throw new Error(`the scenario's OSC has no file ${path}`);
  return f;
}

export function withoutFile(osc: Osc, path: string): void {
  osc.spec.files = osc.spec.files.filter((f) => f.path !== path);
}

export function withoutUnit(osc: Osc, name: string): void {
  osc.spec.units = osc.spec.units.filter((u) => u.name !== name);
}

export function containerd(osc: Osc): NonNullable<CriConfig["containerd"]> {
  if (!osc.spec.criConfig?.containerd) throw new Error("the scenario's OSC has no criConfig.containerd yet");
  return osc.spec.criConfig.containerd;
}
