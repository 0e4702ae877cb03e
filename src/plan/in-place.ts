// Gardener's in-place node updates, as gardener-node-agent (v1.150) tells them from an OSC change: a pool
// with an in-place update strategy gets `spec.inPlaceUpdates`, and only when the last applied OSC and the
// new one both carry it does an update count as in-place — an OS update (the node's os-release version
// is not the OSC's operatingSystemVersion), a kubelet minor version update, a change of kubelet's
// kubeReserved, evictionHard thresholds or cpuManagerPolicy, a CA or a service-account key rotation
// (a new lastInitiationTime). Everything else in the OSC is applied as for any pool. Pure.
import { decodeInline } from "../api/desired.ts";
import type { InPlaceChanges } from "../api/in-place-state.ts";
import type { InPlaceUpdates, OperatingSystemConfig } from "../api/osc.ts";
import type { Plan, Step } from "../api/plan.ts";
import type { Result } from "../api/result.ts";
import { decodeYamlBytes, parseYaml } from "../api/yaml.ts";

/** Where Gardener's OSC puts kubelet's configuration (components/kubelet PathKubeletConfig). */
export const kubeletConfigPath = "/var/lib/kubelet/config/kubelet";

export const noInPlaceChanges: InPlaceChanges = { kubeletConfig: false, cpuManagerPolicy: false, certificateAuthorities: false, serviceAccountKey: false };

/** The parts of an in-place update. */
export type InPlacePart = "operatingSystem" | "kubelet" | "certificateAuthorities" | "serviceAccountKey";

/** The parts `changes` asks for, each with what it is, for the log and for a Warning naming its field. */
export function partsOf(c: InPlaceChanges): { part: InPlacePart; what: string }[] {
  const parts: { part: InPlacePart; what: string }[] = [];
  if (c.operatingSystem) parts.push({ part: "operatingSystem", what: `an OS update from ${c.operatingSystem.from} to ${c.operatingSystem.to}` });
  const kubelet = [
    c.kubeletMinorVersion && `minor version ${c.kubeletMinorVersion.from} → ${c.kubeletMinorVersion.to}`,
    c.kubeletConfig && `kubeReserved/evictionHard in ${kubeletConfigPath}`,
    c.cpuManagerPolicy && `cpuManagerPolicy in ${kubeletConfigPath}`,
  ].filter(Boolean);
  if (kubelet.length) parts.push({ part: "kubelet", what: `a kubelet update (${kubelet.join(", ")})` });
  if (c.certificateAuthorities) parts.push({ part: "certificateAuthorities", what: "a certificate authority rotation" });
  if (c.serviceAccountKey) parts.push({ part: "serviceAccountKey", what: "a service-account key rotation" });
  return parts;
}

/**
 * The OS version as gardener-node-agent (and cadvisor, hence kubelet) reads it: the first version-like
 * number in os-release's PRETTY_NAME ("Debian GNU/Linux 12 (bookworm)" → "12").
 */
export function osVersionOf(osRelease: string): string | undefined {
  const pretty = /^PRETTY_NAME=(.*)$/m.exec(osRelease)?.[1]?.trim().replace(/^"|"$/g, "");
  return pretty === undefined ? undefined : /\b\d+(?:\.\d+)*\b/.exec(pretty)?.[0];
}

/**
 * What in-place work the change from `previous` (the last applied OSC; undefined on a fresh node) to
 * `next` asks of a node running OS version `osVersion`. Errors name the source and field.
 */
