// Files extracted from OCI images (OSC `imageRef{image, filePathInImage}`), cached on the node.
//
// A tag is resolved on every call (one HEAD), because tags move; everything after that is addressed by
// digest and therefore cacheable forever: index digest → linux/<arch> manifest digest, and manifest
// digest + path → the extracted file's sha256. A call whose answer is in the cache downloads nothing, and
// a digest-pinned one makes no request at all. Layers are read top down and the first layer that has the
// path or hides it decides. Nothing enters the cache before the layer it came from hashed to its digest.
//
// Cache layout (0700 directories, 0600 files):
//   <cacheDir>/index.json              what is known (schema below)
//   <cacheDir>/files/sha256/<hex>      extracted contents, named by their sha256 (shared between images)
import { createHash } from "node:crypto";
import { chmod, mkdir, open, readdir, readFile, rename, stat, unlink, utimes, type FileHandle } from "node:fs/promises";
import { join, resolve } from "node:path";
import * as v from "valibot";
import { object, record } from "../../api/shapes.ts";
import { describeError, type Logger } from "../../log.ts";
import { createFiles, isLeftoverTemp, tempName } from "../files.ts";
import { defaultTimeouts, RegistryClient, TokenCache, type ManifestBytes, type Timeouts } from "./client.ts";
import { ContentError, EndpointsFailedError, explain, ImageError, TransferError } from "./errors.ts";
import { HostsConfigError, loadEndpoints } from "./hosts.ts";
import { scanLayer, searchLayers, type FileSink, type LayerVerdict } from "./layers.ts";
import { isImageConfig, parseManifest, pickPlatform, type Descriptor, type Manifest } from "./manifest.ts";
import { InvalidReferenceError, parseImageReference, type ImageReference } from "./reference.ts";
import { monotonicMs } from "../../time.ts";
import { serializer } from "../../loops.ts";

export { ImageError } from "./errors.ts";

export type ImageFileRequest = { image: string; filePathInImage: string };

export type ExtractedFile = {
  image: string;
  filePathInImage: string;
  /** Digest of the platform manifest used. */
  manifestDigest: string;
  /** Hex sha256 of the extracted file content. */
  sha256: string;
  size: number;
  /** Cache file holding exactly that content (0600), safe to copy from. */
  blobPath: string;
  /** False when served from the cache without downloading layers. */
  pulled: boolean;
};

export type ExtractOptions = {
  signal?: AbortSignal;
  /**
   * hosts.toml content by registry that takes precedence over the file in hostsDir: the mirrors the
   * OSC being applied configures are used for that OSC's own images, before they are on disk.
   */
  hostsToml?: ReadonlyMap<string, string>;
  /**
   * The files one resolution of an OSC takes from the cache: extract adds each file it hands out (the
   * apply copies from there later), and none of them is evicted to make room for another.
   */
  inUse?: Set<string>;
};

/**
 * A file already on the node that is known to be `path` of an image: install.sh verified the image's
 * digests and put the file there. Its platform manifest and, when the image is an index, the index.
 */
export type KnownImageFile = { index?: string; manifest: string; path: string; source: string; sha256: string };

export interface ImageStore {
  extract(req: ImageFileRequest, opts?: ExtractOptions): Promise<ExtractedFile>;
  /** Deletes cached extracted files whose sha256 is not in keep (and stale index entries). */
  prune(keepSha256: ReadonlySet<string>): Promise<void>;
}

export interface ImageCache extends ImageStore {
  /**
   * Takes a file into the cache as `path` of the image (copied from `source`, refused unless it hashes
   * to `sha256`), so that extracting it later downloads nothing: what the agent's first apply would
   * otherwise pull again for the binary install.sh just installed. The index's image for this node's
   * platform is then `manifest`, the one install.sh took (an index may list several: build/image.ts
   * lists each image with a zstd layer, then with a gzip one). Returns false when `source` does not
   * hold that content (nothing is recorded).
   */
  adopt(file: KnownImageFile): Promise<boolean>;
}

export type Arch = "amd64" | "arm64";

