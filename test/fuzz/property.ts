// Runs one fuzz case through the agent's own path, in process: osc.yaml bytes → parseOscBytes →
// parseOverlays/layerOsc → desiredForNode (with the real Files over a scratch root that holds the
// case's node, so every path check is the real one) → applyDesired on the in-memory node (model.ts) →
// applyDesired again. The properties:
// - nothing throws: bad input comes back as the documented Result errors, each naming the object;
// - a plan touches only what is desired or owned: writes are desired paths with their hash and mode,
//   removals are owned paths no longer desired, unit steps name desired or owned units, the agent's
//   own unit is never stopped or disabled and restarts last, one daemon-reload at most;
// - every write the validation let through succeeds on the node (no path below a file, no directory);
// - after a complete apply the node holds exactly the desired content, and planning again plans
//   nothing (idempotence);
// - no case takes longer than caseTimeBoundMs.
import { chmodSync, linkSync, lstatSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, readlinkSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import * as v from "valibot";
import { type Desired, parseOscBytes, sha256Hex } from "../../src/api/desired.ts";
import { layeredChecksum, layerOsc, parseOverlays } from "../../src/api/layers.ts";
import type { OperatingSystemConfig } from "../../src/api/osc.ts";
import { agentUnit, dropInPath, paths, unitFilePath } from "../../src/api/paths.ts";
import type { Owned } from "../../src/api/state.ts";
import { applyDesired } from "../../src/apply/apply.ts";
import { desiredForNode } from "../../src/apply/desired-for-node.ts";
import { createStateStore, statePath } from "../../src/apply/state-store.ts";
import { createFiles } from "../../src/host/files.ts";
import { ImageError, type ImageStore } from "../../src/host/registry/store.ts";
import { createLogger, describeError } from "../../src/log.ts";
import { unitFileMode } from "../../src/plan/plan.ts";
import { describeStep } from "../../src/plan/render.ts";
import { type Plan, PlanSchema, type Step } from "../../src/api/plan.ts";
import { blobBytes, type FuzzCase } from "./case.ts";
import { hostUnits } from "./generate.ts";
import { type Entry, ModelDisk, ModelSystemd, unitNotFound } from "./model.ts";

const source = "Secret kube-system/fuzz";
/** A case is a handful of small documents: anything near a second is a finding (the limits in yaml.ts aim far lower). */
const caseTimeBoundMs = 2_000;

export type Outcome = "invalid" | "applied" | "unit-failed" | "skipped" | "exception";
export type Finding = { property: string; detail: string };
export type CaseResult = { outcome: Outcome; findings: Finding[]; ms: number };

/**
 * A scratch directory for the cases' node roots (tmpfs when there is one) and a FIFO to hard-link into
 * them. While it exists PATH is empty, so that containerd's default config is trellis's built-in one on
 * every machine: `containerd config default` differs between machines (a case would replay differently)
 * and costs 50 ms a call.
 */
export type Env = { dir: string; fifo: string; next: number; path: string | undefined; warnings: string[]; emitWarning: typeof process.emitWarning };

export function createEnv(): Env {
  const base = lstatSync("/dev/shm", { throwIfNoEntry: false })?.isDirectory() ? "/dev/shm" : tmpdir();
  const dir = mkdtempSync(join(base, "trellis-fuzz-"));
  const fifo = join(dir, "fifo");
  const made = Bun.spawnSync(["mkfifo", fifo]);
  if (made.exitCode !== 0) throw new Error(`mkfifo ${fifo}: ${made.stderr.toString()}`);
  const path = process.env.PATH;
  process.env.PATH = join(dir, "no-binaries");
  // A process warning (the yaml package's, say) goes to stderr past the agent's JSON log: a finding.
  // Taken where it is emitted: a worker's "warning" events do not reach its own listeners.
  const warnings: string[] = [];
  const { emitWarning } = process;
  process.emitWarning = ((w: string | Error) => void warnings.push(w instanceof Error ? w.message : w)) as typeof process.emitWarning;
  return { dir, fifo, next: 0, path, warnings, emitWarning };
}

export function disposeEnv(env: Env): void {
  process.emitWarning = env.emitWarning;
  if (env.path === undefined) delete process.env.PATH;
  else process.env.PATH = env.path;
  rmSync(env.dir, { recursive: true, force: true });
}

const silent = createLogger({ level: "error", write: () => {} });

export async function runCase(c: FuzzCase, env: Env): Promise<CaseResult> {
  const started = performance.now();
  const findings: Finding[] = [];
  const root = join(env.dir, `case-${env.next++}`);
  let outcome: Outcome;
  try {
    materialise(c, root, env.fifo);
    outcome = await check(c, root, findings);
  } catch (err) {
    findings.push({ property: "no exception", detail: `${describeError(err)}\n${err instanceof Error ? (err.stack ?? "").split("\n").slice(1, 6).join("\n") : ""}` });
    outcome = "exception";
  } finally {
    rmSync(root, { recursive: true, force: true });
  }
  for (const w of env.warnings.splice(0)) findings.push({ property: "no process warnings", detail: w });
  const ms = performance.now() - started;
  if (ms > caseTimeBoundMs) findings.push({ property: "bounded time", detail: `took ${ms.toFixed(0)} ms (bound ${caseTimeBoundMs} ms)` });
  return { outcome, findings, ms };
}

async function check(c: FuzzCase, root: string, findings: Finding[]): Promise<Outcome> {
  const fail = (property: string, detail: string) => findings.push({ property, detail });
  const refused = (errors: string[]): Outcome => {
    if (errors.length === 0) fail("errors name the object", "a failed Result without errors");
    // The OSC, or the node file at fault (containerd's config.toml).
    for (const e of errors) if (!e.startsWith(source) && !e.startsWith("/")) fail("errors name the object", JSON.stringify(e));
    return "invalid";
  };
  const bytes = blobBytes(c.osc);
  const parsed = parseOscBytes(bytes, source);
  if (!parsed.ok) return refused(parsed.errors);
  const overlayData = Object.fromEntries(Object.entries(c.overlays).map(([k, b]) => [k, blobBytes(b)]));
  const overlays = parseOverlays(overlayData, source);
  if (!overlays.ok) return refused(overlays.errors);
  const layered = layerOsc(parsed.value, overlays.value, c.labels, source);
  if (!layered.ok) return refused(layered.errors);
  if (probesBeyondLoopback(layered.value.osc)) return "skipped";

  const resolved = await desiredForNode(layered.value.osc, source, {
    files: createFiles(root),
    hostName: c.hostName,
    readSecret: async (name) => {
      const data = c.secrets[name];
      return data ? Object.fromEntries(Object.entries(data).map(([k, b64]) => [k, new Uint8Array(Buffer.from(b64, "base64"))])) : undefined;
    },
    images: stubImages(root),
    log: silent,
  });
  if (!resolved.ok) return refused(resolved.errors);
  const desired = resolved.value;

  const disk = modelOf(root);
  const systemd = new ModelSystemd(disk, new Map(Object.entries(c.node.units)), hostUnits);
  const store = createStateStore(disk);
  const before = (await store.read()).owned;
  const deps = { files: disk, systemd, store, log: silent, selfUnit: agentUnit, now: () => new Date(0) };
  const checksum = layeredChecksum(bytes, layered.value.matched);
  const first = await applyDesired(desired, checksum, bytes, deps);
  checkPlan(first.plan, desired, before, fail);
  let unitFailed = false;
  for (const f of first.failures) {
    // A unit the OSC names that the node does not have fails like on a real node, and is retried.
    const missingUnit = f.step.kind !== "write" && f.step.kind !== "remove" && f.step.kind !== "daemon-reload" && f.error.includes(unitNotFound);
    if (missingUnit) unitFailed = true;
    else fail("validated writes succeed", `${describeStep(f.step)} failed: ${f.error}`);
  }
  if (!first.complete) return unitFailed ? "unit-failed" : "applied";
  await checkConverged(desired, disk, fail);
  const second = await applyDesired(desired, checksum, bytes, deps);
  if (second.plan.steps.length > 0) fail("idempotence", `planning again after a complete apply: ${second.plan.steps.map(describeStep).join(" | ")}`);
  return "applied";
}

type Fail = (property: string, detail: string) => void;

function desiredWrites(desired: Desired): Map<string, { sha256: string; mode: number }> {
  const out = new Map<string, { sha256: string; mode: number }>();
  for (const f of desired.files) out.set(f.path, { sha256: f.sha256, mode: f.mode });
  for (const u of desired.units) {
    if (u.sha256 !== undefined) out.set(unitFilePath(u.name), { sha256: u.sha256, mode: unitFileMode });
    for (const d of u.dropIns) out.set(dropInPath(u.name, d.name), { sha256: d.sha256, mode: unitFileMode });
  }
  return out;
}

function checkPlan(plan: Plan, desired: Desired, owned: Owned, fail: Fail): void {
  if (!v.safeParse(PlanSchema, JSON.parse(JSON.stringify(plan))).success) fail("plan persists", "the plan does not parse back with PlanSchema");
  const writes = desiredWrites(desired);
  const ownedPaths = new Set(Object.keys(owned.files));
  for (const [name, u] of Object.entries(owned.units)) {
    if (u.sha256 !== undefined) ownedPaths.add(unitFilePath(name));
    for (const d of Object.keys(u.dropIns)) ownedPaths.add(dropInPath(name, d));
  }
  const units = new Set([...desired.units.map((u) => u.name), ...Object.keys(owned.units)]);
  const touched = new Set<string>();
  plan.steps.forEach((s: Step, i) => {
    const what = `step ${i + 1} (${describeStep(s)})`;
    if (s.kind === "write" || s.kind === "remove") {
      if (touched.has(s.path)) fail("one step per path", `${what}: the path is touched twice`);
      touched.add(s.path);
    }
    if (s.kind === "write") {
      const want = writes.get(s.path);
      if (!want) fail("steps within desired/owned", `${what}: writes a path that is not desired`);
      else if (want.sha256 !== s.sha256 || want.mode !== s.mode) fail("steps within desired/owned", `${what}: not the desired content or mode`);
    } else if (s.kind === "remove" && s.target.type === "drop-ins") {
      // A whole drop-in directory: only of a unit the OSC gives none, and never with a desired path in it.
      const unit = s.target.unit;
      if (!desired.units.some((u) => u.name === unit && u.dropIns.length === 0)) fail("steps within desired/owned", `${what}: the unit has drop-ins in the OSC, or is not in it`);
      if ([...writes.keys(), ...desired.keep].some((p) => p.startsWith(`${s.path}/`))) fail("steps within desired/owned", `${what}: removes a desired path`);
    } else if (s.kind === "remove") {
      if (!ownedPaths.has(s.path)) fail("steps within desired/owned", `${what}: removes a path trellis does not own`);
      if (writes.has(s.path) || desired.keep.includes(s.path)) fail("steps within desired/owned", `${what}: removes a desired path`);
    } else if (s.kind !== "daemon-reload") {
      if (!units.has(s.unit)) fail("steps within desired/owned", `${what}: a unit neither desired nor owned`);
      if (s.unit === agentUnit && (s.kind === "stop" || s.kind === "disable")) fail("the agent keeps running", `${what}`);
      if (s.unit === agentUnit && s.kind === "restart" && i !== plan.steps.length - 1) fail("the agent restarts last", `${what}`);
    }
  });
  if (plan.steps.filter((s) => s.kind === "daemon-reload").length > 1) fail("one daemon-reload", "more than one daemon-reload");
}

async function checkConverged(desired: Desired, disk: ModelDisk, fail: Fail): Promise<void> {
  for (const [path, want] of desiredWrites(desired)) {
    const st = await disk.stat(path);
    const sha256 = await disk.sha256(path);
    if (sha256 !== want.sha256 || st?.mode !== want.mode) {
      fail("the node converges", `${path}: ${sha256 === undefined ? "missing" : `sha256 ${sha256.slice(0, 12)} mode 0${st?.mode.toString(8)}`} after a complete apply, want ${want.sha256.slice(0, 12)} mode 0${want.mode.toString(8)}`);
    }
  }
}

// A registry's readiness probe connects to its hosts: a case whose probe would leave the machine is not
// run. Its CA files are read through Files, within the case's root: any caCerts path may run.
function probesBeyondLoopback(osc: OperatingSystemConfig): boolean {
  for (const r of osc.spec.criConfig?.containerd?.registries ?? []) {
    if (r.readinessProbe !== true) continue;
    for (const h of r.hosts ?? []) {
      let url: URL;
      try {
        url = new URL(`${h.url.replace(/\/+$/, "")}/v2/`);
      } catch {
        continue;
      }
      if ((url.protocol === "http:" || url.protocol === "https:") && url.hostname !== "127.0.0.1") return true;
    }
  }
  return false;
}

/** Images with "missing" in their name are not in the registry; the others extract to a hash of their name. */
function stubImages(root: string): ImageStore {
  return {
    async extract(req) {
      if (req.image.includes("missing")) throw new ImageError(req.image, req.filePathInImage, "manifest unknown");
      const sha256 = sha256Hex(`${req.image}\0${req.filePathInImage}`);
      const blobPath = join(root, paths.imageCache, "blobs", "sha256", sha256);
      return { ...req, manifestDigest: `sha256:${sha256}`, sha256, size: 1, blobPath, pulled: false };
    },
    async prune() {},
  };
}

// The case's node as real files under `root`; an entry that collides with an earlier one is left out,
// and the model is then read from the directory, so both agree whatever the case says.
function materialise(c: FuzzCase, root: string, fifo: string): void {
  mkdirSync(root, { recursive: true });
  const at = (p: string) => join(root, p);
  for (const e of c.node.entries) {
    try {
      mkdirSync(dirname(at(e.path)), { recursive: true, mode: 0o755 });
      if (e.kind === "file") {
        writeFileSync(at(e.path), e.content, { flag: "wx" }); // never opens the FIFO
        chmodSync(at(e.path), e.mode);
      }      else if (e.kind === "dir") mkdirSync(at(e.path), { recursive: true, mode: 0o755 });
      else if (e.kind === "symlink") symlinkSync(e.target, at(e.path));
      else linkSync(fifo, at(e.path));
    } catch {
      // Collides with an earlier entry (a file where a directory is needed, or the reverse).
    }
  }
  mkdirSync(dirname(at(statePath)), { recursive: true, mode: 0o755 });
  writeFileSync(at(statePath), JSON.stringify({ version: 1, owned: c.node.owned }), { mode: 0o600 });
}

function modelOf(root: string): ModelDisk {
  const disk = new ModelDisk();
  const walk = (host: string, node: string) => {
    for (const name of readdirSync(host)) {
      const h = join(host, name);
      const p = `${node}/${name}`;
      const st = lstatSync(h);
      let entry: Entry;
      if (st.isDirectory()) entry = { kind: "dir" };
      else if (st.isSymbolicLink()) entry = { kind: "symlink", target: readlinkSync(h) };
      else if (st.isFile()) {
        const bytes = new Uint8Array(readFileSync(h));
        entry = { kind: "file", sha256: sha256Hex(bytes), mode: st.mode & 0o7777, bytes };
      } else entry = { kind: "other" };
      disk.entries.set(p, entry);
      if (entry.kind === "dir") walk(h, p);
    }
  };
  walk(root, "");
  return disk;
}