export function inPlaceChanges(previous: OperatingSystemConfig | undefined, next: OperatingSystemConfig, osVersion: string | undefined, source: string): Result<InPlaceChanges> {
  const before = previous?.spec.inPlaceUpdates;
  const after = next.spec.inPlaceUpdates;
  if (!before || !after) return { ok: true, value: noInPlaceChanges };
  const errors: string[] = [];
  const changes: InPlaceChanges = { ...noInPlaceChanges };

  if (osVersion === undefined) errors.push(`${source}: spec.inPlaceUpdates.operatingSystemVersion: the node's OS version cannot be read from /etc/os-release (PRETTY_NAME)`);
  else {
    const equal = sameVersion(osVersion, after.operatingSystemVersion);
    if (equal === undefined) errors.push(`${source}: spec.inPlaceUpdates.operatingSystemVersion: "${after.operatingSystemVersion}" is not a version`);
    else if (!equal) changes.operatingSystem = { from: osVersion, to: after.operatingSystemVersion };
  }

  if (before.kubelet !== after.kubelet) {
    const [from, to] = [minorOf(before.kubelet), minorOf(after.kubelet)];
    if (from === undefined || to === undefined) errors.push(`${source}: spec.inPlaceUpdates.kubelet: "${from === undefined ? before.kubelet : after.kubelet}" is not a version`);
    else if (from !== to) changes.kubeletMinorVersion = { from: before.kubelet, to: after.kubelet };
  }

  const [oldConfig, newConfig] = [kubeletConfigOf(previous, `${source} (the last applied OSC)`), kubeletConfigOf(next, source)];
  if (!oldConfig.ok || !newConfig.ok) errors.push(...(oldConfig.ok ? [] : oldConfig.errors), ...(newConfig.ok ? [] : newConfig.errors));
  else {
    changes.cpuManagerPolicy = (oldConfig.value.cpuManagerPolicy ?? "") !== (newConfig.value.cpuManagerPolicy ?? "");
    changes.kubeletConfig =
      !sameEntries(oldConfig.value.evictionHard, newConfig.value.evictionHard, evictionSignals) ||
      !sameEntries(oldConfig.value.kubeReserved, newConfig.value.kubeReserved, reservedResources);
  }

  changes.certificateAuthorities = rotated(before, after, "certificateAuthorities");
  changes.serviceAccountKey = rotated(before, after, "serviceAccountKey");
  return errors.length ? { ok: false, errors } : { ok: true, value: changes };
}

export const hasInPlaceChanges = (c: InPlaceChanges): boolean => partsOf(c).length > 0;

/**
 * The in-place work of a new OSC when the update of an older one was left unfinished (`left`: the parts it
 * had not done). gardener-node-agent tells the new OSC's work from the last OSC whose update completed, so
 * what the unfinished one owed is owed still (a CA rotation whose kubelet bootstrap failed is done with the
 * next OSC, not forgotten); trellis tells it from the last OSC applied (`next`), and adds what was owed. The
 * OS update is the exception: both tell it from the node's version alone, so `next` says it (an OSC that
 * reverts a failed OS update's version asks for none).
 */
export function carryOver(left: InPlaceChanges, next: InPlaceChanges): InPlaceChanges {
  const minor = left.kubeletMinorVersion && next.kubeletMinorVersion ? { from: left.kubeletMinorVersion.from, to: next.kubeletMinorVersion.to } : (next.kubeletMinorVersion ?? left.kubeletMinorVersion);
  return {
    ...(next.operatingSystem ? { operatingSystem: next.operatingSystem } : {}),
    ...(minor ? { kubeletMinorVersion: minor } : {}),
    kubeletConfig: left.kubeletConfig || next.kubeletConfig,
    cpuManagerPolicy: left.cpuManagerPolicy || next.cpuManagerPolicy,
    certificateAuthorities: left.certificateAuthorities || next.certificateAuthorities,
    serviceAccountKey: left.serviceAccountKey || next.serviceAccountKey,
  };
}

/** kubelet's CPU manager state: written under the old policy, and kubelet refuses to start with another one. */
export const cpuManagerState = "/var/lib/kubelet/cpu_manager_state";
const kubeletUnit = "kubelet.service";

/**
 * A plan of an update that changes kubelet's cpuManagerPolicy, with kubelet's CPU manager state removed
 * where gardener-node-agent removes it: right after kubelet's unit is written (every write of the plan
 * comes first), before any unit is stopped or restarted — kubelet, still running under the old policy,
 * has the least time to write the state again. Only when the plan restarts kubelet, as gardener-node-agent
 * only when kubelet's unit changed (its file, a drop-in or a file it lists).
 */
