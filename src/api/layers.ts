// Layered configuration in one Secret: besides `osc.yaml` (the base, rank "default"), data keys
// `overlay-<name>.yaml` each hold units and files for the nodes a label selector picks, with a rank, in
// the order of Intel's cri-resource-manager: fallback < default < group < node < force. For every unit
// name and file path the highest-ranked layer that defines it wins and replaces the whole entry; a
// fallback entry is used only where no other layer has one. Two matching overlays of the same rank that
// define an entry differently are an error naming both. Everything stays in one Secret: one watch, no
// extra RBAC. Pure.
//
//   rank: group                       # fallback | group | node | force
//   selector: "pool.example.com/gpu=true"
//   units: [ … OSC units … ]
//   files: [ … OSC files … ]
import { createHash } from "node:crypto";
import * as v from "valibot";
import { formatIssues } from "./issues.ts";
import { oscDataKey } from "./paths.ts";
import { FileSchema, type OperatingSystemConfig, type OscFile, type OscUnit, UnitSchema } from "./osc.ts";
import type { Result } from "./result.ts";
import { matches, parseSelector, type Selector } from "./selector.ts";
import { strictObject, unknownKeys } from "./shapes.ts";
import { decodeYamlBytes, parseYaml } from "./yaml.ts";

/** The Node annotation with the checksum of what the node applies, where overlays make it differ from osc.yaml's. */
export const effectiveChecksumAnnotation = "trellis.dev/effective-checksum";
export const overlayKey = /^overlay-([a-z0-9]([-a-z0-9]*[a-z0-9])?)\.yaml$/;
const ranks = ["fallback", "default", "group", "node", "force"] as const;
export type Rank = (typeof ranks)[number];

const OverlaySchema = strictObject({
  rank: v.picklist(["fallback", "group", "node", "force"]),
  selector: v.string(),
  units: v.optional(v.nullable(v.array(UnitSchema))),
  files: v.optional(v.nullable(v.array(FileSchema))),
});

export type Overlay = { key: string; rank: Rank; selector: Selector; units: OscUnit[]; files: OscFile[]; bytes: Uint8Array };

/** Every overlay-*.yaml of the Secret's data, in key order; a data key that looks like one but is misnamed is an error. */
export function parseOverlays(data: Readonly<Record<string, Uint8Array>>, source: string): Result<Overlay[]> {
  const overlays: Overlay[] = [];
  const errors: string[] = [];
  for (const key of Object.keys(data).sort()) {
    if (!key.startsWith("overlay")) continue;
    const where = `${source}: data["${key}"]`;
    if (!overlayKey.test(key)) {
      errors.push(`${where}: an overlay's key is overlay-<name>.yaml, <name> of a-z, 0-9 and -`);
      continue;
    }
    const bytes = data[key] as Uint8Array;
    const text = decodeYamlBytes(bytes, where);
    const doc = text.ok ? parseYaml(text.value, where) : text;
    if (!doc.ok) {
      errors.push(...doc.errors);
      continue;
    }
    const r = v.safeParse(OverlaySchema, doc.value);
    if (!r.success) {
      errors.push(...formatIssues(r.issues).map((e) => `${where}: ${e}`));
      continue;
    }
    // An overlay is trellis's own format, written for trellis: what it would not act on is an error.
    const unread = [...doc.replaced, ...unknownKeys(OverlaySchema, doc.value).map((path) => `${path}: not a field of an OSC unit or file`)];
    if (unread.length > 0) {
      errors.push(...unread.map((e) => `${where}: ${e}`));
      continue;
    }
    const selector = parseSelector(r.output.selector);
    if (!selector.ok) {
      errors.push(...selector.errors.map((e) => `${where}: selector: ${e}`));
      continue;
    }
    overlays.push({ key, rank: r.output.rank, selector: selector.value, units: r.output.units ?? [], files: r.output.files ?? [], bytes });
  }
  return errors.length > 0 ? { ok: false, errors } : { ok: true, value: overlays };
}

/** Where an entry of the layered OSC came from: "osc.yaml", or the overlay's key and rank. */
export type Provenance = Map<string, string>;
export const baseLayer = oscDataKey;
export const unitEntry = (name: string) => `unit ${name}`;
export const fileEntry = (path: string) => `file ${path}`;

