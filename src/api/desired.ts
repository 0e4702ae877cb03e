// From an OperatingSystemConfig to the node's desired state: spec and status merged the way
// gardener-node-agent merges them, files for other hosts dropped, every content decoded and hashed,
// and every rule a node depends on checked. Any problem is reported with the object and field it
// concerns, and then nothing at all is applied: a half-understood config must not reach the node.
import { createHash } from "node:crypto";
import * as v from "valibot";
import { decodeBase64 } from "./base64.ts";
import { baseLayer, fileEntry, type Provenance, unitEntry } from "./layers.ts";
import { formatIssues } from "./issues.ts";
import { type OperatingSystemConfig, OperatingSystemConfigSchema, type OscFile, type OscUnit } from "./osc.ts";
import { dropInPath, nodePathProblem, unitFilePath, writablePathProblem } from "./paths.ts";
import type { Result } from "./result.ts";
import { decodeYamlBytes, parseYaml } from "./yaml.ts";

export type UnitCommand = "start" | "restart" | "stop";
/** A file extracted from an image into the agent's cache: copied from there, verified by its hash. */
export type CachedContent = { copyFrom: string; sha256: string };
export type DesiredFile = { path: string; mode: number; content: Uint8Array | CachedContent; sha256: string; origin: string };
export type DesiredDropIn = { name: string; content: string; sha256: string };
export type DesiredUnit = {
  name: string;
  /** Unit file text; absent for a unit that exists on the host (trellis then manages only drop-ins and state). */
  content?: string;
  sha256?: string;
  enable: boolean;
  command?: UnitCommand;
  dropIns: DesiredDropIn[];
  filePaths: string[];
};
export type Desired = {
  units: DesiredUnit[];
  files: DesiredFile[];
  /** Parts of the OSC trellis cannot apply; applied around, and reported. */
  unsupported: string[];
  /** Paths the OSC still declares but that are not written this time: left as they are, never removed. */
  keep: string[];
};


/** Gardener's default for files without permissions. */
export const defaultFileMode = 0o600;
/** Larger inline or secret content is refused: a node config file is never this big, an accident often is. */
export const maxFileBytes = 4 * 1024 * 1024;

const unitName = /^[A-Za-z0-9:_.\\@-]{1,250}\.(service|socket|device|mount|automount|swap|target|path|timer|slice|scope)$/;
const dropInName = /^[^/\0]+\.conf$/;

export const sha256Hex = (data: Uint8Array | string): string => createHash("sha256").update(data).digest("hex");

/**
 * Gardener's checksum of an OSC (gardenlet's checksum/data-script, the Node's checksum/cloud-config-data):
 * SHA-256 of osc.yaml's bytes as the Secret holds them. Bytes only: a decoded text would lose a BOM or
 * replace bytes that are not UTF-8, and name another OSC.
 */
export const oscChecksum = (oscYaml: Uint8Array): string => sha256Hex(oscYaml);

/** Parses osc.yaml; errors name the source and field. */
/** Parses osc.yaml as the Secret holds it: bytes within the size cap, UTF-8, then YAML (parseOsc). */
export function parseOscBytes(bytes: Uint8Array, source: string): Result<OperatingSystemConfig> {
  const text = decodeYamlBytes(bytes, source);
  return text.ok ? parseOsc(text.value, source) : text;
}

export function parseOsc(text: string, source: string): Result<OperatingSystemConfig> {
  const doc = parseYaml(text, source);
  if (!doc.ok) return doc;
  const r = v.safeParse(OperatingSystemConfigSchema, doc.value);
  return r.success ? { ok: true, value: r.output } : { ok: false, errors: formatIssues(r.issues).map((e) => `${source}: ${e}`) };
}

const filesOf = (osc: OperatingSystemConfig, hostName: string) =>
  [...(osc.spec.files ?? []), ...(osc.status?.extensionFiles ?? [])].filter((f) => f.hostName == null || f.hostName === hostName);

/** The Secrets (kube-system) that the OSC's files for this host reference, to be fetched before resolveDesired. */
export function secretRefsOf(osc: OperatingSystemConfig, hostName: string): string[] {
  return [...new Set(filesOf(osc, hostName).flatMap((f) => (f.content.secretRef ? [f.content.secretRef.name] : [])))];
}

export type ImageFileRef = { image: string; filePathInImage: string };
export const imageKey = (ref: ImageFileRef): string => `${ref.image}\0${ref.filePathInImage}`;

