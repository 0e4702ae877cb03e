// One layer, streamed: the compressed bytes are hashed as they arrive, decompressed (gzip, zstd or none,
// told apart by their magic bytes as containerd's DecompressStream does, so a mislabelled layer still
// reads), and scanned as a tar for one path. Nothing is buffered beyond a tar header and the chunk in
// flight; the file's content goes to a sink (a temp file) as it passes. The verdict only counts once the
// whole blob hashed to its digest — until then the caller must treat the sink's content as untrusted.
//
// Tar: ustar/POSIX (prefix field), GNU (long names and link names as 'L'/'K' entries, base-256 sizes) and
// PAX ('x' records path, linkpath, size). Global PAX headers ('g') are read past and ignored: the
// image builders in use never put a path in them. Whiteouts follow the OCI image spec: `.wh.<name>` hides
// <name> (and everything under it) in the layers below, `.wh..wh..opq` hides everything below in its
// directory; both apply to lower layers only, so an entry for the path in the same layer wins.
import { createHash } from "node:crypto";
import type { Transform } from "node:stream";
import { createGunzip, createZstdDecompress } from "node:zlib";
import { ContentError, explain, TransferError } from "./errors.ts";

const block = 512;
/** PAX and GNU long-name entries are read into memory; real ones are a few hundred bytes. */
const maxMetaBytes = 1 << 20;

export type EntryType = "file" | "hardlink" | "symlink" | "directory" | "char-device" | "block-device" | "fifo" | "sparse" | `type '${string}'`;

export type LayerVerdict =
  /** The path is a regular file in this layer; its content went to the sink. */
  | { kind: "file"; size: number; mode: number }
  /** The path is a hard link to `linkTarget`, an earlier entry of this layer. */
  | { kind: "hardlink"; linkTarget: string }
  | { kind: "symlink"; linkTarget: string }
  | { kind: "directory" }
  | { kind: "special"; type: EntryType }
  /** A parent directory of the path is something else in this layer (a symlink, a file). */
  | { kind: "blocked"; parent: string; type: EntryType; linkTarget?: string }
  /** A whiteout in this layer hides the path (the whiteout entry's name). */
  | { kind: "deleted"; whiteout: string }
  /** This layer says nothing about the path: look in the one below. */
  | { kind: "absent" };

/** Where the content of the path goes. begin() starts over: a later entry for the same path wins. */
export interface FileSink {
  begin(size: number): Promise<void>;
  write(chunk: Uint8Array): Promise<void>;
}

/** "./a//b/" → "a/b"; ".." is kept (such names never match a normalised target). */
export function normaliseEntryName(name: string): string {
  return name
    .split("/")
    .filter((s) => s !== "" && s !== ".")
    .join("/");
}

const decoder = new TextDecoder();
function cString(b: Uint8Array): string {
  const nul = b.indexOf(0);
  return decoder.decode(nul < 0 ? b : b.subarray(0, nul));
}

/** A tar numeric field: octal text, or GNU/star base-256 when the high bit of the first byte is set. */
export function parseNumeric(b: Uint8Array, field: string): number {
  const first = b[0] ?? 0;
  if (first & 0x80) {
    if (first & 0x40) throw new ContentError(`tar header: negative ${field}`);
    let v = first & 0x3f;
    for (let i = 1; i < b.length; i++) v = v * 256 + (b[i] as number);
    if (!Number.isSafeInteger(v)) throw new ContentError(`tar header: ${field} too large`);
    return v;
  }
  const text = cString(b).trim();
  if (text === "") return 0;
  if (!/^[0-7]+$/.test(text)) throw new ContentError(`tar header: ${field} is not octal: ${JSON.stringify(text)}`);
  return parseInt(text, 8);
}

function checksumOk(h: Uint8Array): boolean {
  const stored = parseNumeric(h.subarray(148, 156), "checksum");
  let unsigned = 0;
  let signed = 0;
  for (let i = 0; i < block; i++) {
    const b = i >= 148 && i < 156 ? 0x20 : (h[i] as number);
    unsigned += b;
    signed += b > 127 ? b - 256 : b;
  }
  return stored === unsigned || stored === signed; // some old tars summed signed bytes
}

