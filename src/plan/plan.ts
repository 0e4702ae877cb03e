// desired state + what trellis owns + what is on the node → the steps that bring the node to the
// desired state, each with the reason it is needed. Pure: no I/O, no clock.
//
// Rules (gardener-node-agent's, minus its flaws):
// - A file is written when the disk differs from the OSC (content or mode): new, changed, or drifted.
// - A unit changes when it is new, its unit file or a drop-in was written or removed, its enablement
//   changed, a file in its filePaths was written, or anything else of it in the OSC changed since it was
//   last applied (its command, its filePaths: GNA compares the whole unit). A changed unit is restarted;
//   `command: stop` or `enable: false` stops it instead. A file in its filePaths that was removed is no
//   cause: as in GNA, the unit's own filePaths change with it, or nothing about the unit did.
// - A changed unit the OSC gives no drop-ins loses its whole drop-in directory, whoever put what there
//   (GNA's applyChangedUnits: the OS's or cloud-init's drop-ins must not outlive the OSC's say).
// - What leaves the OSC leaves the node, but only what trellis wrote (Owned): its units are stopped
//   and disabled before their files are removed, after every write; drop-ins and files other tools
//   put there are never touched otherwise.
// - One daemon-reload per plan, after unit files and enablement changed; the agent's own unit restarts last.
import type { Desired, DesiredUnit } from "../api/desired.ts";
import { dropInDir, dropInPath, unitFilePath } from "../api/paths.ts";
import type { Owned } from "../api/state.ts";
import type { Plan, Step } from "../api/plan.ts";
import { unitSpecDigest } from "./owned.ts";
import type { Observed } from "./types.ts";

/** Gardener writes unit files and drop-ins 0600. */
export const unitFileMode = 0o600;

export type PlanInput = {
  checksum: string;
  desired: Desired;
  owned: Owned;
  observed: Observed;
  /** The agent's own unit: restarted after everything else. */
  selfUnit: string;
};

