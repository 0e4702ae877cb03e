// Reads what the plan needs to know about the node: the hash and mode of every path it may touch, which
// units without drop-ins in the OSC have a drop-in directory all the same, and, when systemd is at
// hand, the units' enablement and activity.
import type { Desired } from "../api/desired.ts";
import { dropInDir, dropInPath, systemdDir, unitFilePath } from "../api/paths.ts";
import type { Owned } from "../api/state.ts";
import type { Files } from "../host/files.ts";
import type { Systemd } from "../host/systemd.ts";
import { adoptMatching } from "../plan/owned.ts";
import { withOwedRestarts } from "../plan/owed.ts";
import { makePlan } from "../plan/plan.ts";
import type { Plan, Step } from "../api/plan.ts";
import { gardenerPending } from "./gardener-record.ts";
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
  // One listing of systemd's directory, not a checked walk per unit: most units have no `.d` at all.
  const dropInDirs = new Set<string>();
  const bare = desired.units.filter((u) => u.dropIns.length === 0);
  const listed = new Set(bare.length > 0 ? await files.list(systemdDir) : []);
  for (const u of bare) if (listed.has(`${u.name}.d`) && (await files.stat(dropInDir(u.name)))) dropInDirs.add(u.name);
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

/**
 * Observes the node, adopts what already matches the OSC, and plans: shared by `apply` and `plan`. What
 * gardener-node-agent's unfinished apply of this very OSC still owes (a node it was installing trellis on)
 * is owed by this plan: the files it would remove are taken as owned, the units it would restart restart.
 */
export async function planForNode(input: {
  desired: Desired;
  checksum: string;
  owned: Owned;
  files: Files;
  systemd: Systemd | undefined;
  selfUnit: string;
}): Promise<{ plan: Plan; owned: Owned }> {
  const pending = await gardenerPending(input.files, input.checksum);
  const start = pending ? await withRemovals(input.owned, pending.removals, input.files) : input.owned;
  const observed = await observe(input.desired, start, input.files, input.systemd);
  const owned = adoptMatching(start, input.desired, observed);
  const plan = makePlan({ checksum: input.checksum, desired: input.desired, owned, observed, selfUnit: input.selfUnit });
  const owed = (pending?.restarts ?? []).map((unit): Step => ({ kind: "restart", unit, reason: "gardener-node-agent changed it and restarted itself before restarting it" }));
  return { plan: withOwedRestarts(plan, owed, input.desired, input.selfUnit), owned };
}

/** `owned` with the regular files at `paths` it does not know, as they are on disk. */
async function withRemovals(owned: Owned, paths: string[], files: Files): Promise<Owned> {
  const found = await files.inspect(paths.filter((p) => !owned.files[p]));
  const added = Object.fromEntries([...found].flatMap(([path, seen]) => (seen.file ? [[path, { sha256: seen.file.sha256, mode: seen.file.mode }]] : [])));
  return { ...owned, files: { ...owned.files, ...added } };
}
