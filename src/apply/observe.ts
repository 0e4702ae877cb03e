// Reads what the plan needs to know about the node: the hash and mode of every path it may touch, which
// units without drop-ins in the OSC have a drop-in directory all the same, and, when systemd is at
// hand, the units' enablement and activity.
import type { Desired } from "../api/desired.ts";
import { dropInDir, dropInPath, unitFilePath } from "../api/paths.ts";
import type { Owned } from "../api/state.ts";
import type { Files } from "../host/files.ts";
import type { Systemd } from "../host/systemd.ts";
import { adoptMatching } from "../plan/owned.ts";
import { makePlan } from "../plan/plan.ts";
import type { Plan } from "../api/plan.ts";
import type { Observed } from "../plan/types.ts";

export async function observe(desired: Desired, owned: Owned, files: Files, systemd: Systemd | undefined): Promise<Observed> {
  const paths = new Set<string>([...desired.files.map((f) => f.path), ...Object.keys(owned.files)]);
  const units = new Set<string>([...desired.units.map((u) => u.name), ...Object.keys(owned.units)]);
  for (const u of desired.units) {
    paths.add(unitFilePath(u.name));
    for (const d of u.dropIns) paths.add(dropInPath(u.name, d.name));
  }
  for (const [name, u] of Object.entries(owned.units)) {
    paths.add(unitFilePath(name));
    for (const d of Object.keys(u.dropIns)) paths.add(dropInPath(name, d));
  }
  const observedFiles = new Map<string, { sha256: string; mode: number } | null>();
  const landsAt = new Map<string, string>();
  for (const [path, seen] of await files.inspect([...paths])) {
    if (seen.landsAt !== path) landsAt.set(path, seen.landsAt);
    observedFiles.set(path, seen.file ? { sha256: seen.file.sha256, mode: seen.file.mode } : null);
  }
  const dropInDirs = new Set<string>();
  for (const u of desired.units) if (u.dropIns.length === 0 && (await files.stat(dropInDir(u.name)))) dropInDirs.add(u.name);
  if (!systemd) return { files: observedFiles, landsAt, dropInDirs };
  const observedUnits = new Map<string, { unitFileState: string; activeState: string }>();
  for (const [name, s] of await systemd.unitStates([...units])) observedUnits.set(name, { unitFileState: s.unitFileState, activeState: s.activeState });
  return { files: observedFiles, landsAt, dropInDirs, units: observedUnits };
}

/** Hash and mode of the regular file at `path`; undefined when there is none. */
export async function observeFile(files: Files, path: string): Promise<{ sha256: string; mode: number } | undefined> {
  const file = (await files.inspect([path])).get(path)?.file;
  return file && { sha256: file.sha256, mode: file.mode };
}

/** Observes the node, adopts what already matches the OSC, and plans: shared by `apply` and `plan`. */
export async function planForNode(input: {
  desired: Desired;
  checksum: string;
  owned: Owned;
  files: Files;
  systemd: Systemd | undefined;
  selfUnit: string;
}): Promise<{ plan: Plan; owned: Owned }> {
  const observed = await observe(input.desired, input.owned, input.files, input.systemd);
  const owned = adoptMatching(input.owned, input.desired, observed);
  return { plan: makePlan({ checksum: input.checksum, desired: input.desired, owned, observed, selfUnit: input.selfUnit }), owned };
}