export type ImageStoreOptions = {
  /** The agent uses /var/lib/gardener-node-agent/trellis/images. */
  cacheDir: string;
  /** containerd's registry host directory, /etc/containerd/certs.d. */
  hostsDir: string;
  /** Picked from an image index (os linux). */
  arch: Arch;
  /** Larger extracted files are refused (default 512 MiB). */
  maxFileBytes?: number;
  /** A layer whose tar is larger is refused (default 8 GiB, defaultMaxUnpackedLayerBytes). */
  maxUnpackedLayerBytes?: number;
  /** The extracted files the cache holds at most (default 4 GiB, defaultMaxCacheBytes). */
  maxCacheBytes?: number;
  log: Logger;
  /** Request deadlines (default: 30 s to the response headers, 60 s without data while a body streams). */
  timeouts?: Partial<Timeouts>;
};

/** The image architecture for a `process.arch`. */
export function archOf(nodeArch: string): Arch {
  if (nodeArch === "x64") return "amd64";
  if (nodeArch === "arm64") return "arm64";
  throw new Error(`architecture ${nodeArch} is not supported: images are pulled for amd64 and arm64 only`);
}

/** "/usr/bin/x", "usr/bin/x", "./usr//bin/x" → "usr/bin/x"; ".." and an empty path are refused. */
export function normaliseImagePath(path: string): string {
  if (path.includes("\0")) throw new Error("path contains a NUL byte");
  const parts = path.split("/").filter((s) => s !== "" && s !== ".");
  if (parts.includes("..")) throw new Error(`path must not contain ".." (${JSON.stringify(path)})`);
  if (parts.length === 0) throw new Error(`path names no file (${JSON.stringify(path)})`);
  return parts.join("/");
}

const defaultMaxFileBytes = 512 << 20;
/**
 * Only the one file is written to disk (at most maxFileBytes), but every layer searched is decompressed
 * to its end to be read past: gzip reaches 1000:1 on zeros, so a 10 MiB layer could keep the agent busy
 * unpacking 10 GiB. The largest real layers (CUDA, ML frameworks) unpack to a few GiB.
 */
const defaultMaxUnpackedLayerBytes = 8 * 2 ** 30;
/**
 * Files leave the cache when an applied OSC no longer uses them, but OSCs that never apply (failing, or
 * replaced first) only add to it. Eight files of the largest size allowed: a Gardener OSC has two or
 * three (kubelet, the agent, ~100 MiB each), so the applied OSC and several updates fit before the least
 * recently used files go.
 */
const defaultMaxCacheBytes = 8 * defaultMaxFileBytes;
/** Image configs carry the build history; a few MiB at most in practice. */
const maxConfigBytes = 8 << 20;
const sha256Hex = /^[0-9a-f]{64}$/;

const IndexSchema = object({
  version: v.literal(1),
  /** platform manifest digest → normalised path in the image → the extracted file */
  files: record(v.string(), record(v.string(), object({ sha256: v.pipe(v.string(), v.regex(sha256Hex)), size: v.number() }))),
  /** image index digest → "linux/<arch>" → platform manifest digest */
  indexes: record(v.string(), record(v.string(), v.string())),
});
type CacheIndex = v.InferOutput<typeof IndexSchema>;
const emptyIndex = (): CacheIndex => ({ version: 1, files: {}, indexes: {} });

const errno = (err: unknown) => (err as { code?: unknown } | null)?.code;

async function syncDir(dir: string): Promise<void> {
  const fh = await open(dir, "r");
  try {
    await fh.sync();
  } finally {
    await fh.close();
  }
}

/**
 * The extracted content on its way into the cache: a 0600 temp file next to its final place, written
 * through a 1 MiB buffer (chunks of decompressed tar are small) and hashed as it goes.
 */
class TempFileSink implements FileSink {
  readonly path: string;
  private fh: FileHandle | undefined;
  private position = 0;
  private hash = createHash("sha256");
  private size = 0;
  private buf: Buffer | undefined; // allocated by begin(): most layers scanned never hold the file
  private fill = 0;

  constructor(dir: string) {
    this.path = join(dir, tempName("extract"));
  }

