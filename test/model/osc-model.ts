// What the pool's OSC Secret says, reduced to what a rollout depends on: which version of each unit and
// file it wants (a unit whose version changes is restarted by the apply), per-node overlays picked by
// Node label (each gives the node its own effective checksum, as src/api/layers.ts does), and the
// rollout.trellis.dev/ annotations. Checksums follow Gardener's and trellis's rules: the base one is
// sha256 of the osc.yaml bytes (annotations are not part of it), the effective one sha256 over the base
// bytes and each matching overlay's key and bytes.
//
// Whether a version is broken is the model's secret, never written into the content the agents see:
// a broken unit fails once started ("unit"), or cuts the machine off the network a few seconds after it
// started ("network": a bad CNI or kubelet network setting).
import { createHash } from "node:crypto";

export type Content = { units: Record<string, string>; files: Record<string, string> };
export type Overlay = { key: string; label: string; value: string; files: Record<string, string> };
export type Revision = { id: number; osc: Content; overlays: Overlay[]; annotations: Record<string, string>; note: string };
export type Breakage = "unit" | "network";

/** What a node applies for a revision: checksums, content, and the bytes kept as the rollback target. */
export type Layered = { base: string; checksum: string; content: Content; bytes: Uint8Array };

export const units = ["kubelet.service", "containerd.service", "app.service"] as const;

const sorted = (r: Record<string, string>) => Object.fromEntries(Object.entries(r).sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0)));
/** Canonical bytes of a content: the same content always gives the same checksum. */
export const contentBytes = (c: Content): Uint8Array => new TextEncoder().encode(JSON.stringify({ files: sorted(c.files), units: sorted(c.units) }));
export const parseContent = (bytes: Uint8Array): Content => JSON.parse(new TextDecoder().decode(bytes)) as Content;
export const sameContent = (a: Content | undefined, b: Content | undefined): boolean =>
  a !== undefined && b !== undefined && Buffer.from(contentBytes(a)).equals(Buffer.from(contentBytes(b)));

const layered = new WeakMap<Revision, Map<string, Layered>>();

/** What a node with `labels` applies of `rev` (memoised: revisions never change). */
export function layer(rev: Revision, labels: Readonly<Record<string, string>>): Layered {
  const matched = rev.overlays.filter((o) => labels[o.label] === o.value);
  const key = matched.map((o) => o.key).join("\0");
  let byKey = layered.get(rev);
  if (!byKey) layered.set(rev, (byKey = new Map()));
  let l = byKey.get(key);
  if (!l) byKey.set(key, (l = compute(rev, matched)));
  return l;
}

function compute(rev: Revision, matched: readonly Overlay[]): Layered {
  const bytes = contentBytes(rev.osc);
  const base = createHash("sha256").update(bytes).digest("hex");
  if (matched.length === 0) return { base, checksum: base, content: rev.osc, bytes };
  const hash = createHash("sha256").update(bytes);
  const files = { ...rev.osc.files };
  for (const o of matched) {
    hash.update(`\0${o.key}\0`).update(JSON.stringify(sorted(o.files)));
    Object.assign(files, o.files);
  }
  const content = { units: rev.osc.units, files };
  return { base, checksum: hash.digest("hex"), content, bytes: contentBytes(content) };
}

const revisions = new WeakMap<Revision, string>();

/**
 * The Secret's revision as src/api/layers.ts `layeredChecksum` computes it over every overlay (not only
 * the ones a node picks): what the pool admits and stops, the same on every node whatever its overlays.
 */
export function revisionChecksum(rev: Revision): string {
  let sum = revisions.get(rev);
  if (sum === undefined) {
    const hash = createHash("sha256").update(contentBytes(rev.osc));
    for (const o of rev.overlays) hash.update(`\0${o.key}\0`).update(JSON.stringify(sorted(o.files)));
    sum = hash.digest("hex");
    revisions.set(rev, sum);
  }
  return sum;
}

export const unitKey = (unit: string, version: string) => `${unit}@${version}`;

/** The versions that are broken, and how. */
export class Breakages {
  private readonly broken = new Map<string, Breakage>();
  mark(unit: string, version: string, how: Breakage): void {
    this.broken.set(unitKey(unit, version), how);
  }
  of(unit: string, version: string | undefined): Breakage | undefined {
    return version === undefined ? undefined : this.broken.get(unitKey(unit, version));
  }
  /** The broken units of `c` and how each breaks. */
  in(c: Content | undefined): { unit: string; version: string; how: Breakage }[] {
    if (!c) return [];
    return Object.entries(c.units).flatMap(([unit, version]) => {
      const how = this.of(unit, version);
      return how ? [{ unit, version, how }] : [];
    });
  }
  good(c: Content | undefined): boolean {
    return this.in(c).length === 0;
  }
}
