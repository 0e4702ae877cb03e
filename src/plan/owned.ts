// How each executed step changes the inventory of what trellis owns. Applied step by step during an
// apply (and persisted), so ownership is never lost to a crash or a failing step.
import type { Desired } from "../api/desired.ts";
import type { Owned, OwnedUnit } from "../api/state.ts";
import type { Step } from "./types.ts";

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
      else delete unit(step.target.unit).dropIns[step.target.name];
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

/** After a complete apply: forget units that left the OSC and record every desired unit's enablement. */
export function settleOwned(owned: Owned, desired: Desired): Owned {
  const units: Owned["units"] = {};
  for (const u of desired.units) units[u.name] = { ...(owned.units[u.name] ?? { dropIns: {} }), enable: u.enable };
  return { version: 1, files: { ...owned.files }, units };
}
