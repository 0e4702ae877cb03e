// Drift: what changed on the node behind trellis's back since it applied the OSC. Pure: the agent's
// drift controller (src/controllers/drift.ts) observes and reports; this decides what counts.
import { dirname } from "node:path";
import { dropInPath, unitFilePath } from "../api/paths.ts";
import type { Owned } from "../api/state.ts";
import { compareText } from "../api/text-order.ts";
import { driftReasons, modeDrift } from "./plan.ts";
import type { Step } from "../api/plan.ts";

export type DriftKind = "content" | "mode" | "missing" | "unit-stopped";
export const driftKinds: DriftKind[] = ["content", "mode", "missing", "unit-stopped"];

/** One difference: `target` is a node path or a unit name, `detail` says what differs, for a person. */
export type Drift = { target: string; kind: DriftKind; detail: string };

/** What trellis wrote at a path: its hash and, for OSC files, its mode (unit files' mode is not recorded). */
export type Written = { sha256: string; mode?: number };
/** A path as it is now: undefined when there is no regular file. */
export type OnDisk = { sha256: string; mode: number } | undefined;

/** Every path trellis wrote and the node should still hold as written: files, unit files, drop-ins. */
export function writtenPaths(owned: Owned): Map<string, Written> {
  const out = new Map<string, Written>();
  for (const [path, f] of Object.entries(owned.files)) out.set(path, { sha256: f.sha256, mode: f.mode });
  for (const [name, u] of Object.entries(owned.units)) {
    if (u.sha256 !== undefined) out.set(unitFilePath(name), { sha256: u.sha256 });
    for (const [dropIn, sha256] of Object.entries(u.dropIns)) out.set(dropInPath(name, dropIn), { sha256 });
  }
  return out;
}

const octal = (mode: number) => `0${(mode & 0o7777).toString(8).padStart(3, "0")}`;

/** How `path` differs from what trellis wrote there, or undefined when it does not. */
export function fileDrift(path: string, written: Written, onDisk: OnDisk): Drift | undefined {
  if (!onDisk) return { target: path, kind: "missing", detail: `${path}: missing (deleted or not a regular file)` };
  const modeDiffers = written.mode !== undefined && (onDisk.mode & 0o7777) !== (written.mode & 0o7777);
  const mode = modeDiffers ? `mode ${octal(onDisk.mode)}, applied ${octal(written.mode as number)}` : "";
  if (onDisk.sha256 !== written.sha256) {
    const content = `content differs (sha256 ${onDisk.sha256.slice(0, 12)} on disk, ${written.sha256.slice(0, 12)} applied)`;
    return { target: path, kind: "content", detail: `${path}: ${content}${mode ? `; ${mode}` : ""}` };
  }
  return modeDiffers ? { target: path, kind: "mode", detail: `${path}: ${mode}` } : undefined;
}

/**
 * The directories to watch for `paths`: their parents, at most `max` of them (inotify watches are a
 * per-user kernel budget); the paths whose directory did not fit are only repaired by the periodic
 * re-check.
 */
export function watchedDirs(paths: Iterable<string>, max: number): { dirs: string[]; unwatched: string[] } {
  const byDir = new Map<string, string[]>();
  for (const p of paths) byDir.set(dirname(p), [...(byDir.get(dirname(p)) ?? []), p]);
  const sorted = [...byDir.keys()].sort();
  return { dirs: sorted.slice(0, max), unwatched: sorted.slice(max).flatMap((d) => byDir.get(d) ?? []) };
}

/**
 * The written paths an inotify event in `dir` may concern: all below it, so that a removed or renamed
 * drop-in directory (an event in its parent) covers its drop-ins. Hashing a few more files is cheaper
 * than mapping inotify's names (a removed watched directory reports its own name).
 */
export function pathsUnder(written: Iterable<string>, dir: string): string[] {
  return [...written].filter((p) => p.startsWith(dir === "/" ? "/" : `${dir}/`));
}

/**
 * Drift that keeps coming back: targets repaired at least `threshold` times within the last
 * `windowMs` (a neighbour fighting trellis). Drops repairs older than the window from `history`
 * (target → monotonic times) and says when the next one ages out, so the caller can look again then.
 */
export function recurringDrift(
  history: Map<string, number[]>,
  nowMs: number,
  threshold: number,
  windowMs: number,
): { recurring: { target: string; count: number }[]; nextChangeAtMs?: number } {
  const recurring: { target: string; count: number }[] = [];
  let next: number | undefined;
  for (const [target, times] of history) {
    const recent = times.filter((t) => nowMs - t < windowMs);
    if (recent.length === 0) {
      history.delete(target);
      continue;
    }
    history.set(target, recent);
    if (recent.length >= threshold) recurring.push({ target, count: recent.length });
    const agesOut = (recent[0] as number) + windowMs;
    next = next === undefined ? agesOut : Math.min(next, agesOut);
  }
  return { recurring: recurring.sort((a, b) => compareText(a.target, b.target)), ...(next !== undefined ? { nextChangeAtMs: next } : {}) };
}

/** The drift a reconcile repaired on its own (its plan's writes for drift: content, missing, or an OSC file's mode). */
export function driftInSteps(executed: readonly Step[]): Drift[] {
  return executed.flatMap((s): Drift[] => {
    if (s.kind !== "write") return [];
    if (s.reason === driftReasons.missing) return [{ target: s.path, kind: "missing", detail: `${s.path}: missing` }];
    if (s.reason === driftReasons.content) return [{ target: s.path, kind: "content", detail: `${s.path}: content differs from what trellis wrote` }];
    const mode = modeDrift(s.reason);
    return mode ? [{ target: s.path, kind: "mode", detail: `${s.path}: mode ${mode.onDisk}, applied ${mode.applied}` }] : [];
  });
}