/** The image files the OSC's files for this host reference, to be extracted before resolveDesired. */
export function imageRefsOf(osc: OperatingSystemConfig, hostName: string): ImageFileRef[] {
  const refs = new Map<string, ImageFileRef>();
  for (const f of filesOf(osc, hostName)) {
    const r = f.content.imageRef;
    if (r) refs.set(imageKey(r), { image: r.image, filePathInImage: r.filePathInImage });
  }
  return [...refs.values()];
}

/** An image file in the agent's cache, or why it could not be had (the registry's or the verifier's words). */
export type ImageFileResult = { ok: true; content: CachedContent; size: number } | { ok: false; error: string };

export type ResolveContext = {
  hostName: string;
  /** data of kube-system Secrets by name (undefined: the Secret does not exist). */
  secrets: ReadonlyMap<string, Readonly<Record<string, Uint8Array>> | undefined>;
  /** Extracted image files by imageKey. */
  images: ReadonlyMap<string, ImageFileResult>;
  source: string;
  /** Where each entry came from when the Secret has overlays (layers.ts): an error names the overlay. */
  provenance?: Provenance;
};

// A path of thousands of bytes would push the problem itself out of a Warning event (1 kB).
const shown = (path: string) => (path.length > 160 ? `${path.slice(0, 150)}…` : path);

export function resolveDesired(osc: OperatingSystemConfig, ctx: ResolveContext): Result<Desired> {
  const errors: string[] = [];
  const unsupported: string[] = [];
  const keep: string[] = [];
  const fail = (where: string, msg: string) => errors.push(`${ctx.source}: ${where}: ${msg}`);
  const layer = (entry: string) => {
    const from = ctx.provenance?.get(entry);
    return from && from !== baseLayer ? ` in ${from}` : "";
  };

  const files: DesiredFile[] = [];
  const fileOrigins = new Map<string, string>();
  const fileLists: [string, OscFile[]][] = [
    ["spec.files", osc.spec.files ?? []],
    ["status.extensionFiles", osc.status?.extensionFiles ?? []],
  ];
  for (const [list, entries] of fileLists) {
    entries.forEach((f, i) => {
      const where = `${list}[${i}] (${shown(f.path)})${layer(fileEntry(f.path))}`;
      if (f.hostName != null && f.hostName !== ctx.hostName) return;
      const problem = writablePathProblem(f.path);
      const earlier = fileOrigins.get(f.path);
      if (problem) fail(where, `path ${problem}`);
      else if (earlier) fail(where, `duplicate path, also in ${earlier}`);
      else fileOrigins.set(f.path, where);
      // Decoded even when the path is wrong, so that every problem is reported at once.
      const content = decodeContent(f, ctx, (field, msg) => fail(`${where}.content.${field}`, msg));
      if (content && !problem && !earlier) {
        const sha256 = content instanceof Uint8Array ? sha256Hex(content) : content.sha256;
        files.push({ path: f.path, mode: f.permissions ?? defaultFileMode, content, sha256, origin: where });
      }
    });
  }

  const units = mergeUnits(osc.spec.units ?? [], osc.status?.extensionUnits ?? [], fail);
  const managedPaths = new Map<string, string>();
  for (const u of units) {
    const where = `unit ${u.name}${layer(unitEntry(u.name))}`;
    if (!unitName.test(u.name)) {
      fail(where, "name must be a systemd unit name like kubelet.service (letters, digits, :_.\\@-, a unit type suffix, no /)");
      continue;
    }
    if (u.content !== undefined) {
      checkUnitText(u.content, (msg) => fail(`${where}.content`, msg));
      managedPaths.set(unitFilePath(u.name), where);
    }
    const seen = new Set<string>();
    for (const d of u.dropIns) {
      const dropIn = `${where}.dropIns[${d.name}]`;
      if (!dropInName.test(d.name) || d.name.includes("..")) fail(dropIn, "name must be a file name ending in .conf, without /");
      else if (seen.has(d.name)) fail(dropIn, "duplicate drop-in name");
      else managedPaths.set(dropInPath(u.name, d.name), dropIn);
      seen.add(d.name);
      checkUnitText(d.content, (msg) => fail(`${dropIn}.content`, msg));
    }
    for (const p of u.filePaths) {
      const problem = nodePathProblem(p);
      if (problem) fail(`${where}.filePaths (${shown(p)})`, `path ${problem}`);
    }
  }
  for (const f of files) {
    const owner = managedPaths.get(f.path);
    if (owner) fail(f.origin, `path is also written by ${owner}`);
  }
  return errors.length ? { ok: false, errors } : { ok: true, value: { units, files, unsupported, keep } };
}

