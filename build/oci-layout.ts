// Hand-made OCI image layouts (no docker, no buildah, no tar binary): files in, layout dir + digests out.
// Used by build/image.ts for the release image and by the tests (test/harness/oci.ts) for fixture images.
//
// Reproducible by construction: the tar is written here (sorted entries, uid/gid 0, mtime 0, no user
// names), zlib's gzip header carries no timestamp, zstd is deterministic for a given level, and the
// JSON documents are serialised with a fixed key order. The same files give the same digests.
import { createHash } from "node:crypto";
import { mkdirSync, writeFileSync } from "node:fs";
import { constants, gzipSync, zstdCompressSync } from "node:zlib";

/** File content, or content plus mode (default 0644). */
export type ImageFile = string | { content: string | Uint8Array; mode: number };
/** One layer: paths relative to the image root ("bin/tool") → file. Parent directories are implied (0755). */
export type LayerFiles = Record<string, ImageFile>;
export type Compression = "gzip" | "zstd";

export interface Platform {
  os: string;
  architecture: string;
  variant?: string;
}

export interface ImageSpec {
  platform: Platform;
  layers: LayerFiles[];
  /** The OCI image config's `config` (Entrypoint, Cmd, Env, Labels, …); empty when absent. */
  config?: { Entrypoint?: string[]; Cmd?: string[]; Env?: string[]; WorkingDir?: string; Labels?: Record<string, string> };
}

export interface LayoutOptions {
  /** Layer compression, gzip (the default: every runtime reads it) or zstd (smaller; containerd ≥ 1.5). */
  compression?: Compression;
  /** gzip 1–9 (default 9), zstd 1–22 (default 19). */
  level?: number;
  /**
   * Every image once more, its layers compressed this other way, listed in the index after all the
   * images compressed as `compression` (the index is written even for one image). A client that takes
   * the first entry for its platform (containerd, trellis's own image store) gets `compression`; one
   * that cannot decompress it (install.sh on a machine without `zstd`) takes the entry after it. Same
   * config blob (its diff_ids are of the uncompressed layers), so the same image either way.
   */
  alternative?: { compression: Compression; level?: number };
}

export interface Descriptor {
  mediaType: string;
  digest: string;
  size: number;
  platform?: Platform;
}

export interface WrittenImage {
  /** The image manifest's descriptor, platform included. */
  manifest: Descriptor;
  config: Descriptor;
  layers: Descriptor[];
}

export interface WrittenLayout {
  /** What the tag in index.json points at: the image index (several images) or the one manifest. */
  root: Descriptor;
  images: WrittenImage[];
  /** With `alternative`: the same images with their layers compressed that way, in the same order. */
  alternatives: WrittenImage[];
}

export const mediaTypes = {
  index: "application/vnd.oci.image.index.v1+json",
  manifest: "application/vnd.oci.image.manifest.v1+json",
  config: "application/vnd.oci.image.config.v1+json",
  gzip: "application/vnd.oci.image.layer.v1.tar+gzip",
  zstd: "application/vnd.oci.image.layer.v1.tar+zstd",
} as const;

/**
 * Writes an OCI image layout to `layoutDir` (created if missing; blobs of earlier writes stay) whose
 * index.json holds `tag`: one image → its manifest; several (or an `alternative`) → an image index over
 * them, which is what `skopeo copy --all` and `ctr images pull` resolve per platform.
 */
export function writeLayout(layoutDir: string, tag: string, images: ImageSpec | ImageSpec[], opts: LayoutOptions = {}): WrittenLayout {
  mkdirSync(`${layoutDir}/blobs/sha256`, { recursive: true });
  const list = Array.isArray(images) ? images : [images];
  if (list.length === 0) throw new Error("an image layout needs at least one image");
  const written = list.map((spec) => writeImage(layoutDir, spec, opts));
  const alt = opts.alternative;
  const alternatives = alt ? list.map((spec) => writeImage(layoutDir, spec, { compression: alt.compression, ...(alt.level !== undefined ? { level: alt.level } : {}) })) : [];
  const root =
    Array.isArray(images) || alt ? writeIndex(layoutDir, [...written, ...alternatives].map((w) => w.manifest)) : withoutPlatform(written[0] as WrittenImage);
  writeFileSync(`${layoutDir}/oci-layout`, JSON.stringify({ imageLayoutVersion: "1.0.0" }));
  writeFileSync(
    `${layoutDir}/index.json`,
    JSON.stringify({
      schemaVersion: 2,
      mediaType: mediaTypes.index,
      manifests: [{ ...root, annotations: { "org.opencontainers.image.ref.name": tag } }],
    }),
  );
  return { root, images: written, alternatives };
}

