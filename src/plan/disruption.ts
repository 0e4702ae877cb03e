// Whether a plan disrupts the node: it restarts or stops a unit that counts (the Secret's
// disruptive-units patterns; kubelet and containerd always), or it changes a file a running process reads
// without a restart: a static pod manifest (kubelet starts the new pod at once), a registry's hosts.toml
// (containerd reads it at the next pull), the CNI configuration (read for the next pod). Such a change
// reaches a node the moment it is written, so one bad kube-apiserver manifest would restart it on every
// control-plane node together: it passes the same admission, gate and budget as a unit restart. A plan
// that writes only other files, or enables units, disrupts nothing and is never held back. Pure.
import { type Desired, sha256Hex } from "../api/desired.ts";
import { dropInPath, unitFilePath } from "../api/paths.ts";
import type { Plan } from "../api/plan.ts";

export const alwaysDisruptive: readonly string[] = ["kubelet.service", "containerd.service"];

const globCache = new Map<string, RegExp>();
function glob(pattern: string): RegExp {
  let re = globCache.get(pattern);
  if (!re) {
    re = new RegExp(`^${pattern.replace(/[.+^${}()|[\]\\]/g, "\\$&").replace(/\*/g, ".*").replace(/\?/g, ".")}$`);
    globCache.set(pattern, re);
  }
  return re;
}

/** Whether `unit` matches one of the patterns (`*` any run of characters, `?` one), or always counts. */
export function countsAsDisruptive(unit: string, patterns: readonly string[]): boolean {
  return alwaysDisruptive.includes(unit) || patterns.some((p) => glob(p).test(unit));
}

/** Directories whose files running processes read as they change (see above). */
export const liveReadDirs: readonly string[] = ["/etc/kubernetes/manifests/", "/etc/containerd/certs.d/", "/etc/cni/net.d/"];

/** The files the plan writes or removes that a running process reads without a restart, in plan order. */
export function disruptedPaths(plan: Plan): string[] {
  const changed = plan.steps.flatMap((s) => ((s.kind === "write" || s.kind === "remove") && liveReadDirs.some((d) => s.path.startsWith(d)) ? [s.path] : []));
  return [...new Set(changed)];
}

/**
 * What the plan changes, one short digest per file, unit or drop-in written (with its content's hash) or
 * removed: the same change gives the same digest on every node, whatever else its plan holds.
 */
export function changesOf(plan: Plan): string[] {
  return digestsOf(plan.steps.flatMap((s) => (s.kind === "write" ? [[s.path, s.sha256]] : s.kind === "remove" ? [[s.path, "-"]] : [])));
}

/**
 * Every file, unit and drop-in the desired state leaves on the node, digested as `changesOf` digests a write:
 * once work passed its gate on a node whose failure is on the pool's record, the failed changes among these
 * are proven (`provenFailure`, src/rollout/pool.ts).
 */
export function carriesOf(desired: Desired): string[] {
  const entries = [
    ...desired.files.map((f) => [f.path, f.sha256] as const),
    ...desired.units.flatMap((u) => [...(u.sha256 !== undefined ? [[unitFilePath(u.name), u.sha256] as const] : []), ...u.dropIns.map((d) => [dropInPath(u.name, d.name), d.sha256] as const)]),
  ];
  return digestsOf(entries);
}

const digestsOf = (entries: readonly (readonly [string, string])[]): string[] => [...new Set(entries.map(([path, sha]) => sha256Hex(`${path}\0${sha}`).slice(0, 16)))];

/** What the plan disrupts: counted units and live-read files. */
export const disruptionOf = (plan: Plan, patterns: readonly string[]) => ({ units: disruptedUnits(plan, patterns), paths: disruptedPaths(plan) });

/** The units the plan restarts or stops that count as disruptive, in plan order, each once. */
export function disruptedUnits(plan: Plan, patterns: readonly string[]): string[] {
  const units = plan.steps.flatMap((s) => ((s.kind === "restart" || s.kind === "stop") && countsAsDisruptive(s.unit, patterns) ? [s.unit] : []));
  return [...new Set(units)];
}