type Fail = (where: string, msg: string) => void;

// systemd reads unit files as text: a NUL byte ends what it sees, and a file this large is a mistake.
function checkUnitText(text: string, fail: (msg: string) => void): void {
  if (text.includes("\0")) fail("contains a NUL byte");
  const bytes = new TextEncoder().encode(text).byteLength;
  if (bytes > maxFileBytes) fail(`is ${bytes} bytes, more than the limit of ${maxFileBytes}`);
}

// Units merged by name as gardener-node-agent does: later entries override enable, command and
// content, and append drop-ins and filePaths. Duplicates within one list are a mistake, not a merge.
function mergeUnits(spec: OscUnit[], status: OscUnit[], fail: Fail): DesiredUnit[] {
  const out = new Map<string, DesiredUnit>();
  for (const [list, entries] of [["spec.units", spec], ["status.extensionUnits", status]] as const) {
    const names = new Set<string>();
    entries.forEach((u, i) => {
      if (names.has(u.name)) fail(`${list}[${i}] (${u.name})`, "duplicate unit name");
      names.add(u.name);
      const prev = out.get(u.name);
      const dropIns = (u.dropIns ?? []).map((d) => ({ name: d.name, content: d.content, sha256: sha256Hex(d.content) }));
      const content = u.content ?? prev?.content;
      const command = u.command ?? prev?.command;
      out.set(u.name, {
        name: u.name,
        ...(content !== undefined ? { content, sha256: sha256Hex(content) } : {}),
        enable: u.enable ?? prev?.enable ?? true,
        ...(command ? { command } : {}),
        dropIns: [...(prev?.dropIns ?? []), ...dropIns],
        filePaths: [...new Set([...(prev?.filePaths ?? []), ...(u.filePaths ?? [])])],
      });
    });
  }
  return [...out.values()];
}

function decodeContent(f: OscFile, ctx: ResolveContext, fail: (field: string, msg: string) => void): Uint8Array | CachedContent | undefined {
  const { inline, secretRef, imageRef } = f.content;
  const given = [inline && "inline", secretRef && "secretRef", imageRef && "imageRef"].filter(Boolean);
  if (given.length !== 1) {
    fail(given.length ? given.join("+") : "inline", `exactly one of inline, secretRef, imageRef is required (got ${given.length ? given.join(", ") : "none"})`);
    return undefined;
  }
  if (imageRef) {
    const got = ctx.images.get(imageKey(imageRef));
    if (!got) fail("imageRef", `${imageRef.image} (${imageRef.filePathInImage}) was not fetched`);
    else if (!got.ok) fail("imageRef", got.error);
    return got?.ok ? got.content : undefined;
  }
  let data: Uint8Array | undefined;
  if (inline) data = decodeInline(inline.encoding, inline.data, fail);
  else if (secretRef) {
    const secret = ctx.secrets.get(secretRef.name);
    if (!secret) fail("secretRef", `secret kube-system/${secretRef.name} not found`);
    else if (!Object.hasOwn(secret, secretRef.dataKey)) fail("secretRef", `secret kube-system/${secretRef.name} has no key "${secretRef.dataKey}"`);
    else data = secret[secretRef.dataKey];
  }
  if (data && data.byteLength > maxFileBytes) {
    fail(inline ? "inline.data" : "secretRef", `content is ${data.byteLength} bytes, more than the limit of ${maxFileBytes}`);
    return undefined;
  }
  return data;
}

export function decodeInline(encoding: string, data: string, fail: (field: string, msg: string) => void): Uint8Array | undefined {
  switch (encoding) {
    case "":
    case "plain":
      return new TextEncoder().encode(data);
    case "b64":
    case "base64": {
      const bytes = decodeBase64(data);
      if (!bytes) fail("inline.data", `not valid base64 (encoding "${encoding}")`);
      return bytes;
    }
    default:
      fail("inline.encoding", `unknown encoding "${encoding}" (use "", "plain", "b64" or "base64")`);
      return undefined;
  }
}