export function removingCpuManagerState(plan: Plan): Plan {
  const steps = plan.steps;
  if (!steps.some((s) => s.kind === "restart" && s.unit === kubeletUnit) || steps.some((s) => s.kind === "remove" && s.path === cpuManagerState)) return plan;
  const at = steps.findLastIndex((s) => s.kind === "write") + 1;
  const remove: Step = { kind: "remove", target: { type: "file" }, path: cpuManagerState, reason: "kubelet's cpuManagerPolicy changes: its CPU manager state of the old policy goes before it restarts" };
  return { ...plan, steps: [...steps.slice(0, at), remove, ...steps.slice(at)] };
}

// The kubelet settings an in-place pool rolls out in place (Gardener's "rolling update triggers").
const evictionSignals = ["memory.available", "imagefs.available", "imagefs.inodesFree", "nodefs.available", "nodefs.inodesFree"];
const reservedResources = ["cpu", "memory", "ephemeral-storage", "pid"];

type KubeletSettings = { cpuManagerPolicy?: string; evictionHard?: Record<string, string>; kubeReserved?: Record<string, string> };

function kubeletConfigOf(osc: OperatingSystemConfig, source: string): Result<KubeletSettings> {
  const where = `${source}: spec.files (${kubeletConfigPath})`;
  const inline = osc.spec.files?.find((f) => f.path === kubeletConfigPath)?.content.inline;
  if (!inline) return { ok: false, errors: [`${where}: an in-place update needs kubelet's configuration inline in spec.files`] };
  const problems: string[] = [];
  const bytes = decodeInline(inline.encoding, inline.data, (field, msg) => problems.push(`${where}.content.${field}: ${msg}`));
  if (!bytes) return { ok: false, errors: problems };
  const text = decodeYamlBytes(bytes, where);
  const doc = text.ok ? parseYaml(text.value, where) : text;
  if (!doc.ok) return doc;
  const config = typeof doc.value === "object" && doc.value !== null && !Array.isArray(doc.value) ? (doc.value as Record<string, unknown>) : {};
  const policy = config.cpuManagerPolicy;
  return {
    ok: true,
    value: {
      ...(typeof policy === "string" ? { cpuManagerPolicy: policy } : {}),
      evictionHard: stringMap(config.evictionHard),
      kubeReserved: stringMap(config.kubeReserved),
    },
  };
}

const stringMap = (x: unknown): Record<string, string> =>
  typeof x === "object" && x !== null && !Array.isArray(x) ? Object.fromEntries(Object.entries(x).map(([k, v]) => [k, String(v)])) : {};

function sameEntries(a: Record<string, string> = {}, b: Record<string, string> = {}, keys: string[]): boolean {
  return keys.every((k) => a[k] === b[k]);
}

function rotated(before: InPlaceUpdates, after: InPlaceUpdates, kind: "certificateAuthorities" | "serviceAccountKey"): boolean {
  const now = after.credentialsRotation?.[kind]?.lastInitiationTime;
  if (!after.credentialsRotation) return false;
  // The first rotation: the previous OSC had no rotation at all.
  if (!before.credentialsRotation) return Boolean(now);
  const then = before.credentialsRotation[kind];
  return Boolean(then && after.credentialsRotation[kind]) && instant(then?.lastInitiationTime) !== instant(now);
}

const instant = (t: string | null | undefined): number | undefined => (t ? Date.parse(t) : undefined);

/** Numeric components of a version ("v1.35.4" → [1, 35, 4]); undefined if it is none. */
function versionParts(v: string): number[] | undefined {
  const t = v.trim().replace(/^v/, "");
  return /^\d+(?:\.\d+)*$/.test(t) ? t.split(".").map(Number) : undefined;
}

/** Whether two versions are the same, missing components counting as 0 ("12" = "12.0"), as semver compares them. */
export function sameVersion(a: string, b: string): boolean | undefined {
  const [x, y] = [versionParts(a), versionParts(b)];
  if (!x || !y) return undefined;
  return Array.from({ length: Math.max(x.length, y.length) }, (_, i) => (x[i] ?? 0) === (y[i] ?? 0)).every(Boolean);
}

const minorOf = (v: string): number | undefined => {
  const parts = versionParts(v);
  return parts ? (parts[1] ?? 0) : undefined;
};