function entryType(flag: string): EntryType {
  switch (flag) {
    case "0":
    case "\0":
    case "7": // contiguous file: a regular file everywhere but on one historic system
      return "file";
    case "1":
      return "hardlink";
    case "2":
      return "symlink";
    case "3":
      return "char-device";
    case "4":
      return "block-device";
    case "5":
      return "directory";
    case "6":
      return "fifo";
    case "S":
      return "sparse";
    default:
      return `type '${flag}'`;
  }
}

/** PAX extended header records: "<len> <key>=<value>\n", len counting the whole record. */
export function parsePax(data: Uint8Array): Record<string, string> {
  const out: Record<string, string> = {};
  let i = 0;
  while (i < data.length) {
    const space = data.indexOf(0x20, i);
    if (space < 0) break;
    const len = Number(decoder.decode(data.subarray(i, space)));
    if (!Number.isInteger(len) || len <= space - i || i + len > data.length) throw new ContentError("tar: malformed PAX record");
    const record = decoder.decode(data.subarray(space + 1, i + len - 1)); // without the trailing "\n"
    const eq = record.indexOf("=");
    if (eq < 0) throw new ContentError("tar: malformed PAX record");
    out[record.slice(0, eq)] = record.slice(eq + 1);
    i += len;
  }
  return out;
}

/**
 * Scans a tar stream pushed chunk by chunk for `target` (normalised, relative: "etc/app/config").
 * push() may be awaited chunk by chunk; end() returns what this layer says about the path.
 */
export class TarScanner {
  private readonly header = new Uint8Array(block);
  private headerFill = 0;
  private state: "header" | "data" | "meta" | "padding" | "end" = "header";
  private remaining = 0;
  private padding = 0;
  private offset = 0;
  private toSink = false;
  private meta: { flag: string; chunks: Uint8Array[] } | undefined;
  private next: { path?: string; linkpath?: string; size?: number } = {};

  private found: LayerVerdict | undefined;
  private readonly parents = new Map<string, { type: EntryType; linkTarget: string }>();
  private hiddenBy: string | undefined;

  constructor(
    readonly target: string,
    private readonly sink: FileSink,
    private readonly maxFileBytes: number,
  ) {}

  async push(chunk: Uint8Array): Promise<void> {
    let i = 0;
    while (i < chunk.length && this.state !== "end") {
      const avail = chunk.length - i;
      if (this.state === "header") {
        const n = Math.min(block - this.headerFill, avail);
        this.header.set(chunk.subarray(i, i + n), this.headerFill);
        this.headerFill += n;
        i += n;
        if (this.headerFill === block) {
          this.headerFill = 0;
          await this.onHeader();
          this.offset += block;
        }
        continue;
      }
      const n = Math.min(this.state === "padding" ? this.padding : this.remaining, avail);
      const part = chunk.subarray(i, i + n);
      i += n;
      this.offset += n;
      if (this.state === "padding") {
        this.padding -= n;
        if (this.padding === 0) this.state = "header";
        continue;
      }
      this.remaining -= n;
      if (this.state === "data" && this.toSink) await this.sink.write(part);
      if (this.state === "meta") this.meta?.chunks.push(part.slice());
      if (this.remaining === 0) {
        if (this.state === "meta") this.finishMeta();
        this.toSink = false;
        this.state = this.padding > 0 ? "padding" : "header";
      }
    }
  }

  /** The verdict; throws ContentError when the stream stopped inside an entry. */
  end(): LayerVerdict {
    if (this.state !== "header" && this.state !== "end") throw new ContentError(`tar stream truncated inside an entry (at byte ${this.offset})`);
    if (this.state === "header" && this.headerFill > 0) throw new ContentError(`tar stream truncated inside a header (at byte ${this.offset})`);
    if (this.found) return this.found;
    // Shortest parent first: the one nearest the root is what a lookup would meet first.
    const parents = [...this.parents.entries()].sort((a, b) => a[0].length - b[0].length);
    for (const [parent, p] of parents) {
      if (p.type !== "directory") return { kind: "blocked", parent, type: p.type, ...(p.type === "symlink" || p.type === "hardlink" ? { linkTarget: p.linkTarget } : {}) };
    }
    if (this.hiddenBy !== undefined) return { kind: "deleted", whiteout: this.hiddenBy };
    return { kind: "absent" };
  }