export function makePlan(input: PlanInput): Plan {
  const { desired, owned, observed } = input;
  const removeUnits: Step[] = []; // stop + disable of units leaving the OSC
  const fileSteps: Step[] = [];
  const unitFileSteps: Step[] = [];
  const enableSteps: Step[] = [];
  const enablementChanged: string[] = [];
  const stops: Step[] = [];
  const restarts: Step[] = [];
  const disk = (path: string) => observed.files.get(path) ?? null;
  const systemd = (unit: string) => observed.units?.get(unit);
  const desiredUnits = new Set(desired.units.map((u) => u.name));
  // A path the desired state writes is never removed, whatever role trellis owned it in before (a unit
  // file or drop-in that became a plain file, or the reverse), nor under another name through a symlink
  // (an OSC moving a file from /var/run to /run); and no file is removed twice.
  const landing = (path: string) => observed.landsAt?.get(path) ?? path;
  const kept = new Set([...desired.files.map((f) => f.path), ...desired.keep]);
  for (const u of desired.units) {
    if (u.content !== undefined) kept.add(unitFilePath(u.name));
    for (const d of u.dropIns) kept.add(dropInPath(u.name, d.name));
  }
  for (const path of [...kept]) kept.add(landing(path));
  const removing = new Set<string>();
  const removable = (path: string) => {
    if (kept.has(path) || kept.has(landing(path)) || removing.has(landing(path)) || !disk(path)) return false;
    removing.add(landing(path));
    return true;
  };

  // Units that left the OSC.
  for (const [unit, own] of Object.entries(owned.units)) {
    // The agent never stops or removes itself (it could not finish, or ever come back).
    if (desiredUnits.has(unit) || unit === input.selfUnit) continue;
    const ours = own.sha256 !== undefined;
    if (ours) {
      const state = systemd(unit);
      if (!state || isActive(state.activeState)) removeUnits.push({ kind: "stop", unit, reason: "removed from the OSC" });
      removeUnits.push({ kind: "disable", unit, reason: "removed from the OSC" });
      if (removable(unitFilePath(unit))) {
        unitFileSteps.push({ kind: "remove", target: { type: "unit", unit }, path: unitFilePath(unit), reason: "removed from the OSC" });
      }
    }
    let droppedDropIns = false;
    for (const name of Object.keys(own.dropIns)) {
      const path = dropInPath(unit, name);
      if (!removable(path)) continue;
      unitFileSteps.push({ kind: "remove", target: { type: "drop-in", unit, name }, path, reason: `unit ${unit} removed from the OSC` });
      droppedDropIns = true;
    }
    // A host unit keeps running, but without the drop-ins trellis gave it.
    if (!ours && droppedDropIns) restarts.push({ kind: "restart", unit, reason: "its drop-ins were removed from the OSC" });
  }

  // Files.
  const changedFiles = new Set<string>();
  for (const f of desired.files) {
    const written = owned.files[f.path];
    const why = writeReason(disk(f.path), written?.sha256, f.sha256, f.mode, written?.mode);
    if (!why) continue;
    fileSteps.push({ kind: "write", target: { type: "file" }, path: f.path, mode: f.mode, sha256: f.sha256, reason: why });
    changedFiles.add(f.path);
  }
  const desiredFiles = new Set(desired.files.map((f) => f.path));
  for (const path of Object.keys(owned.files)) {
    if (desiredFiles.has(path)) continue;
    if (!removable(path)) continue;
    fileSteps.push({ kind: "remove", target: { type: "file" }, path, reason: "removed from the OSC" });
  }

  // Units in the OSC.
  for (const unit of desired.units) {
    // Like gardener-node-agent, the agent never disables or stops itself: it would not come back to
    // finish the apply (or ever). Its unit is enabled and restarted instead; a recorded "false" can
    // only be the OSC's enable: false, which was never applied to it.
    const isSelf = unit.name === input.selfUnit;
    const u = isSelf ? { ...unit, enable: true, command: undefined } : unit;
    const own = owned.units[u.name];
    const ownEnable = isSelf && own?.enable !== undefined ? true : own?.enable;
    const causes: string[] = own ? [] : ["new unit"];
    let wroteUnitFile = false;
    if (u.content !== undefined && u.sha256 !== undefined) {
      const path = unitFilePath(u.name);
      const why = writeReason(disk(path), own?.sha256, u.sha256, unitFileMode);
      if (why) {
        unitFileSteps.push({ kind: "write", target: { type: "unit", unit: u.name }, path, mode: unitFileMode, sha256: u.sha256, reason: why });
        if (own && !modeOnly(why)) causes.push(`unit file: ${why}`);
        wroteUnitFile = true;
      }
    }
    for (const d of u.dropIns) {
      const path = dropInPath(u.name, d.name);
      const why = writeReason(disk(path), own?.dropIns[d.name], d.sha256, unitFileMode);
      if (!why) continue;
      unitFileSteps.push({ kind: "write", target: { type: "drop-in", unit: u.name, name: d.name }, path, mode: unitFileMode, sha256: d.sha256, reason: why });
      if (own && !modeOnly(why)) causes.push(`drop-in ${d.name}: ${why}`);
    }
    const wanted = new Set(u.dropIns.map((d) => d.name));
    for (const name of Object.keys(own?.dropIns ?? {})) {
      const path = dropInPath(u.name, name);
      if (wanted.has(name) || !removable(path)) continue;
      unitFileSteps.push({ kind: "remove", target: { type: "drop-in", unit: u.name, name }, path, reason: "removed from the OSC" });
      causes.push(`drop-in ${name} removed`);
    }
    const enablement = enablementStep(u, ownEnable, systemd(u.name)?.unitFileState, !own || wroteUnitFile);
    if (enablement) {
      enableSteps.push(enablement.step);
      if (enablement.changed) enablementChanged.push(u.name);
      if (enablement.changed && own) causes.push(u.enable ? "enabled" : "disabled");
    }
    if (own) for (const p of u.filePaths) if (changedFiles.has(p)) causes.push(`file ${p} changed`);
    if (own && !isSelf && (own.enable === false || own.command === "stop") && u.enable && u.command !== "stop") {
      causes.push(`was ${own.command === "stop" ? "command: stop" : "enable: false"} before`);
    }
    if (causes.length === 0 && own?.spec !== undefined && own.spec !== unitSpecDigest(unit)) causes.push("changed in the OSC");
    const dir = dropInDir(u.name);
    // Not where the OSC writes a file (at the directory's path or in it), nor what is removed already.
    const spared = kept.has(dir) || removing.has(dir) || [...kept].some((p) => p.startsWith(`${dir}/`));
    if (u.dropIns.length === 0 && causes.length > 0 && observed.dropInDirs?.has(u.name) && !spared) {
      removing.add(dir);
      unitFileSteps.push({ kind: "remove", target: { type: "drop-ins", unit: u.name }, path: dir, reason: "the OSC gives this unit no drop-ins" });
    }

    if (u.command === "stop" || !u.enable) {
      const state = systemd(u.name);
      const running = state ? isActive(state.activeState) : causes.length > 0;
      if (running) stops.push({ kind: "stop", unit: u.name, reason: u.command === "stop" ? "command: stop" : "enable: false" });
    } else if (causes.length) {
      restarts.push({ kind: "restart", unit: u.name, reason: causes.join("; ") });
    }
  }

  // After enabling too, as `systemctl enable` does: systemd keeps each unit's UnitFileState from its last
  // load, so without a reload an enable-only change reads as not made (parity with gardener-node-agent: the
  // next plan saw `enable: false` undone as still enabled, and a later one restarted the unit needlessly).
  const reloadFor = [...new Set([...unitFileSteps.map(unitOf), ...enablementChanged])];
  const reload: Step[] = reloadFor.length ? [{ kind: "daemon-reload", reason: `unit files or their enablement changed: ${reloadFor.join(", ")}` }] : [];
  const self = restarts.filter((s) => s.kind === "restart" && s.unit === input.selfUnit);
  const others = restarts.filter((s) => !self.includes(s));
  // Every write comes before any unit is touched, those leaving the OSC included: a write that fails
  // (disk full) must leave a renamed unit's predecessor running. Units leaving the OSC are stopped and
  // disabled before their files go (disabling reads the unit file's [Install]).
  const pathSteps = [...fileSteps, ...unitFileSteps];
  const writes = pathSteps.filter((s) => s.kind === "write");
  const removals = pathSteps.filter((s) => s.kind === "remove");
  return {
    checksum: input.checksum,
    steps: [...writes, ...removeUnits, ...removals, ...enableSteps, ...reload, ...stops, ...others, ...self],
  };
}

