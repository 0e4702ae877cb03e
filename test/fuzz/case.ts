// One fuzz case as data: everything the agent would read (the OSC Secret's osc.yaml and overlays, the
// Node's labels, the referenced Secrets) and the node it runs on (what is on disk, what trellis owns,
// what systemd says). A finding is saved as exactly this JSON (test/fixtures/fuzz/), so it replays
// without the generator that made it.
import { join } from "node:path";
import type { UnitState } from "./model.ts";

/** Findings saved as cases (`bun run fuzz --case N --save NAME`), replayed by test/unit/fuzz.test.ts. */
export const fixturesDir = join(import.meta.dir, "../fixtures/fuzz");

/** Bytes: text when they are valid UTF-8, else base64. */
export type Blob = string | { base64: string };

export type NodeEntry =
  | { path: string; kind: "file"; content: string; mode: number }
  | { path: string; kind: "dir" }
  | { path: string; kind: "symlink"; target: string }
  | { path: string; kind: "fifo" };

export type FuzzCase = {
  /** Where the case came from: `bun run fuzz --seed S --case N` makes it again. */
  seed: number;
  index: number;
  osc: Blob;
  /** The Secret's overlay-*.yaml data keys (and misnamed ones). */
  overlays: Record<string, Blob>;
  labels: Record<string, string>;
  hostName: string;
  /** kube-system Secrets by name: data key → base64; null: the Secret does not exist. */
  secrets: Record<string, Record<string, string> | null>;
  node: {
    entries: NodeEntry[];
    /** trellis's state.json as an earlier apply left it (parsed by the agent's own schema). */
    owned: unknown;
    units: Record<string, UnitState>;
  };
};

export const blobBytes = (b: Blob): Uint8Array => (typeof b === "string" ? new TextEncoder().encode(b) : new Uint8Array(Buffer.from(b.base64, "base64")));

export function toBlob(bytes: Uint8Array): Blob {
  try {
    return new TextDecoder("utf-8", { fatal: true }).decode(bytes);
  } catch {
    return { base64: Buffer.from(bytes).toString("base64") };
  }
}

/** A case of its own per (seed, index): replaying case N does not need cases 0..N-1. */
export function caseSeed(seed: number, index: number): number {
  let h = (seed ^ Math.imul(index + 1, 0x9e3779b1)) >>> 0;
  h = Math.imul(h ^ (h >>> 16), 0x85ebca6b) >>> 0;
  h = Math.imul(h ^ (h >>> 13), 0xc2b2ae35) >>> 0;
  return (h ^ (h >>> 16)) >>> 0;
}
