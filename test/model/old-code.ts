// Today's rollout code, as of commit 5822692, loaded from git rather than from src/: src/ is being
// rewritten (the new design), and the model must keep showing what the old code does. The commit's src/
// (and package.json, which src/version.ts reads) is extracted once into node_modules/.cache/trellis-model/<commit>/ (its imports of packages resolve to
// the repository's node_modules, so client-node is the same module the model routes) and imported from
// there. The types below are the parts of that code's API the old driver uses, as they were then.
import { existsSync, mkdirSync, renameSync, rmSync, writeFileSync } from "node:fs";
import { join, resolve } from "node:path";
import type { V1Node } from "@kubernetes/client-node";
import type { Kube } from "../../src/kube/client.ts";

export const oldCommit = "5822692";

export type OldSettings = { budget?: object; disruptiveUnits: string[]; settleMs: number; healthTimeoutMs: number; rollback: boolean; windows?: object };
export type OldPool = { secretUid: string; checksum: string; settings: OldSettings };
export type OldAdmission = { go: true } | { go: false; reason: string; message: string; retryAfterMs: number };
export type OldGate = { phase: "gating" | "failed" | "rolled-back" | "blocked"; checksum: string; units: string[]; appliedAt: string; failedCheck?: string };
export type OldRolloutState = { version: 1; slot?: { name: string; reasons: string[] }; gate?: OldGate; lastGood?: { checksum: string; base?: string; at: string } };
export type OldGateTick = { result: "passed" } | { result: "pending"; check?: string } | { result: "failed"; check: string };
export type Checksums = { base: string; checksum: string };

/** src/controllers/rollout.ts `Rollout` (the parts osc.ts calls). */
export type OldRollout = {
  state(): Promise<OldRolloutState>;
  admit(o: OldPool & { disrupted: string[] }): Promise<OldAdmission>;
  gated(checksum: string, units: string[], rolledBack?: boolean): Promise<void>;
  tick(settings: OldSettings): Promise<OldGateTick | undefined>;
  passed(ids: Checksums, osc: Uint8Array): Promise<void>;
  failed(check: string, rollingBack: boolean): Promise<void>;
  lastGood(except: string): Promise<{ checksum: string; base: string; osc: Uint8Array } | undefined>;
  applied(ids: Checksums, osc: Uint8Array): Promise<void>;
  observe(o: OldPool): void;
  stop(): Promise<void>;
};

/** src/controllers/rollout.ts RolloutDeps (OscWorkDeps and its own), loosely: the model's objects fill them. */
export type OldRolloutDeps = {
  kube: Kube;
  files: unknown;
  systemd: unknown;
  store: unknown;
  events: { record(e: unknown): Promise<undefined> };
  node: { current(): V1Node | undefined; subscribe(l: (n: V1Node) => void): () => void; found: Promise<V1Node>; listed: Promise<void> };
  status: { set(component: string, s: object): void; snapshot(): Record<string, never> };
  log: unknown;
  secretName: string;
  stuckThresholdMs: number;
  renewEveryMs?: number;
  now?: () => number;
  clock?: () => number;
};

export type OldCode = {
  startRollout(deps: OldRolloutDeps): OldRollout;
  parseRolloutSettings(annotations: Readonly<Record<string, string>> | undefined, source: string): { ok: true; value: OldSettings } | { ok: false; errors: string[] };
  gatesFor(o: { checksum: string; stateApplied: string | undefined; nodeApplied: string | undefined; serial: boolean }): { kind: "update" | "fresh" | "current"; delay: boolean; serial: boolean; admit: boolean };
  countsAsDisruptive(unit: string, patterns: readonly string[]): boolean;
  patchNodeMetadata(kube: Kube, nodeName: string, meta: { labels?: Record<string, string | null>; annotations?: Record<string, string | null> }): Promise<V1Node>;
  singleFlight(pass: (why: string) => Promise<void>): { trigger(why: string): void };
  backoffDelay(failures: number, b: { initialMs: number; maxMs: number }, random: number): number;
  effectiveChecksumAnnotation: string;
  poolLabel: string;
  slotPoolLabel: string;
};

/** Extracts (once) and imports the old code. */
export async function loadOldCode(): Promise<OldCode> {
  const repo = resolve(import.meta.dir, "../..");
  const root = join(repo, "node_modules", ".cache", "trellis-model", oldCommit);
  if (!existsSync(join(root, ".complete")) || !existsSync(join(root, "package.json"))) extract(repo, root);
  const load = async (path: string) => (await import(join(root, "src", path))) as Record<string, unknown>;
  const [rollout, gates, settings, disruption, node, loops, time, layers, slots] = await Promise.all(
    ["controllers/rollout.ts", "controllers/osc-gates.ts", "api/rollout.ts", "plan/disruption.ts", "kube/node.ts", "loops.ts", "time.ts", "api/layers.ts", "kube/slots.ts"].map(load),
  );
  return {
    startRollout: rollout?.startRollout,
    gatesFor: gates?.gatesFor,
    parseRolloutSettings: settings?.parseRolloutSettings,
    poolLabel: settings?.poolLabel,
    countsAsDisruptive: disruption?.countsAsDisruptive,
    patchNodeMetadata: node?.patchNodeMetadata,
    singleFlight: loops?.singleFlight,
    backoffDelay: time?.backoffDelay,
    effectiveChecksumAnnotation: layers?.effectiveChecksumAnnotation,
    slotPoolLabel: slots?.slotPoolLabel,
  } as OldCode;
}

function extract(repo: string, root: string): void {
  const tmp = `${root}.tmp-${process.pid}`;
  rmSync(tmp, { recursive: true, force: true });
  mkdirSync(tmp, { recursive: true });
  const r = Bun.spawnSync(["sh", "-c", `git -C "${repo}" archive --format=tar ${oldCommit} src package.json | tar -x -C "${tmp}"`], { stderr: "pipe" });
  if (r.exitCode !== 0) throw new Error(`extracting src/ of ${oldCommit} (needs the repository's history): ${r.stderr.toString()}`);
  writeFileSync(join(tmp, ".complete"), `${oldCommit}\n`);
  rmSync(root, { recursive: true, force: true });
  renameSync(tmp, root);
}