// systemd reads a unit file the same whatever its mode (bootstrap writes the agent's unit 0644, the
// OSC's units are 0600): fixing the mode alone is no reason to restart the unit.
const modeOnly = (why: string) => why.startsWith("mode ");

/** Reasons of a write that repairs drift (what trellis wrote, and the OSC still wants, changed on disk). */
export const driftReasons = { missing: "missing on disk (drift)", content: "content on disk differs from what trellis wrote (drift)" } as const;
/** A mode changed on disk while the OSC kept it: "mode 0600 → 0644 (drift)" (modeDrift reads it back). */
const driftMark = " (drift)";
export const modeDrift = (reason: string): { onDisk: string; applied: string } | undefined => {
  const m = /^mode (0[0-7]+) → (0[0-7]+) \(drift\)$/.exec(reason);
  return m ? { onDisk: m[1] as string, applied: m[2] as string } : undefined;
};

// `writtenMode`: the mode trellis wrote (OSC files; unit files' is not recorded), so that a mode changed
// behind its back is told apart from one the OSC changed.
function writeReason(onDisk: { sha256: string; mode: number } | null, writtenSha: string | undefined, sha256: string, mode: number, writtenMode?: number): string | undefined {
  if (!onDisk) return writtenSha === undefined ? "new" : driftReasons.missing;
  if (onDisk.sha256 !== sha256) {
    if (writtenSha === sha256) return driftReasons.content;
    return writtenSha === undefined ? "content differs from the OSC" : "content changed";
  }
  // keep "mode " first: modeOnly()
  if (onDisk.mode !== mode) return `mode ${octal(onDisk.mode)} → ${octal(mode)}${writtenSha === sha256 && writtenMode === mode ? driftMark : ""}`;
  return undefined;
}

// Enabling is idempotent and re-reads [Install], so a rewritten unit file is enabled again; whether
// that counts as a change (and so a restart cause) depends on the state before. Only "disabled" can
// be enabled: static, indirect or generated units have no [Install] to act on and must not look
// perpetually "not enabled".
function enablementStep(
  u: DesiredUnit,
  ownEnable: boolean | undefined,
  unitFileState: string | undefined,
  rewritten: boolean,
): { step: Step; changed: boolean } | undefined {
  const known = unitFileState !== undefined && unitFileState !== "";
  const mismatch = known
    ? enablementDiffers(u.enable, unitFileState)
    : ownEnable === undefined
      ? undefined
      : ownEnable !== u.enable;
  if (mismatch === false && !rewritten) return undefined;
  const reason = mismatch ? `was ${u.enable ? "disabled" : "enabled"}` : rewritten ? "unit file written" : "enablement not yet recorded";
  return { step: { kind: u.enable ? "enable" : "disable", unit: u.name, reason }, changed: mismatch === true };
}

/** Whether systemd's UnitFileState contradicts `enable` (see enablementStep). */
export const enablementDiffers = (enable: boolean, unitFileState: string): boolean => (enable ? unitFileState === "disabled" : enabledStates.has(unitFileState));
// "enabled-runtime"/"linked-runtime" are left out: DisableUnitFiles(runtime=false) cannot clear them,
// so treating them as a mismatch would disable (and stop) on every apply.
const enabledStates = new Set(["enabled", "linked"]);
export const isActive = (activeState: string) => activeState !== "inactive" && activeState !== "failed";
const octal = (mode: number) => `0${mode.toString(8)}`;
const unitOf = (s: Step) => (s.kind === "write" || s.kind === "remove") && s.target.type !== "file" ? s.target.unit : "";