/** Writes the blobs of one image (layers, config, manifest) and returns their descriptors. */
export function writeImage(layoutDir: string, spec: ImageSpec, opts: LayoutOptions = {}): WrittenImage {
  if (spec.layers.length === 0) throw new Error("an image needs at least one layer");
  const compression = opts.compression ?? "gzip";
  const diffIds: string[] = [];
  const layers = spec.layers.map((files) => {
    const tar = tarLayer(files);
    diffIds.push(`sha256:${sha256(tar)}`);
    return writeBlob(layoutDir, compress(tar, compression, opts.level), mediaTypes[compression]);
  });
  const { os, architecture, variant } = spec.platform;
  const config = writeBlob(
    layoutDir,
    JSON.stringify({
      architecture,
      os,
      ...(variant ? { variant } : {}),
      config: spec.config ?? {},
      rootfs: { type: "layers", diff_ids: diffIds },
    }),
    mediaTypes.config,
  );
  const manifest = writeBlob(layoutDir, JSON.stringify({ schemaVersion: 2, mediaType: mediaTypes.manifest, config, layers }), mediaTypes.manifest);
  return { manifest: { ...manifest, platform: spec.platform }, config, layers };
}

/** Writes an image index over `manifests` (descriptors with platforms). */
export function writeIndex(layoutDir: string, manifests: Descriptor[]): Descriptor {
  return writeBlob(layoutDir, JSON.stringify({ schemaVersion: 2, mediaType: mediaTypes.index, manifests }), mediaTypes.index);
}

export function writeBlob(layoutDir: string, data: Uint8Array | string, mediaType: string): Descriptor {
  const hex = sha256(data);
  writeFileSync(`${layoutDir}/blobs/sha256/${hex}`, data);
  return { mediaType, digest: `sha256:${hex}`, size: Buffer.byteLength(data) };
}

export function compress(data: Uint8Array, compression: Compression, level?: number): Uint8Array {
  if (compression === "gzip") return gzipSync(data, { level: level ?? 9 });
  return zstdCompressSync(data, { params: { [constants.ZSTD_c_compressionLevel]: level ?? 19 } });
}

/**
 * An uncompressed tar (POSIX ustar) of `files`: entries sorted by path, every parent directory present
 * (0755), uid/gid 0, mtime 0. Written here rather than by `tar` so the bytes do not depend on the
 * build machine's tar version or its file system.
 */
export function tarLayer(files: LayerFiles): Uint8Array {
  const entries = new Map<string, { mode: number; content?: Uint8Array }>();
  for (const [path, file] of Object.entries(files)) {
    const parts = path.split("/");
    if (path.startsWith("/") || parts.some((p) => p === "" || p === "." || p === "..")) {
      throw new Error(`image path must be relative, inside the image: ${path}`);
    }
    for (let i = 1; i < parts.length; i++) entries.set(`${parts.slice(0, i).join("/")}/`, { mode: 0o755 });
    const { content, mode } = typeof file === "string" ? { content: file, mode: 0o644 } : file;
    if (mode < 0 || mode > 0o7777) throw new Error(`bad mode ${mode.toString(8)} for ${path}`);
    entries.set(path, { mode, content: typeof content === "string" ? Buffer.from(content) : content });
  }
  const chunks: Uint8Array[] = [];
  for (const name of [...entries.keys()].sort()) {
    const entry = entries.get(name) as { mode: number; content?: Uint8Array };
    const size = entry.content?.byteLength ?? 0;
    chunks.push(tarHeader(name, entry.mode, size, entry.content ? "0" : "5"));
    if (entry.content) {
      chunks.push(entry.content);
      if (size % 512 !== 0) chunks.push(new Uint8Array(512 - (size % 512)));
    }
  }
  chunks.push(new Uint8Array(1024)); // end of archive: two zero blocks
  return Buffer.concat(chunks);
}

function tarHeader(path: string, mode: number, size: number, type: "0" | "5"): Uint8Array {
  const h = Buffer.alloc(512);
  // ustar splits names longer than 100 bytes at a "/" into prefix (155) and name (100).
  let name = path;
  let prefix = "";
  if (Buffer.byteLength(name) > 100) {
    const cut = path.lastIndexOf("/", path.length - 2);
    prefix = path.slice(0, cut);
    name = path.slice(cut + 1);
    if (cut < 0 || Buffer.byteLength(name) > 100 || Buffer.byteLength(prefix) > 155) throw new Error(`path too long for a tar header: ${path}`);
  }
  if (size > 0o77777777777) throw new Error(`file too large for a ustar header: ${path}`);
  const field = (offset: number, length: number, value: string) => h.write(value, offset, length, "utf8");
  const octal = (offset: number, length: number, value: number) => field(offset, length, `${value.toString(8).padStart(length - 1, "0")}\0`);
  field(0, 100, name);
  octal(100, 8, mode);
  octal(108, 8, 0); // uid
  octal(116, 8, 0); // gid
  octal(124, 12, size);
  octal(136, 12, 0); // mtime
  field(148, 8, "        "); // the checksum is computed with its own field as spaces
  field(156, 1, type);
  field(257, 8, "ustar\x0000");
  field(345, 155, prefix);
  let sum = 0;
  for (const byte of h) sum += byte;
  field(148, 8, `${sum.toString(8).padStart(6, "0")}\0 `);
  return h;
}

export function sha256(data: Uint8Array | string): string {
  return createHash("sha256").update(data).digest("hex");
}

function withoutPlatform(image: WrittenImage): Descriptor {
  const { platform: _platform, ...root } = image.manifest;
  return root;
}