  async begin(): Promise<void> {
    // "wx": O_EXCL, never a file or symlink someone planted at the name.
    if (!this.fh) this.fh = await open(this.path, "wx", 0o600);
    else await this.fh.truncate(0);
    this.buf ??= Buffer.allocUnsafe(1 << 20);
    this.position = 0;
    this.fill = 0;
    this.size = 0;
    this.hash = createHash("sha256");
  }

  async write(chunk: Uint8Array): Promise<void> {
    this.hash.update(chunk);
    this.size += chunk.length;
    const buf = this.buf;
    if (!buf) throw new Error("internal: write() before begin()");
    // Copied into our buffer: a source may reuse the memory of a chunk once we return.
    for (let off = 0; off < chunk.length; ) {
      const n = Math.min(buf.length - this.fill, chunk.length - off);
      buf.set(chunk.subarray(off, off + n), this.fill);
      this.fill += n;
      off += n;
      if (this.fill === buf.length) await this.flush();
    }
  }

  /** Writes out, fsyncs and closes; the content's sha256 and size. */
  async finish(): Promise<{ sha256: string; size: number }> {
    const fh = this.fh;
    if (!fh) throw new Error("internal: finish() before begin()");
    await this.flush();
    await fh.sync();
    this.fh = undefined;
    await fh.close();
    return { sha256: this.hash.digest("hex"), size: this.size };
  }

  async discard(): Promise<void> {
    const fh = this.fh;
    this.fh = undefined;
    try {
      await fh?.close();
    } finally {
      await unlink(this.path).catch((err: unknown) => {
        if (errno(err) !== "ENOENT") throw err;
      });
    }
  }

  private async flush(): Promise<void> {
    const fh = this.fh as FileHandle;
    const buf = this.buf as Buffer;
    for (let w = 0; w < this.fill; ) {
      const { bytesWritten } = await fh.write(buf, w, this.fill - w, this.position);
      w += bytesWritten;
      this.position += bytesWritten;
    }
    this.fill = 0;
  }
}

type Located = { manifestDigest: string; sha256: string; size: number };

