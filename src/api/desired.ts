// From an OperatingSystemConfig to the node's desired state: spec and status merged the way
// gardener-node-agent merges them, files for other hosts dropped, every content decoded and hashed,
// and every rule a node depends on checked. A problem — what would be unsafe to apply, or what
// gardener-node-agent refuses too — is reported with the object and field it concerns, and then nothing
// at all is applied: a half-understood config must not reach the node. What gardener-node-agent accepts
// but trellis, or systemd, does not act on as written (an entry a later one replaces, a drop-in systemd
// does not read) is applied as gardener-node-agent applies it, and said (`unsupported`).
import { createHash } from "node:crypto";
import { decodeBase64 } from "./base64.ts";
import { type Decoded, decodeGardener } from "./gardener-decode.ts";
import { baseLayer, fileEntry, type Provenance, unitEntry } from "./layers.ts";
import { type OperatingSystemConfig, OperatingSystemConfigSchema, type OscFile, type OscUnit } from "./osc.ts";
import { dropInPath, nodePathProblem, unitFilePath, writablePathProblem } from "./paths.ts";
import type { Result } from "./result.ts";
import { decodeYamlBytes } from "./yaml.ts";

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
  /**
   * Parts of the OSC that are not acted on as written (a field trellis does not know, an entry a later
   * one replaces, a drop-in systemd does not read): applied around, and reported (a Warning event, the
   * Node condition, a metric, `trellis plan`).
   */
  unsupported: string[];
  /** Paths the OSC still declares but that are not written this time: left as they are, never removed. */
  keep: string[];
};


/** Gardener's default for files without permissions. */
export const defaultFileMode = 0o600;
/** Larger inline or secret content is refused: a node config file is never this big, an accident often is. */
export const maxFileBytes = 4 * 1024 * 1024;

const unitName = /^[A-Za-z0-9:_.\\@-]{1,250}\.(service|socket|device|mount|automount|swap|target|path|timer|slice|scope)$/;

export const sha256Hex = (data: Uint8Array | string): string => createHash("sha256").update(data).digest("hex");

/**
 * Gardener's checksum of an OSC (gardenlet's checksum/data-script, the Node's checksum/cloud-config-data):
 * SHA-256 of osc.yaml's bytes as the Secret holds them. Bytes only: a decoded text would lose a BOM or
 * replace bytes that are not UTF-8, and name another OSC.
 */
export const oscChecksum = (oscYaml: Uint8Array): string => sha256Hex(oscYaml);

/** Parses osc.yaml as the Secret holds it: bytes within the size cap, UTF-8, then YAML (parseOsc). */
export function parseOscBytes(bytes: Uint8Array, source: string): Decoded<OperatingSystemConfig> {
  const text = decodeYamlBytes(bytes, source);
  return text.ok ? parseOsc(text.value, source) : text;
}

/** Parses osc.yaml; errors name the source and field; `ignored` says what it holds that is not read (keys Gardener's type does not have). */
export function parseOsc(text: string, source: string): Decoded<OperatingSystemConfig> {
  return decodeGardener(OperatingSystemConfigSchema, "OperatingSystemConfig", text, source);
}

type FileEntry = { file: OscFile; list: "spec.files" | "status.extensionFiles"; index: number };

/**
 * The OSC's files for this host, spec's then status's as gardener-node-agent lists them, each with the
 * later entry of its path that replaces it, if any: gardener-node-agent writes the entries of one path
 * in turn, so the last one is what the node keeps.
 */
function fileEntries(osc: OperatingSystemConfig, hostName: string): (FileEntry & { replacedBy?: FileEntry })[] {
  const lists = [
    ["spec.files", osc.spec.files ?? []],
    ["status.extensionFiles", osc.status?.extensionFiles ?? []],
  ] as const;
  const all = lists.flatMap(([list, files]) => files.map((file, index): FileEntry => ({ file, list, index }))).filter((e) => e.file.hostName == null || e.file.hostName === hostName);
  const last = new Map(all.map((e) => [e.file.path, e]));
  return all.map((e) => {
    const winner = last.get(e.file.path);
    return winner === e ? e : { ...e, replacedBy: winner };
  });
}