  private async onHeader(): Promise<void> {
    const h = this.header;
    if (h.every((b) => b === 0)) {
      this.state = "end"; // end-of-archive marker; anything after it is padding
      return;
    }
    if (!checksumOk(h)) throw new ContentError(`tar header checksum mismatch at byte ${this.offset}: not a tar archive, or corrupt`);
    const flag = String.fromCharCode(h[156] as number);
    const size = this.next.size ?? parseNumeric(h.subarray(124, 136), "size");

    if (flag === "L" || flag === "K" || flag === "x" || flag === "g") {
      if (size > maxMetaBytes) throw new ContentError(`tar: ${flag} entry of ${size} bytes at byte ${this.offset} is implausibly large`);
      this.meta = { flag, chunks: [] };
      this.remaining = size;
      this.padding = (block - (size % block)) % block;
      if (size === 0) this.finishMeta();
      this.state = size > 0 ? "meta" : this.padding > 0 ? "padding" : "header";
      return;
    }

    const magic = decoder.decode(h.subarray(257, 263));
    const posix = magic === "ustar\0";
    const rawName = cString(h.subarray(0, 100));
    const prefix = posix ? cString(h.subarray(345, 500)) : "";
    const name = normaliseEntryName(this.next.path ?? (prefix ? `${prefix}/${rawName}` : rawName));
    const linkTarget = this.next.linkpath ?? cString(h.subarray(157, 257));
    const mode = parseNumeric(h.subarray(100, 108), "mode") & 0o7777;
    this.next = {};
    const type = entryType(flag);
    // As Go's archive/tar: these types carry no data whatever their size field says.
    const dataSize = type === "hardlink" || type === "symlink" || type === "directory" || type === "char-device" || type === "block-device" || type === "fifo" ? 0 : size;

    await this.classify(name, type, linkTarget, dataSize, mode);
    this.remaining = dataSize;
    this.padding = (block - (dataSize % block)) % block;
    this.state = dataSize > 0 ? "data" : this.padding > 0 ? "padding" : "header";
  }

  private async classify(name: string, type: EntryType, linkTarget: string, size: number, mode: number): Promise<void> {
    const t = this.target;
    if (name === t) {
      if (type === "file") {
        if (size > this.maxFileBytes) throw new ContentError(`${t} is ${size} bytes, more than the limit of ${this.maxFileBytes} bytes`);
        await this.sink.begin(size);
        this.toSink = true;
        this.found = { kind: "file", size, mode };
      } else if (type === "hardlink") {
        this.found = { kind: "hardlink", linkTarget: normaliseEntryName(linkTarget) };
      } else if (type === "symlink") {
        this.found = { kind: "symlink", linkTarget };
      } else if (type === "directory") {
        this.found = { kind: "directory" };
      } else {
        this.found = { kind: "special", type };
      }
      return;
    }
    if (t.startsWith(`${name}/`)) {
      this.parents.set(name, { type, linkTarget });
      return;
    }
    const slash = name.lastIndexOf("/");
    const dir = slash < 0 ? "" : name.slice(0, slash);
    const base = name.slice(slash + 1);
    if (!base.startsWith(".wh.")) return;
    const under = (d: string) => d === "" || t.startsWith(`${d}/`);
    if (base === ".wh..wh..opq") {
      if (under(dir)) this.hiddenBy ??= name;
    } else if (!base.startsWith(".wh..wh.")) {
      // ".wh..wh.*" other than .opq are aufs bookkeeping (hard link dirs), not whiteouts.
      const hidden = dir === "" ? base.slice(4) : `${dir}/${base.slice(4)}`;
      if (hidden === t || t.startsWith(`${hidden}/`)) this.hiddenBy ??= name;
    }
  }