export function createImageStore(opts: ImageStoreOptions): ImageCache {
  const cacheDir = resolve(opts.cacheDir);
  const filesDir = join(cacheDir, "files", "sha256");
  const indexPath = join(cacheDir, "index.json");
  const hostsDir = resolve(opts.hostsDir);
  const maxFileBytes = opts.maxFileBytes ?? defaultMaxFileBytes;
  const maxUnpackedBytes = opts.maxUnpackedLayerBytes ?? defaultMaxUnpackedLayerBytes;
  const maxCacheBytes = opts.maxCacheBytes ?? defaultMaxCacheBytes;
  const timeouts: Timeouts = { ...defaultTimeouts, ...opts.timeouts };
  const platformKey = `linux/${opts.arch}`;
  const log = opts.log.with({ component: "image-store" });
  const tokens = new TokenCache();
  const files = createFiles("/");
  const blobPath = (sha256: string) => join(filesDir, sha256);

  // Index updates are read-modify-write: one at a time in this process. The index is re-read each time,
  // so another trellis process on the node (`trellis plan` next to the agent) loses at most its own update.
  const indexUpdates = serializer();
  const serialised = <T>(fn: () => Promise<T>): Promise<T> => indexUpdates.run(fn);

  let ready: Promise<void> | undefined;
  const init = () => {
    ready ??= prepare().catch((err: unknown) => {
      ready = undefined; // a later call tries again (the disk may have been full)
      throw err;
    });
    return ready;
  };

  async function prepare(): Promise<void> {
    await mkdir(filesDir, { recursive: true, mode: 0o700 });
    await chmod(cacheDir, 0o700);
    // Temp files of killed writers (the index is written through src/host/files.ts, the extractions
    // are named the same way): those of a live `trellis plan` or agent sharing the directory stay.
    for (const dir of [cacheDir, filesDir]) {
      for (const name of await readdir(dir)) {
        if (!isLeftoverTemp(name)) continue;
        await unlink(join(dir, name)).catch((err: unknown) => {
          if (errno(err) !== "ENOENT") throw err;
        });
        log.info("removed a leftover temp file", { path: join(dir, name) });
      }
    }
  }

  async function readIndex(): Promise<CacheIndex> {
    let text: string;
    try {
      text = await readFile(indexPath, "utf8");
    } catch (err) {
      if (errno(err) === "ENOENT") return emptyIndex();
      throw err;
    }
    let parsed: unknown;
    try {
      parsed = JSON.parse(text);
    } catch {
      parsed = undefined;
    }
    const checked = v.safeParse(IndexSchema, parsed);
    if (checked.success) return checked.output;
    // Only a cache: starting empty costs downloads, refusing to work would cost the node its files.
    log.warn("image cache index is unreadable, starting with an empty one", { path: indexPath });
    return emptyIndex();
  }

  const writeIndex = (index: CacheIndex) => files.writeAtomic(indexPath, `${JSON.stringify(index)}\n`, 0o600);

  async function present(sha256: string, size: number): Promise<boolean> {
    try {
      const s = await stat(blobPath(sha256));
      return s.isFile() && s.size === size;
    } catch (err) {
      if (errno(err) === "ENOENT") return false;
      throw err;
    }
  }

  /**
   * What the cache knows for `digest` (an index or a platform manifest) and `path`, if its file is still
   * there; the file is then marked used (in `inUse`, and as most recently used) before anything can evict it.
   */
  async function lookup(digest: string, path: string, inUse: Set<string> | undefined): Promise<Located | undefined> {
    const index = await readIndex();
    const manifestDigest = index.indexes[digest]?.[platformKey] ?? digest;
    const entry = index.files[manifestDigest]?.[path];
    if (!entry) return undefined;
    const claimed = await serialised(async () => {
      if (!(await present(entry.sha256, entry.size))) return false;
      inUse?.add(entry.sha256);
      const now = new Date();
      await utimes(blobPath(entry.sha256), now, now); // the eviction order is by modification time
      return true;
    });
    if (claimed) return { manifestDigest, ...entry };
    log.warn("cached image file is missing or damaged, fetching it again", { path: blobPath(entry.sha256) });
    return undefined;
  }

  /**
   * Makes room for the `incoming` file (called serialised, before it is renamed in): while the
   * cache would exceed maxCacheBytes, the least recently used files not in `inUse` are deleted, with their
   * index entries. When the files in use alone leave no room, nothing is deleted and the new file is refused.
   * (Extractions in flight hold up to maxFileBytes each in temp files besides.)
   */
  async function makeRoom(index: CacheIndex, incoming: { sha256: string; size: number }, inUse: ReadonlySet<string> | undefined): Promise<void> {
    const cached: { sha256: string; size: number; usedMs: number }[] = [];
    for (const name of await readdir(filesDir)) {
      if (!sha256Hex.test(name) || name === incoming.sha256) continue; // the same content replaces itself
      const s = await stat(join(filesDir, name)).catch((err: unknown) => {
        if (errno(err) === "ENOENT") return undefined;
        throw err;
      });
      if (s) cached.push({ sha256: name, size: s.size, usedMs: s.mtimeMs });
    }
    let total = incoming.size + cached.reduce((sum, c) => sum + c.size, 0);
    if (total <= maxCacheBytes) return;
    const held = cached.filter((c) => inUse?.has(c.sha256));
    const heldBytes = held.reduce((sum, c) => sum + c.size, 0);
    if (incoming.size + heldBytes > maxCacheBytes) {
      throw new Error(
        `the cache holds at most ${maxCacheBytes} bytes of image files: this file (${incoming.size} bytes) and the ${held.length} other file(s) this OSC uses (${heldBytes} bytes) do not fit`,
      );
    }
    const evicted = new Set<string>();
    for (const c of cached.filter((c) => !inUse?.has(c.sha256)).sort((a, b) => a.usedMs - b.usedMs)) {
      if (total <= maxCacheBytes) break;
      await unlink(blobPath(c.sha256)).catch((err: unknown) => {
        if (errno(err) !== "ENOENT") throw err;
      });
      total -= c.size;
      evicted.add(c.sha256);
    }
    dropEntries(index, (sha256) => evicted.has(sha256));
    log.info("evicted least recently used files from the image cache", { evicted: evicted.size, limitBytes: maxCacheBytes, bytes: total });
  }

  /** Applies `update` to the index and writes it, unless `update` returns false (nothing changed). */
  async function remember(update: (index: CacheIndex) => boolean): Promise<void> {
    await serialised(async () => {
      const index = await readIndex();
      if (update(index)) await writeIndex(index);
    });
  }

  async function extract(req: ImageFileRequest, { signal, hostsToml, inUse }: ExtractOptions = {}): Promise<ExtractedFile> {
    const started = monotonicMs();
    const fail = (reason: string, cause?: unknown) => new ImageError(req.image, req.filePathInImage, reason, { cause });
    let path: string;
    let ref: ImageReference;
    try {
      path = normaliseImagePath(req.filePathInImage);
      ref = parseImageReference(req.image);
    } catch (err) {
      throw fail(err instanceof Error ? err.message : String(err), err);
    }
    const result = (l: Located, pulled: boolean): ExtractedFile => ({
      image: req.image,
      filePathInImage: req.filePathInImage,
      manifestDigest: l.manifestDigest,
      sha256: l.sha256,
      size: l.size,
      blobPath: blobPath(l.sha256),
      pulled,
    });

    try {
      await init();
      // A pinned digest whose file is cached needs neither hosts.toml nor the network.
      if (ref.digest !== undefined) {
        const hit = await lookup(ref.digest, path, inUse);
        if (hit) {
          log.debug("image file served from the cache", { image: req.image, path, manifestDigest: hit.manifestDigest });
          return result(hit, false);
        }
      }
      const client = new RegistryClient({
        registry: ref.registry,
        repository: ref.repository,
        endpoints: await loadEndpoints(files, hostsDir, ref.registry, hostsToml?.get(ref.registry)),
        tokens,
        timeouts,
        log,
        signal,
      });

      let top: string;
      let topBytes: ManifestBytes | undefined;
      if (ref.digest !== undefined) top = ref.digest;
      else {
        const resolved = await client.resolveTag(ref.tag ?? "latest");
        top = resolved.digest;
        topBytes = resolved.manifest;
        const hit = await lookup(top, path, inUse);
        if (hit) {
          reportFallThrough(client, req);
          log.debug("image file served from the cache", { image: req.image, path, manifestDigest: hit.manifestDigest, resolvedFrom: ref.tag });
          return result(hit, false);
        }
      }

      const manifestBytes = topBytes ?? (await client.fetchManifest(top));
      let manifestDigest = top;
      let manifest = parseManifest(manifestBytes.bytes, manifestBytes.mediaType, top);
      if (manifest.kind === "index") {
        // An image of this index already taken for this platform (adopt: the one install.sh took) stays the one.
        const taken = (await readIndex()).indexes[top]?.[platformKey];
        const chosen = manifest.manifests.find((m) => m.digest === taken && m.platform?.os === "linux" && m.platform.architecture === opts.arch) ?? pickPlatform(manifest, opts.arch, top);
        manifestDigest = chosen.digest;
        // Remembered now: the next call for another file of this image skips fetching the index.
        await remember((index) => {
          const platforms = (index.indexes[top] ??= {});
          if (platforms[platformKey] === manifestDigest) return false;
          platforms[platformKey] = manifestDigest;
          return true;
        });
        const hit = await lookup(manifestDigest, path, inUse);
        if (hit) {
          reportFallThrough(client, req);
          return result(hit, false);
        }
        const platformBytes = await client.fetchManifest(manifestDigest);
        manifest = parseManifest(platformBytes.bytes, platformBytes.mediaType, manifestDigest);
        if (manifest.kind === "index") throw new ContentError(`image index ${top} points to another index (${manifestDigest}) for ${platformKey}; nested indexes are not supported`);
      } else {
        await checkPlatform(client, manifest.config, manifestDigest);
      }

      const found = await pullFile(client, manifest, manifestDigest, path, req, signal, inUse);
      reportFallThrough(client, req);
      const located: Located = { manifestDigest, ...found };
      log.info("extracted a file from an image", {
        image: req.image,
        path,
        manifestDigest,
        sha256: found.sha256,
        size: found.size,
        ms: Math.round(monotonicMs() - started),
      });
      return result(located, true);
    } catch (err) {
      if (err instanceof ImageError) throw err;
      if (signal?.aborted) throw fail(`aborted: ${describeError(signal.reason)}`, err);
      if (err instanceof EndpointsFailedError || err instanceof ContentError || err instanceof TransferError || err instanceof InvalidReferenceError) {
        throw fail(err.message, err);
      }
      if (err instanceof HostsConfigError) throw fail(`containerd registry configuration: ${err.message}`, err);
      throw fail(`image cache ${cacheDir}: ${explain(err)}`, err);
    }
  }

  // A mirror that is down costs every request a failed attempt: one line per extraction says so, not one per request.
  function reportFallThrough(client: RegistryClient, req: ImageFileRequest): void {
    if (client.fellThrough.length === 0) return;
    const failed: Record<string, string> = {};
    for (const a of client.fellThrough) failed[a.endpoint] ??= a.reason;
    log.warn("registry endpoints failed before another answered", { image: req.image, path: req.filePathInImage, failed });
  }

  /** A single-platform image must be for this node (an index was already matched by its entries). */
  async function checkPlatform(client: RegistryClient, config: Descriptor, manifestDigest: string): Promise<void> {
    if (!isImageConfig(config)) return;
    const bytes = await client.fetchSmallBlob(config.digest, maxConfigBytes, `image config ${config.digest}`);
    let doc: { os?: unknown; architecture?: unknown };
    try {
      doc = JSON.parse(bytes.toString("utf8")) as typeof doc;
    } catch {
      throw new ContentError(`image config ${config.digest} is not JSON`);
    }
    const { os, architecture } = doc;
    if ((typeof os === "string" && os !== "linux") || (typeof architecture === "string" && architecture !== opts.arch)) {
      throw new ContentError(`image ${manifestDigest} is for ${String(os)}/${String(architecture)}, this node is ${platformKey}`);
    }
  }

  async function pullFile(
    client: RegistryClient,
    manifest: Extract<Manifest, { kind: "manifest" }>,
    manifestDigest: string,
    path: string,
    req: ImageFileRequest,
    signal: AbortSignal | undefined,
    inUse: Set<string> | undefined,
  ): Promise<{ sha256: string; size: number }> {
    const fail = (reason: string) => new ImageError(req.image, req.filePathInImage, reason);
    const layers = manifest.layers;
    const where = (i: number) => `layer ${i + 1} of ${layers.length} (${(layers[i] as Descriptor).digest})`;
    const decision = await searchLayers(layers.length, path, (i, target) => {
      signal?.throwIfAborted();
      return readLayer(client, layers[i] as Descriptor, where(i), target);
    });
    if (!decision) throw fail(`${path} not found in any of the ${layers.length} layer(s) of ${manifestDigest}`);
    const v = decision.verdict;
    const at = `${where(decision.layer)} of ${manifestDigest}`;
    if (v.kind === "file") {
      const sink = decision.sink as TempFileSink;
      try {
        const { sha256, size } = await sink.finish();
        await serialised(async () => {
          const index = await readIndex();
          await makeRoom(index, { sha256, size }, inUse);
          await rename(sink.path, blobPath(sha256));
          await syncDir(filesDir);
          inUse?.add(sha256);
          (index.files[manifestDigest] ??= {})[path] = { sha256, size };
          await writeIndex(index);
        });
        return { sha256, size };
      } finally {
        await sink.discard(); // nothing left after the rename; removes the temp file if that failed
      }
    }
    await decision.sink?.discard();
    if (decision.hardlinkTo !== undefined) {
      throw fail(`${path} is a hard link to ${decision.hardlinkTo} in ${at}, and ${decision.hardlinkTo} is not a regular file of that layer (${describeVerdict(v)})`);
    }
    if (v.kind === "deleted") throw fail(`file deleted in ${at} (whiteout ${v.whiteout})`);
    throw fail(`${describeVerdict(v)} in ${at}; only regular files can be extracted`);
  }

  async function readLayer(client: RegistryClient, layer: Descriptor, where: string, target: string): Promise<{ verdict: LayerVerdict; sink?: TempFileSink }> {
    return client.fetchBlob(layer.digest, where, async (body) => {
      const sink = new TempFileSink(filesDir);
      try {
        const verdict = await scanLayer(body, { digest: layer.digest, size: layer.size, target, sink, maxFileBytes, maxUnpackedBytes });
        if (verdict.kind === "file") return { verdict, sink };
        await sink.discard();
        return { verdict };
      } catch (err) {
        await sink.discard();
        throw err;
      }
    });
  }

  async function adopt(file: KnownImageFile): Promise<boolean> {
    const path = normaliseImagePath(file.path);
    for (const d of [file.manifest, file.index ?? file.manifest]) if (!/^sha256:[0-9a-f]{64}$/.test(d)) throw new Error(`adopt: ${JSON.stringify(d)} is not a sha256 digest`);
    if (!sha256Hex.test(file.sha256)) throw new Error(`adopt: ${JSON.stringify(file.sha256)} is not a sha256`);
    await init();
    const size = (await stat(file.source)).size;
    return serialised(async () => {
      const index = await readIndex();
      if (!(await present(file.sha256, size))) {
        await makeRoom(index, { sha256: file.sha256, size }, undefined);
        try {
          // Hashed while copied: a source that changed since it was verified is not taken.
          await files.writeAtomic(blobPath(file.sha256), { copyFrom: file.source, sha256: file.sha256 }, 0o600);
        } catch (err) {
          log.warn("not taking the file into the image cache: it is not the content it should be", { source: file.source, error: describeError(err) });
          return false;
        }
      }
      if (file.index && file.index !== file.manifest) (index.indexes[file.index] ??= {})[platformKey] = file.manifest;
      (index.files[file.manifest] ??= {})[path] = { sha256: file.sha256, size };
      await writeIndex(index);
      log.info("took a file already on the node into the image cache", { source: file.source, manifestDigest: file.manifest, path, sha256: file.sha256 });
      return true;
    });
  }

  async function prune(keep: ReadonlySet<string>): Promise<void> {
    await init();
    await serialised(async () => {
      const index = await readIndex();
      const entries = dropEntries(index, (sha256) => !keep.has(sha256));
      await writeIndex(index);
      let removed = 0;
      for (const name of await readdir(filesDir)) {
        // Temp files (".…") belong to extractions in flight; they are never in the index.
        if (!sha256Hex.test(name) || keep.has(name)) continue;
        await unlink(join(filesDir, name)).catch((err: unknown) => {
          if (errno(err) !== "ENOENT") throw err;
        });
        removed++;
      }
      if (removed > 0) await syncDir(filesDir);
      if (removed > 0 || entries > 0) log.info("pruned the image cache", { removedFiles: removed, removedEntries: entries, kept: keep.size });
    });
  }

  return { extract, prune, adopt };
}