const filesOf = (osc: OperatingSystemConfig, hostName: string) => fileEntries(osc, hostName).flatMap((e) => (e.replacedBy ? [] : [e.file]));

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
  const whereOf = (e: FileEntry) => `${e.list}[${e.index}] (${shown(e.file.path)})${layer(fileEntry(e.file.path))}`;
  for (const e of fileEntries(osc, ctx.hostName)) {
    const f = e.file;
    const where = whereOf(e);
    if (e.replacedBy) {
      unsupported.push(`${ctx.source}: ${where}: not written: ${whereOf(e.replacedBy)} has the same path and comes later, and the later entry is what the node keeps (gardener-node-agent writes both, in this order)`);
      continue;
    }
    const problem = writablePathProblem(f.path);
    if (problem) fail(where, `path ${problem}`);
    // Decoded even when the path is wrong, so that every problem is reported at once.
    const content = decodeContent(f, ctx, (field, msg) => fail(`${where}.content.${field}`, msg));
    if (content && !problem) {
      const sha256 = content instanceof Uint8Array ? sha256Hex(content) : content.sha256;
      files.push({ path: f.path, mode: f.permissions ?? defaultFileMode, content, sha256, origin: where });
    }
  }

  const units = mergeUnits(osc.spec.units ?? [], osc.status?.extensionUnits ?? [], (msg) => unsupported.push(`${ctx.source}: ${msg}`));
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
    for (const d of u.dropIns) {
      const dropIn = `${where}.dropIns[${d.name}]`;
      const path = dropInPath(u.name, d.name);
      // gardener-node-agent joins the name to the unit's .d directory: one that leaves it, or names no file, is refused.
      const problem = d.name.includes("/") ? "contains /" : nodePathProblem(path);
      if (problem) fail(dropIn, `name must be a file name in ${u.name}.d: ${problem}`);
      else managedPaths.set(path, dropIn);
      if (!problem && !d.name.endsWith(".conf")) unsupported.push(`${ctx.source}: ${dropIn}: written as gardener-node-agent writes it, but systemd reads only drop-ins whose name ends in .conf: not acted on by systemd`);
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

// systemd reads unit files as text: a NUL byte ends what it sees, and a file this large is a mistake.
function checkUnitText(text: string, fail: (msg: string) => void): void {
  if (text.includes("\0")) fail("contains a NUL byte");
  const bytes = new TextEncoder().encode(text).byteLength;
  if (bytes > maxFileBytes) fail(`is ${bytes} bytes, more than the limit of ${maxFileBytes}`);
}

// Units merged by name as gardener-node-agent merges them (spec's, then status's, in order; a name
// given twice in one list too): later entries override enable, command and content, and append drop-ins
// and filePaths. gardener-node-agent writes a unit's drop-ins in turn: of two with one name, the later one
// is what the node keeps. `note`: what is merged or replaced, to be reported.
function mergeUnits(spec: OscUnit[], status: OscUnit[], note: (msg: string) => void): DesiredUnit[] {
  // Each unit as merged so far, the entries it was merged from, and the entry each drop-in came from.
  type Merged = { unit: DesiredUnit; entries: string[]; dropIns: Map<string, { dropIn: DesiredDropIn; entry: string }> };
  const merged = new Map<string, Merged>();
  for (const [list, units] of [["spec.units", spec], ["status.extensionUnits", status]] as const) {
    units.forEach((u, i) => {
      const entry = `${list}[${i}]`;
      const m: Merged = merged.get(u.name) ?? { unit: { name: u.name, enable: true, dropIns: [], filePaths: [] }, entries: [], dropIns: new Map() };
      const sameList = m.entries.filter((e) => e.startsWith(`${list}[`));
      if (sameList.length > 0) note(`${entry} (${u.name}): the unit is in ${sameList.join(", ")} too: merged into it as gardener-node-agent merges status.extensionUnits into spec.units (the later enable, command and content win; drop-ins and filePaths are added)`);
      m.entries.push(entry);
      (u.dropIns ?? []).forEach((d, j) => {
        const earlier = m.dropIns.get(d.name);
        if (earlier) note(`unit ${u.name}.dropIns[${d.name}]: ${earlier.entry} is not written: ${entry}.dropIns[${j}] has the same name and comes later, and the later one is what the node keeps (gardener-node-agent writes both, in this order)`);
        m.dropIns.set(d.name, { dropIn: { name: d.name, content: d.content, sha256: sha256Hex(d.content) }, entry: `${entry}.dropIns[${j}]` });
      });
      const content = u.content ?? m.unit.content;
      const command = u.command ?? m.unit.command;
      m.unit = {
        name: u.name,
        ...(content !== undefined ? { content, sha256: sha256Hex(content) } : {}),
        enable: u.enable ?? m.unit.enable,
        ...(command ? { command } : {}),
        dropIns: [...m.dropIns.values()].map((x) => x.dropIn),
        filePaths: [...new Set([...m.unit.filePaths, ...(u.filePaths ?? [])])],
      };
      merged.set(u.name, m);
    });
  }
  return [...merged.values()].map((m) => m.unit);
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