  private finishMeta(): void {
    const meta = this.meta;
    this.meta = undefined;
    if (!meta) return;
    const data = Buffer.concat(meta.chunks);
    if (meta.flag === "L") this.next.path = cString(data);
    else if (meta.flag === "K") this.next.linkpath = cString(data);
    else if (meta.flag === "x") {
      const records = parsePax(data);
      if (records.path !== undefined) this.next.path = records.path;
      if (records.linkpath !== undefined) this.next.linkpath = records.linkpath;
      if (records.size !== undefined) {
        const size = Number(records.size);
        if (!Number.isSafeInteger(size) || size < 0) throw new ContentError(`tar: PAX size ${JSON.stringify(records.size)} is not a size`);
        this.next.size = size;
      }
    }
  }
}

export type Compression = "gzip" | "zstd" | "none";

/** What the first bytes of a layer say it is. */
export function sniffCompression(head: Uint8Array): Compression {
  const is = (...bytes: number[]) => bytes.every((b, i) => head[i] === b);
  if (is(0x1f, 0x8b)) return "gzip";
  if (is(0x28, 0xb5, 0x2f, 0xfd)) return "zstd";
  if (is(0xfd, 0x37, 0x7a, 0x58, 0x5a, 0x00)) throw new ContentError("layer is xz-compressed, which OCI images do not use and trellis does not read");
  if (is(0x42, 0x5a, 0x68)) throw new ContentError("layer is bzip2-compressed, which OCI images do not use and trellis does not read");
  return "none";
}

/** Feeds compressed chunks through the right decompressor into a TarScanner, with backpressure. */
class LayerDecoder {
  private unpacked = 0;
  private head: Uint8Array[] = [];
  private headLength = 0;
  private compression: Compression | undefined;
  private z: Transform | undefined;
  private pump: Promise<void> | undefined;
  private failure: { error: unknown } | undefined;
  private wake: (() => void) | undefined;

  constructor(
    private readonly scanner: TarScanner,
    /** Refused beyond this many bytes of tar (see scanLayer). */
    private readonly maxUnpackedBytes: number,
    private readonly digest: string,
  ) {}

  async write(chunk: Uint8Array): Promise<void> {
    if (this.failure) throw this.failure.error;
    if (this.compression === undefined) {
      this.head.push(chunk);
      this.headLength += chunk.length;
      if (this.headLength < 6) return; // enough to tell every magic number apart
      chunk = this.start();
    }
    await this.feed(chunk);
  }

  async end(): Promise<LayerVerdict> {
    if (this.failure) throw this.failure.error;
    if (this.compression === undefined && this.headLength > 0) await this.feed(this.start());
    if (this.z) {
      this.z.end();
      await this.pump;
    }
    if (this.failure) throw (this.failure as { error: unknown }).error;
    return this.scanner.end();
  }

  destroy(): void {
    this.z?.destroy();
  }

  private start(): Uint8Array {
    const head = Buffer.concat(this.head);
    this.head = [];
    this.compression = sniffCompression(head);
    if (this.compression !== "none") {
      // Bigger output chunks than the 16 KiB default: fewer awaits per megabyte (measured best: gzip 128 KiB, zstd 1 MiB).
      const z = this.compression === "gzip" ? createGunzip({ chunkSize: 128 << 10 }) : createZstdDecompress({ chunkSize: 1 << 20 });
      const what = this.compression;
      z.on("error", (err) => this.fail(new ContentError(`${what} decompression failed: ${explain(err)}`, { cause: err })));
      this.z = z;
      this.pump = (async () => {
        try {
          for await (const out of z) await this.push(out as Uint8Array);
        } catch (err) {
          this.fail(err instanceof ContentError || isLocal(err) ? err : new ContentError(`${what} decompression failed: ${explain(err)}`, { cause: err }));
          z.destroy();
        }
      })();
    }
    return head;
  }

  private async push(tar: Uint8Array): Promise<void> {
    this.unpacked += tar.length;
    if (this.unpacked > this.maxUnpackedBytes) {
      throw new ContentError(`layer ${this.digest} unpacks to more than ${this.maxUnpackedBytes} bytes, the limit for one layer (a decompression bomb?)`);
    }
    return this.scanner.push(tar);
  }

  private fail(error: unknown): void {
    this.failure ??= { error };
    this.wake?.(); // a failed pump never drains: release the writer waiting for it
  }