export type Layered = { osc: OperatingSystemConfig; provenance: Provenance; matched: Overlay[] };

/** The base OSC with the overlays whose selector matches `labels` merged onto it. */
export function layerOsc(base: OperatingSystemConfig, overlays: readonly Overlay[], labels: Readonly<Record<string, string>>, source: string): Result<Layered> {
  const matched = overlays.filter((o) => matches(o.selector, labels));
  const provenance: Provenance = new Map();
  const baseUnits = [...(base.spec.units ?? []), ...(base.status?.extensionUnits ?? [])];
  const baseFiles = [...(base.spec.files ?? []), ...(base.status?.extensionFiles ?? [])];
  for (const u of baseUnits) provenance.set(unitEntry(u.name), baseLayer);
  for (const f of baseFiles) provenance.set(fileEntry(f.path), baseLayer);
  if (matched.length === 0) return { ok: true, value: { osc: base, provenance, matched } };

  type Candidate<T> = { layer: string; rank: Rank; entry: T };
  const pick = <T>(entries: Map<string, Candidate<T>[]>, inBase: Set<string>, errors: string[]): Map<string, Candidate<T>> => {
    const winners = new Map<string, Candidate<T>>();
    for (const [key, candidates] of entries) {
      // A fallback counts only where nothing else defines the entry.
      const real = candidates.filter((c) => c.rank !== "fallback");
      if (inBase.has(key) && real.length === 0) continue;
      const pool = real.length > 0 ? real : candidates;
      const top = Math.max(...pool.map((c) => ranks.indexOf(c.rank)));
      const best = pool.filter((c) => ranks.indexOf(c.rank) === top);
      const first = best[0] as Candidate<T>;
      const differing = best.filter((c) => JSON.stringify(c.entry) !== JSON.stringify(first.entry));
      if (differing.length > 0) {
        errors.push(`${source}: ${key} is defined differently by ${best.map((c) => c.layer).join(" and ")}, all of rank ${first.rank}: conflicting overlays`);
        continue;
      }
      winners.set(key, first);
    }
    return winners;
  };
  const collect = <T>(get: (o: Overlay) => T[], keyOf: (e: T) => string) => {
    const m = new Map<string, Candidate<T>[]>();
    for (const o of matched) for (const e of get(o)) m.set(keyOf(e), [...(m.get(keyOf(e)) ?? []), { layer: `${o.key} (${o.rank})`, rank: o.rank, entry: e }]);
    return m;
  };
  const errors: string[] = [];
  const units = pick(collect((o) => o.units, (u) => unitEntry(u.name)), new Set(baseUnits.map((u) => unitEntry(u.name))), errors);
  const files = pick(collect((o) => o.files, (f) => fileEntry(f.path)), new Set(baseFiles.map((f) => fileEntry(f.path))), errors);
  if (errors.length > 0) return { ok: false, errors };

  // The winning entries replace the base's wherever it had them (spec or status) and are added to spec.
  const keepUnit = (u: OscUnit) => !units.has(unitEntry(u.name));
  const keepFile = (f: OscFile) => !files.has(fileEntry(f.path));
  for (const [key, c] of [...units, ...files]) provenance.set(key, c.layer);
  const osc: OperatingSystemConfig = {
    ...base,
    spec: {
      ...base.spec,
      units: [...(base.spec.units ?? []).filter(keepUnit), ...[...units.values()].map((c) => c.entry)],
      files: [...(base.spec.files ?? []).filter(keepFile), ...[...files.values()].map((c) => c.entry)],
    },
    ...(base.status ? { status: { ...base.status, extensionUnits: (base.status.extensionUnits ?? []).filter(keepUnit), extensionFiles: (base.status.extensionFiles ?? []).filter(keepFile) } } : {}),
  };
  return { ok: true, value: { osc, provenance, matched } };
}

/**
 * The checksum of what a node applies: Gardener's (sha256 of osc.yaml's bytes) when no overlay matches it,
 * else sha256 over osc.yaml and every matching overlay, each with its key.
 */
export function layeredChecksum(base: Uint8Array, matched: readonly Overlay[]): string {
  const hash = createHash("sha256").update(base);
  for (const o of matched) hash.update(`\0${o.key}\0`).update(o.bytes);
  return hash.digest("hex");
}
