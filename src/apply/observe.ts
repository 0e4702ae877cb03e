// Reads what the plan needs to know about the node: the hash and mode of every path it may touch,
// and, when systemd is at hand, the units' enablement and activity.
import type { Desired } from "../api/desired.ts";
import { dropInPath, unitFilePath } from "../api/paths.ts";
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
  await Promise.all(
    [...paths].map(async (path) => {
      const at = await files.landsAt(path);
      if (at !== undefined && at !== path) landsAt.set(path, at);
      observedFiles.set(path, (await observeFile(files, path)) ?? null);
    }),
  );
  if (!systemd) return { files: observedFiles, landsAt };
  const observedUnits = new Map<string, { unitFileState: string; activeState: string }>();
  for (const name of units) {
    const s = await systemd.unitStatus(name);
    observedUnits.set(name, { unitFileState: s.unitFileState, activeState: s.activeState });
  }
  return { files: observedFiles, landsAt, units: observedUnits };
}

/** Hash and mode of the regular file at `path`; undefined when there is none. */
export async function observeFile(files: Files, path: string): Promise<{ sha256: string; mode: number } | undefined> {
  const st = await files.stat(path);
  if (!st || st.kind !== "file") return undefined;
  const sha256 = await files.sha256(path);
  return sha256 === undefined ? undefined : { sha256, mode: st.mode };
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