  private async feed(chunk: Uint8Array): Promise<void> {
    const z = this.z;
    if (!z) return this.push(chunk);
    if (!z.write(chunk) && !this.failure) {
      // One waiter at a time, held in a field: a callback per wait chained onto a long-lived promise would
      // keep every wait's scope — and its chunk — alive until the layer ends (measured: +100 MiB RSS).
      await new Promise<void>((resolve) => {
        const done = () => {
          z.off("drain", done);
          this.wake = undefined;
          resolve();
        };
        z.on("drain", done);
        this.wake = done;
      });
    }
    if (this.failure) throw this.failure.error;
  }
}

// Errors of the sink (the disk), not of the data: they must not be reported as a broken layer.
const isLocal = (err: unknown) => typeof (err as { code?: unknown } | null)?.code === "string" && (err as { syscall?: unknown }).syscall !== undefined;

/**
 * Reads one layer blob: hashes all of it, and scans it for `target` into `sink`. Throws TransferError
 * when the blob is not the one asked for (digest or size mismatch: another endpoint may have the right
 * one) — checked first, so a corrupted download is reported as that and not as a broken archive —
 * ContentError when the verified blob is not a readable tar or unpacks to more than maxUnpackedBytes,
 * and the sink's own errors as they are.
 */
export async function scanLayer(
  body: AsyncIterable<Uint8Array>,
  o: { digest: string; size: number; target: string; sink: FileSink; maxFileBytes: number; maxUnpackedBytes: number },
): Promise<LayerVerdict> {
  const hash = createHash("sha256");
  const dec = new LayerDecoder(new TarScanner(o.target, o.sink, o.maxFileBytes), o.maxUnpackedBytes, o.digest);
  let received = 0;
  let scanFailure: { error: unknown } | undefined;
  try {
    for await (const chunk of body) {
      received += chunk.length;
      if (received > o.size) throw new TransferError(`blob ${o.digest} is longer than the ${o.size} bytes the manifest declares`);
      hash.update(chunk);
      if (scanFailure) continue; // keep hashing: a digest mismatch explains a broken archive best
      try {
        await dec.write(chunk);
      } catch (err) {
        if (!(err instanceof ContentError)) throw err;
        scanFailure = { error: err };
        dec.destroy();
      }
    }
  } catch (err) {
    dec.destroy();
    throw err;
  }
  let verdict: LayerVerdict | undefined;
  if (!scanFailure) {
    try {
      verdict = await dec.end();
    } catch (err) {
      if (!(err instanceof ContentError)) throw err;
      scanFailure = { error: err };
    }
  }
  const got = `sha256:${hash.digest("hex")}`;
  if (got !== o.digest) throw new TransferError(`digest mismatch: expected ${o.digest}, got ${got} (${received} bytes)`);
  if (received !== o.size) throw new TransferError(`blob ${o.digest} is ${received} bytes, the manifest declares ${o.size}`);
  if (scanFailure) throw scanFailure.error;
  return verdict as LayerVerdict;
}

/** What decided the lookup: the layer (0 = bottom), its verdict, and for a hard link the entry it names. */
export type Decision<S> = { layer: number; verdict: LayerVerdict; sink?: S; hardlinkTo?: string };

/**
 * Looks for `target` from the top layer down; the first layer that says anything about it decides (an
 * upper layer's file shadows a lower one's, a whiteout hides it). A hard link is resolved by reading its
 * layer again for the entry it names, whose content was not kept the first time. undefined: no layer
 * has the path. `read` scans layer `i` for a path and returns its verdict (and the sink, for a file).
 */
export async function searchLayers<S>(
  count: number,
  target: string,
  read: (layer: number, path: string) => Promise<{ verdict: LayerVerdict; sink?: S }>,
): Promise<Decision<S> | undefined> {
  for (let layer = count - 1; layer >= 0; layer--) {
    const got = await read(layer, target);
    if (got.verdict.kind === "absent") continue;
    if (got.verdict.kind !== "hardlink" || got.verdict.linkTarget === target) return { layer, ...got };
    const linked = await read(layer, got.verdict.linkTarget);
    return { layer, ...linked, hardlinkTo: got.verdict.linkTarget };
  }
  return undefined;
}
