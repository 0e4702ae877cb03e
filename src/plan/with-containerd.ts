// Adds containerd's configuration (src/plan/containerd.ts) to a desired state as ordinary files and a
// host unit, so that the plan treats it like everything else: config.toml and the hosts.toml files are
// written only when their content differs, containerd.service lists config.toml among its filePaths
// (so it restarts exactly when config.toml was written, never for a hosts.toml, which containerd reads
// per pull), and its PATH drop-in is trellis's like any other drop-in. What containerd may not act on
// (its notes) is reported with the OSC's other unsupported parts.
import { type Desired, type DesiredUnit, sha256Hex } from "../api/desired.ts";
import { configFileMode, containerdConfigFile, type ContainerdDesired, hostsFileMode, hostsTomlPath } from "./containerd.ts";

export function withContainerd(desired: Desired, cd: ContainerdDesired, where: string): { ok: true; value: Desired } | { ok: false; errors: string[] } {
  const errors: string[] = [];
  const added = [
    { path: containerdConfigFile, content: cd.configToml, mode: configFileMode, origin: where },
    ...cd.hostsFiles.map((h) => ({ path: h.path, content: h.content, mode: hostsFileMode, origin: `${where}.containerd.registries (${h.upstream})` })),
  ];
  const taken = new Map(desired.files.map((f) => [f.path, f.origin]));
  for (const f of added) {
    const other = taken.get(f.path);
    if (other) errors.push(`${other}: path is also written by ${f.origin}`);
  }
  const { envDropIn } = cd;
  const unit = desired.units.find((u) => u.name === envDropIn.unit);
  if (unit?.dropIns.some((d) => d.name === envDropIn.name)) {
    errors.push(`unit ${envDropIn.unit}.dropIns[${envDropIn.name}]: trellis writes this drop-in for ${where}`);
  }
  if (errors.length > 0) return { ok: false, errors };

  const dropIn = { name: envDropIn.name, content: envDropIn.content, sha256: sha256Hex(envDropIn.content) };
  const containerd: DesiredUnit = unit
    ? { ...unit, dropIns: [...unit.dropIns, dropIn], filePaths: [...new Set([...unit.filePaths, containerdConfigFile])] }
    : { name: envDropIn.unit, enable: true, dropIns: [dropIn], filePaths: [containerdConfigFile] };
  const encoder = new TextEncoder();
  return {
    ok: true,
    value: {
      ...desired,
      files: [
        ...desired.files,
        ...added.map((f) => {
          const content = encoder.encode(f.content);
          return { path: f.path, mode: f.mode, content, sha256: sha256Hex(content), origin: f.origin };
        }),
      ],
      units: unit ? desired.units.map((u) => (u === unit ? containerd : u)) : [...desired.units, containerd],
      unsupported: [...desired.unsupported, ...cd.notes],
      // A registry waiting for its readiness probe keeps what an earlier apply wrote for it.
      keep: [...desired.keep, ...cd.pendingRegistries.map(hostsTomlPath)],
    },
  };
}
