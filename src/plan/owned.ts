// How each executed step changes the inventory of what trellis owns. Applied step by step during an
// apply (and persisted), so ownership is never lost to a crash or a failing step.
import { type Desired, type DesiredUnit, sha256Hex } from "../api/desired.ts";
import type { Owned, OwnedUnit } from "../api/state.ts";
import { dropInPath, unitFilePath } from "../api/paths.ts";
import type { Step } from "../api/plan.ts";
import { enablementDiffers, isActive } from "./plan.ts";
import type { Observed } from "./types.ts";

export function ownedAfter(owned: Owned, step: Step): Owned {
  const next: Owned = { version: 1, files: { ...owned.files }, units: { ...owned.units } };
  const unit = (name: string): OwnedUnit => {
    const u = next.units[name] ?? { dropIns: {} };
    const copy = { ...u, dropIns: { ...u.dropIns } };
    next.units[name] = copy;
    return copy;
  };
  switch (step.kind) {
    case "write":
      if (step.target.type === "file") next.files[step.path] = { sha256: step.sha256, mode: step.mode };
      else if (step.target.type === "unit") unit(step.target.unit).sha256 = step.sha256;
      else unit(step.target.unit).dropIns[step.target.name] = step.sha256;
      break;
    case "remove":
      if (step.target.type === "file") delete next.files[step.path];
      else if (step.target.type === "unit") delete unit(step.target.unit).sha256;
      else if (step.target.type === "drop-in") delete unit(step.target.unit).dropIns[step.target.name];
      else unit(step.target.unit).dropIns = {};
      break;
    case "enable":
    case "disable":
      unit(step.unit).enable = step.kind === "enable";
      break;
    default:
      return owned;
  }
  return next;
}

/** After a complete apply: forget units that left the OSC and record every desired unit's enable, command and spec. */
export function settleOwned(owned: Owned, desired: Desired): Owned {
  const units: Owned["units"] = {};
  for (const u of desired.units) {
    const { command: _previous, ...rest } = owned.units[u.name] ?? { dropIns: {} };
    units[u.name] = { ...rest, enable: u.enable, ...(u.command ? { command: u.command } : {}), spec: unitSpecDigest(u) };
  }
  return { version: 1, files: { ...owned.files }, units };
}

/**
 * The unit as the OSC declares it, as one hash: what gardener-node-agent compares with its last applied
 * OSC (apiequality.Semantic.DeepEqual of the whole Unit) to tell a changed unit. Content by its hash, lists
 * in their order.
 */
export function unitSpecDigest(u: DesiredUnit): string {
  return sha256Hex(JSON.stringify([u.name, u.command ?? null, u.enable, u.sha256 ?? null, u.dropIns.map((d) => [d.name, d.sha256]), u.filePaths]));
}

/**
 * Takes ownership of what the OSC declares and the disk already holds with exactly that content — a
 * node set up by gardener-node-agent, or by an apply whose record was lost. Without this, such files
 * and units would be left behind when they leave the OSC. A unit of which the OSC gives no file
 * (containerd.service, systemd-sysctl.service in Gardener's OSC: only its command, enablement and the
 * files it reads) is adopted when systemd already runs it as the OSC asks — enabled or not as asked,
 * active if it is to run, inactive if not — and its drop-ins are in place: taking over a running node
 * restarts nothing the OSC did not change (a file it lists that differs still restarts it).
 */
export function adoptMatching(owned: Owned, desired: Desired, observed: Observed): Owned {
  let next = owned;
  const matches = (path: string, sha256: string) => observed.files.get(path)?.sha256 === sha256;
  for (const f of desired.files) {
    if (!owned.files[f.path] && matches(f.path, f.sha256)) next = ownedAfter(next, { kind: "write", target: { type: "file" }, path: f.path, mode: f.mode, sha256: f.sha256, reason: "adopted" });
  }
  for (const u of desired.units) {
    const own = next.units[u.name];
    if (u.sha256 !== undefined && own?.sha256 === undefined && matches(unitFilePath(u.name), u.sha256)) {
      next = ownedAfter(next, { kind: "write", target: { type: "unit", unit: u.name }, path: unitFilePath(u.name), mode: 0o600, sha256: u.sha256, reason: "adopted" });
    }
    for (const d of u.dropIns) {
      const path = dropInPath(u.name, d.name);
      if (next.units[u.name]?.dropIns[d.name] === undefined && matches(path, d.sha256)) {
        next = ownedAfter(next, { kind: "write", target: { type: "drop-in", unit: u.name, name: d.name }, path, mode: 0o600, sha256: d.sha256, reason: "adopted" });
      }
    }
    const state = observed.units?.get(u.name);
    if (u.sha256 === undefined && !owned.units[u.name] && state && runsAsAsked(u, state) && u.dropIns.every((d) => matches(dropInPath(u.name, d.name), d.sha256))) {
      next = { ...next, units: { ...next.units, [u.name]: { dropIns: {}, ...next.units[u.name], enable: u.enable, ...(u.command ? { command: u.command } : {}) } } };
    }
  }
  return next;
}

function runsAsAsked(u: DesiredUnit, state: { unitFileState: string; activeState: string }): boolean {
  if (state.unitFileState === "" || enablementDiffers(u.enable, state.unitFileState)) return false;
  const toRun = u.enable && u.command !== "stop";
  return toRun ? state.activeState === "active" : !isActive(state.activeState);
}