/** Removes the index's entries for files `drop` says are gone, and index platforms left pointing nowhere; how many entries. */
function dropEntries(index: CacheIndex, drop: (sha256: string) => boolean): number {
  let entries = 0;
  for (const [manifest, paths] of Object.entries(index.files)) {
    for (const [path, entry] of Object.entries(paths)) {
      if (!drop(entry.sha256)) continue;
      delete paths[path];
      entries++;
    }
    if (Object.keys(paths).length === 0) delete index.files[manifest];
  }
  for (const [digest, platforms] of Object.entries(index.indexes)) {
    for (const [platform, manifest] of Object.entries(platforms)) if (!index.files[manifest]) delete platforms[platform];
    if (Object.keys(platforms).length === 0) delete index.indexes[digest];
  }
  return entries;
}

function describeVerdict(v: LayerVerdict): string {
  switch (v.kind) {
    case "symlink":
      return `it is a symlink (to ${v.linkTarget})`;
    case "directory":
      return "it is a directory";
    case "special":
      return `it is a ${v.type}`;
    case "hardlink":
      return `it is a hard link to ${v.linkTarget}`;
    case "blocked":
      return `its parent ${v.parent} is a ${v.type}${v.linkTarget ? ` (to ${v.linkTarget})` : ""}, which is not followed`;
    case "deleted":
      return `it is deleted (whiteout ${v.whiteout})`;
    case "absent":
      return "it is not there";
    case "file":
      return "it is a regular file";
  }
}
