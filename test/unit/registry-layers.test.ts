// Layer reading (src/host/registry/layers.ts) over hand-built tar archives: ustar, GNU long names, PAX,
// base-256 sizes, whiteouts (plain, parent directory, opaque), symlinks, hard links, the topmost layer
// deciding, and gzip/zstd/plain layers verified against their digest.
import { describe, expect, test } from "bun:test";
import { createHash } from "node:crypto";
import { gzipSync, zstdCompressSync } from "node:zlib";
import { ContentError, TransferError } from "../../src/host/registry/errors.ts";
import { normaliseEntryName, parsePax, scanLayer, searchLayers, sniffCompression, TarScanner, type FileSink, type LayerVerdict } from "../../src/host/registry/layers.ts";
import { parseManifest, pickPlatform } from "../../src/host/registry/manifest.ts";

// --- a tar writer small enough to get every header field exactly as a test wants it ---

type Entry = {
  name: string;
  /** Type flag; default "0" (file). */
  type?: string;
  content?: string | Uint8Array;
  linkname?: string;
  mode?: number;
  /** "posix" (ustar\0 00, prefix field), "gnu" (ustar  \0), "v7" (no magic). Default posix. */
  format?: "posix" | "gnu" | "v7";
  prefix?: string;
  /** Write the size field in base-256 (GNU) instead of octal. */
  base256?: boolean;
  /** The size field's value when it must differ from the content (PAX size overrides). */
  sizeField?: number;
};

function header(e: Entry, size: number): Buffer {
  const h = Buffer.alloc(512);
  const text = (off: number, len: number, v: string) => h.write(v, off, len, "utf8");
  const octal = (off: number, len: number, v: number) => text(off, len, `${v.toString(8).padStart(len - 1, "0")}\0`);
  text(0, 100, e.name);
  octal(100, 8, e.mode ?? 0o644);
  octal(108, 8, 0);
  octal(116, 8, 0);
  const sizeField = e.sizeField ?? size;
  if (e.base256) {
    h[124] = 0x80;
    let v = sizeField;
    for (let i = 135; i > 124; i--) {
      h[i] = v % 256;
      v = Math.floor(v / 256);
    }
  } else octal(124, 12, sizeField);
  octal(136, 12, 0);
  text(148, 8, "        ");
  text(156, 1, e.type ?? "0");
  text(157, 100, e.linkname ?? "");
  const format = e.format ?? "posix";
  if (format === "posix") {
    text(257, 8, "ustar\x0000");
    text(345, 155, e.prefix ?? "");
  } else if (format === "gnu") text(257, 8, "ustar  \0");
  let sum = 0;
  for (const b of h) sum += b;
  text(148, 8, `${sum.toString(8).padStart(6, "0")}\0 `);
  return h;
}

function entry(e: Entry): Buffer {
  const data = typeof e.content === "string" ? Buffer.from(e.content) : Buffer.from(e.content ?? new Uint8Array());
  const pad = Buffer.alloc((512 - (data.length % 512)) % 512);
  return Buffer.concat([header(e, data.length), data, pad]);
}

const file = (name: string, content: string, extra: Partial<Entry> = {}) => entry({ name, content, ...extra });
const dir = (name: string) => entry({ name: name.endsWith("/") ? name : `${name}/`, type: "5", mode: 0o755 });
const symlink = (name: string, to: string) => entry({ name, type: "2", linkname: to });
const hardlink = (name: string, to: string) => entry({ name, type: "1", linkname: to });
const gnuLong = (type: "L" | "K", value: string) => entry({ name: "././@LongLink", type, content: `${value}\0`, format: "gnu" });
function pax(records: Record<string, string>): Buffer {
  const body = Object.entries(records)
    .map(([k, v]) => {
      const rest = ` ${k}=${v}\n`;
      let len = rest.length + 1;
      while (`${len}${rest}`.length !== len) len = `${len}${rest}`.length;
      return `${len}${rest}`;
    })
    .join("");
  return entry({ name: "PaxHeaders/x", type: "x", content: body });
}
const tar = (...entries: Buffer[]) => Buffer.concat([...entries, Buffer.alloc(1024)]);

// --- an in-memory sink ---

function memorySink(): FileSink & { content(): string; begins: number } {
  let chunks: Buffer[] = [];
  const sink = {
    begins: 0,
    async begin() {
      sink.begins++;
      chunks = [];
    },
    async write(c: Uint8Array) {
      chunks.push(Buffer.from(c));
    },
    content: () => Buffer.concat(chunks).toString("utf8"),
  };
  return sink;
}

async function scan(archive: Uint8Array, target: string, opts: { chunk?: number; max?: number } = {}) {
  const sink = memorySink();
  const scanner = new TarScanner(target, sink, opts.max ?? 1 << 30);
  const step = opts.chunk ?? archive.length;
  for (let i = 0; i < archive.length; i += step) await scanner.push(archive.subarray(i, i + step));
  return { verdict: scanner.end(), content: sink.content(), sink };
}

describe("TarScanner: finding the path", () => {
  const archive = tar(dir("etc"), file("etc/app.conf", "a=1\n", { mode: 0o600 }), dir("usr/bin"), file("usr/bin/tool", "#!/bin/sh\n", { mode: 0o755 }));

  test("a regular file: verdict, content and mode", async () => {
    const got = await scan(archive, "usr/bin/tool");
    expect(got.verdict).toEqual({ kind: "file", size: 10, mode: 0o755 });
    expect(got.content).toBe("#!/bin/sh\n");
  });

  test("not there: absent", async () => {
    expect((await scan(archive, "etc/other")).verdict).toEqual({ kind: "absent" });
    expect((await scan(archive, "etc/app.conf/x")).verdict).toMatchObject({ kind: "blocked", parent: "etc/app.conf", type: "file" });
  });

  test("the same verdict however the stream is cut (1, 7, 511, 513 byte chunks)", async () => {
    for (const chunk of [1, 7, 511, 513]) {
      const got = await scan(archive, "etc/app.conf", { chunk });
      expect(got.verdict).toEqual({ kind: "file", size: 4, mode: 0o600 });
      expect(got.content).toBe("a=1\n");
    }
  });

  test("names with ./ and leading slash match", async () => {
    expect((await scan(tar(file("./etc/x", "1")), "etc/x")).verdict.kind).toBe("file");
    expect((await scan(tar(file("/etc/x", "1")), "etc/x")).verdict.kind).toBe("file");
    expect(normaliseEntryName(".//a/./b/")).toBe("a/b");
  });

  test("ustar prefix field", async () => {
    const longDir = `${"d".repeat(90)}/${"e".repeat(60)}`;
    const got = await scan(tar(file("file.txt", "prefixed", { prefix: longDir })), `${longDir}/file.txt`);
    expect(got.content).toBe("prefixed");
    // GNU headers have no prefix field: the bytes there are not part of the name.
    expect((await scan(tar(file("file.txt", "x", { format: "gnu" })), "file.txt")).verdict.kind).toBe("file");
    expect((await scan(tar(file("v7.txt", "x", { format: "v7" })), "v7.txt")).verdict.kind).toBe("file");
  });

  test("GNU long name (L) and long link name (K)", async () => {
    const long = `opt/${"x".repeat(150)}/${"y".repeat(120)}/bin`;
    const got = await scan(tar(gnuLong("L", long), file("truncated-name", "long content", { format: "gnu" }), file("after", "z")), long);
    expect(got.content).toBe("long content");
    // The long name applies to one entry only.
    expect((await scan(tar(gnuLong("L", long), file("truncated-name", "1", { format: "gnu" }), file("after", "z")), "after")).content).toBe("z");
    const link = `target/${"t".repeat(200)}`;
    expect((await scan(tar(gnuLong("K", link), symlink("ln", "short")), "ln")).verdict).toEqual({ kind: "symlink", linkTarget: link });
  });

  test("PAX path, linkpath and size", async () => {
    const long = `srv/${"p".repeat(300)}/data`;
    expect((await scan(tar(pax({ path: long }), file("short", "pax content")), long)).content).toBe("pax content");
    expect((await scan(tar(pax({ path: "a/real" }), file("a/fake", "1")), "a/fake")).verdict).toEqual({ kind: "absent" });
    expect((await scan(tar(pax({ linkpath: "/very/long/target" }), symlink("l", "x")), "l")).verdict).toEqual({ kind: "symlink", linkTarget: "/very/long/target" });
    // PAX size wins over the header's size field (which is 0 for files ≥ 8 GiB).
    expect((await scan(tar(pax({ size: "5" }), file("big", "12345", { sizeField: 0 }), file("next", "n")), "next")).content).toBe("n");
    expect((await scan(tar(pax({ size: "5" }), file("big", "12345", { sizeField: 0 })), "big")).content).toBe("12345");
    expect(parsePax(Buffer.from("30 mtime=1350244992.023960108\n14 path=a/b/c\n"))).toEqual({ mtime: "1350244992.023960108", path: "a/b/c" });
    expect(() => parsePax(Buffer.from("99 path=x\n"))).toThrow(ContentError);
  });

  test("a global PAX header (g) is read past", async () => {
    const g = entry({ name: "pax_global_header", type: "g", content: "17 comment=hello\n" });
    expect((await scan(tar(g, file("x", "after global")), "x")).content).toBe("after global");
  });

  test("base-256 size field", async () => {
    expect((await scan(tar(file("b", "base256", { base256: true, format: "gnu" }), file("c", "c")), "b")).content).toBe("base256");
    expect((await scan(tar(file("b", "base256", { base256: true, format: "gnu" }), file("c", "c")), "c")).content).toBe("c");
  });

  test("a later entry for the same path wins", async () => {
    const twice = await scan(tar(file("x", "first"), file("y", "other"), file("x", "second")), "x");
    expect(twice.content).toBe("second");
    expect(twice.sink.begins).toBe(2);
    expect((await scan(tar(file("x", "first"), symlink("x", "elsewhere")), "x")).verdict).toEqual({ kind: "symlink", linkTarget: "elsewhere" });
    expect((await scan(tar(symlink("x", "elsewhere"), file("x", "real")), "x")).content).toBe("real");
  });
});

describe("TarScanner: what is not a regular file", () => {
  test("symlink, directory, device, fifo at the path", async () => {
    expect((await scan(tar(symlink("usr/bin/k", "../lib/k")), "usr/bin/k")).verdict).toEqual({ kind: "symlink", linkTarget: "../lib/k" });
    expect((await scan(tar(dir("etc/conf.d")), "etc/conf.d")).verdict).toEqual({ kind: "directory" });
    expect((await scan(tar(entry({ name: "dev/null", type: "3" })), "dev/null")).verdict).toEqual({ kind: "special", type: "char-device" });
    expect((await scan(tar(entry({ name: "p", type: "6" })), "p")).verdict).toEqual({ kind: "special", type: "fifo" });
  });

  test("a hard link names its target (normalised); its size field carries no data", async () => {
    const archive = tar(file("bin/real", "content"), entry({ name: "bin/alias", type: "1", linkname: "./bin/real", sizeField: 7 }), file("z", "after"));
    expect((await scan(archive, "bin/alias")).verdict).toEqual({ kind: "hardlink", linkTarget: "bin/real" });
    expect((await scan(archive, "z")).content).toBe("after");
  });

  test("a parent that is a symlink or file blocks the path", async () => {
    expect((await scan(tar(symlink("bin", "usr/bin")), "bin/tool")).verdict).toEqual({ kind: "blocked", parent: "bin", type: "symlink", linkTarget: "usr/bin" });
    expect((await scan(tar(dir("a"), file("a/b", "f")), "a/b/c")).verdict).toEqual({ kind: "blocked", parent: "a/b", type: "file" });
    expect((await scan(tar(dir("a"), dir("a/b")), "a/b/c")).verdict).toEqual({ kind: "absent" });
  });
});

describe("TarScanner: whiteouts", () => {
  const cases: [string, Buffer, LayerVerdict][] = [
    ["the file's own whiteout", tar(dir("etc"), file("etc/.wh.app.conf", "")), { kind: "deleted", whiteout: "etc/.wh.app.conf" }],
    ["a parent directory's whiteout", tar(file(".wh.etc", "")), { kind: "deleted", whiteout: ".wh.etc" }],
    ["an opaque parent directory", tar(dir("etc"), file("etc/.wh..wh..opq", "")), { kind: "deleted", whiteout: "etc/.wh..wh..opq" }],
    ["an opaque grandparent", tar(file(".wh..wh..opq", "")), { kind: "deleted", whiteout: ".wh..wh..opq" }],
    ["a sibling's whiteout", tar(file("etc/.wh.app.conf.bak", "")), { kind: "absent" }],
    ["an opaque sibling directory", tar(file("etc/other/.wh..wh..opq", "")), { kind: "absent" }],
    ["aufs bookkeeping (.wh..wh.plnk)", tar(file("etc/.wh..wh.plnk", "")), { kind: "absent" }],
    ["a whiteout of a longer name", tar(file(".wh.et", "")), { kind: "absent" }],
    // Whiteouts apply to lower layers: the same layer's own entry for the path wins.
    ["whiteout and new file in one layer", tar(file("etc/.wh..wh..opq", ""), file("etc/app.conf", "new")), { kind: "file", size: 3, mode: 0o644 }],
  ];
  for (const [name, archive, want] of cases) {
    test(name, async () => {
      expect((await scan(archive, "etc/app.conf")).verdict).toEqual(want);
    });
  }
});

describe("TarScanner: broken archives", () => {
  test("a corrupt header checksum", async () => {
    const bad = tar(file("x", "1"));
    bad[0] = "y".charCodeAt(0);
    await expect(scan(bad, "x")).rejects.toThrow("checksum mismatch");
  });
  test("cut off inside an entry or a header", async () => {
    const archive = tar(file("x", "12345678"));
    await expect(scan(archive.subarray(0, 515), "x")).rejects.toThrow("truncated inside an entry");
    await expect(scan(archive.subarray(0, 100), "x")).rejects.toThrow("truncated inside a header");
  });
  test("an archive without end marker is fine (Go's archive/tar agrees)", async () => {
    expect((await scan(file("x", "1"), "x")).content).toBe("1");
  });
  test("a file larger than the limit", async () => {
    await expect(scan(tar(file("x", "123456")), "x", { max: 5 })).rejects.toThrow("x is 6 bytes, more than the limit of 5 bytes");
    expect((await scan(tar(file("x", "123456"), file("y", "1")), "y", { max: 5 })).content).toBe("1"); // only the wanted file counts
  });
  test("non-octal numbers", async () => {
    const bad = header({ name: "x" }, 1);
    bad.write("zz", 124, "utf8");
    await expect(scan(Buffer.concat([bad, Buffer.alloc(1024)]), "x")).rejects.toThrow(ContentError);
  });
});

// --- whole layers: decompression and digest verification ---

const digestOf = (b: Uint8Array) => `sha256:${createHash("sha256").update(b).digest("hex")}`;

async function* chunks(data: Uint8Array, size = 1000): AsyncGenerator<Uint8Array> {
  for (let i = 0; i < data.length; i += size) yield data.subarray(i, i + size);
}

async function readLayer(blob: Uint8Array, target: string, opts: { digest?: string; size?: number; max?: number; maxUnpacked?: number; sink?: FileSink } = {}) {
  const sink = memorySink();
  const verdict = await scanLayer(chunks(blob), {
    digest: opts.digest ?? digestOf(blob),
    size: opts.size ?? blob.length,
    target,
    sink: opts.sink ?? sink,
    maxFileBytes: opts.max ?? 1 << 30,
    maxUnpackedBytes: opts.maxUnpacked ?? 1 << 30,
  });
  return { verdict, content: sink.content() };
}

describe("scanLayer", () => {
  const big = Buffer.alloc(3 << 20, "0123456789abcdef"); // several zlib output chunks
  const archive = tar(dir("etc"), file("etc/app.conf", "hello"), file("opt/big.bin", big.toString("latin1")));
  const layers: [string, Uint8Array][] = [
    ["plain tar", archive],
    ["gzip", gzipSync(archive)],
    ["zstd", zstdCompressSync(archive)],
  ];
  for (const [name, blob] of layers) {
    test(`${name}: finds the file and verifies the digest`, async () => {
      expect(await readLayer(blob, "etc/app.conf")).toEqual({ verdict: { kind: "file", size: 5, mode: 0o644 }, content: "hello" });
      const got = await readLayer(blob, "opt/big.bin");
      expect(got.content.length).toBe(big.length);
      expect(got.content === big.toString("latin1")).toBe(true);
      expect((await readLayer(blob, "nope")).verdict).toEqual({ kind: "absent" });
    });
  }

  test("compression is told by the bytes, not the media type", () => {
    expect(sniffCompression(gzipSync(archive))).toBe("gzip");
    expect(sniffCompression(zstdCompressSync(archive))).toBe("zstd");
    expect(sniffCompression(archive)).toBe("none");
    expect(() => sniffCompression(Buffer.from([0xfd, 0x37, 0x7a, 0x58, 0x5a, 0x00]))).toThrow("xz");
  });

  test("a digest mismatch is a TransferError naming both digests — even when the damage also breaks gzip", async () => {
    const blob = Buffer.from(gzipSync(archive));
    const expected = digestOf(blob);
    blob[blob.length >> 1] = (blob[blob.length >> 1] as number) ^ 0xff;
    const err = await readLayer(blob, "etc/app.conf", { digest: expected }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(TransferError);
    expect(String(err)).toContain(`expected ${expected}, got ${digestOf(blob)}`);
  });

  test("more bytes than the manifest declares: TransferError, without reading on", async () => {
    const blob = gzipSync(archive);
    const err = await readLayer(blob, "etc/app.conf", { size: 100 }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(TransferError);
    expect(String(err)).toContain("longer than the 100 bytes");
  });

  test("a verified blob that is not a tar, or broken gzip: ContentError", async () => {
    const garbage = Buffer.alloc(2048, 7);
    expect(await readLayer(garbage, "x").catch((e: unknown) => e)).toBeInstanceOf(ContentError);
    const cut = gzipSync(archive).subarray(0, 2000);
    const err = await readLayer(cut, "etc/app.conf").catch((e: unknown) => e);
    expect(err).toBeInstanceOf(ContentError);
  });

  test("an empty blob is an empty layer", async () => {
    expect((await readLayer(new Uint8Array(), "x")).verdict).toEqual({ kind: "absent" });
  });

  test("a layer that unpacks to more than the limit (a decompression bomb): ContentError naming the layer, unpacking stops there", async () => {
    // 64 MiB of zeros in a tar: 64 KiB as gzip, 2 KiB as zstd.
    const bomb = tar(file("opt/zeros", "\0".repeat(64 << 20)), file("etc/after", "x"));
    for (const blob of [gzipSync(bomb), zstdCompressSync(bomb), bomb]) {
      let written = 0;
      const counting: FileSink = { begin: async () => {}, write: async (c) => void (written += c.length) };
      const started = performance.now();
      const err = await readLayer(blob, "opt/zeros", { maxUnpacked: 1 << 20, sink: counting }).catch((e: unknown) => e);
      expect(err).toBeInstanceOf(ContentError);
      expect(String(err)).toContain(`layer ${digestOf(blob)} unpacks to more than 1048576 bytes, the limit for one layer`);
      expect(written).toBeLessThan(2 << 20); // one output chunk past the limit at most
      expect(performance.now() - started).toBeLessThan(2_000);
      // Under the limit the same layer reads.
      expect((await readLayer(blob, "etc/after", { maxUnpacked: 65 << 20 })).content).toBe("x");
    }
  });

  test("too large a file: ContentError after the digest checked out", async () => {
    const err = await readLayer(gzipSync(archive), "opt/big.bin", { max: 1 << 20 }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(ContentError);
    expect(String(err)).toContain("more than the limit of 1048576 bytes");
  });
});

async function search(layerTars: Buffer[], target: string) {
  const reads: [number, string][] = [];
  const decision = await searchLayers(layerTars.length, target, async (i, path) => {
    reads.push([i, path]);
    const sink = memorySink();
    const verdict = await scanLayer(chunks(layerTars[i] as Buffer), { digest: digestOf(layerTars[i] as Buffer), size: (layerTars[i] as Buffer).length, target: path, sink, maxFileBytes: 1 << 30, maxUnpackedBytes: 1 << 30 });
    return { verdict, sink };
  });
  return { decision, reads, content: decision?.sink?.content() };
}

describe("searchLayers: the topmost layer that knows the path decides", () => {

  test("an upper layer's file shadows the lower one; lower layers are not read", async () => {
    const got = await search([tar(file("etc/x", "v1")), tar(file("etc/y", "?")), tar(file("etc/x", "v3"))], "etc/x");
    expect(got.decision).toMatchObject({ layer: 2, verdict: { kind: "file" } });
    expect(got.content).toBe("v3");
    expect(got.reads).toEqual([[2, "etc/x"]]);
  });

  test("falls through layers that do not have it", async () => {
    const got = await search([tar(file("etc/x", "bottom")), tar(file("etc/y", "?")), tar(file("z", "?"))], "etc/x");
    expect(got.content).toBe("bottom");
    expect(got.reads.map(([i]) => i)).toEqual([2, 1, 0]);
  });

  test("a whiteout in an upper layer hides the lower file: deleted, at that layer", async () => {
    for (const upper of [tar(file("etc/.wh.x", "")), tar(file(".wh.etc", "")), tar(file("etc/.wh..wh..opq", ""))]) {
      const got = await search([tar(file("etc/x", "bottom")), upper, tar(file("other", "?"))], "etc/x");
      expect(got.decision).toMatchObject({ layer: 1, verdict: { kind: "deleted" } });
    }
  });

  test("a file re-added above a whiteout is found", async () => {
    const got = await search([tar(file("etc/x", "v1")), tar(file("etc/.wh.x", "")), tar(file("etc/x", "v3"))], "etc/x");
    expect(got.content).toBe("v3");
  });

  test("a hard link is read from its layer again, for the entry it names", async () => {
    const got = await search([tar(file("bin/real", "linked content"), hardlink("bin/alias", "bin/real"))], "bin/alias");
    expect(got.decision).toMatchObject({ layer: 0, verdict: { kind: "file" }, hardlinkTo: "bin/real" });
    expect(got.content).toBe("linked content");
    expect(got.reads).toEqual([
      [0, "bin/alias"],
      [0, "bin/real"],
    ]);
  });

  test("nowhere: undefined", async () => {
    expect((await search([tar(file("a", "1")), tar(file("b", "2"))], "c")).decision).toBeUndefined();
  });
});

// Nothing of a layer is unpacked: the one entry asked for streams into the cache file, so no entry can
// write anywhere, and content only ever comes from the layer's own bytes, never from the host.
describe("hostile entries stay inside the layer", () => {
  test("names climbing out with '..' never match; an absolute name is the image's root (as containerd reads it)", async () => {
    const layer = tar(file("../etc/passwd", "evil 1"), file("a/../../etc/passwd", "evil 2"), file("./../../etc/passwd", "evil 3"), file("/etc/hosts", "absolute"));
    expect((await search([layer], "etc/passwd")).decision).toBeUndefined();
    expect((await search([layer], "etc/hosts")).content).toBe("absolute");
  });

  test("a symlink to outside, then a file through it: the file is the entry's own bytes; the link is never followed", async () => {
    expect((await search([tar(symlink("etc", "/../../host-etc"), file("etc/shadow", "the layer's"))], "etc/shadow")).content).toBe("the layer's");
    expect((await search([tar(symlink("usr/bin", "../../../../etc"))], "usr/bin/tool")).decision?.verdict).toEqual({ kind: "blocked", parent: "usr/bin", type: "symlink", linkTarget: "../../../../etc" });
    expect((await search([tar(symlink("usr/bin/tool", "/etc/shadow"))], "usr/bin/tool")).decision?.verdict).toEqual({ kind: "symlink", linkTarget: "/etc/shadow" });
  });

  test("a hard link to /etc/shadow or ../../etc/shadow is looked up in the same layer, never on the host", async () => {
    for (const [to, named] of [
      ["/etc/shadow", "etc/shadow"],
      ["../../etc/shadow", "../../etc/shadow"],
    ]) {
      const got = await search([tar(hardlink("app/secret", to as string))], "app/secret");
      expect(got.decision).toMatchObject({ layer: 0, hardlinkTo: named, verdict: { kind: "absent" } });
      expect(got.content).toBe("");
    }
    expect((await search([tar(file("etc/shadow", "the layer's own"), hardlink("app/secret", "/etc/shadow"))], "app/secret")).content).toBe("the layer's own");
  });
});

describe("manifests", () => {
  const d = (c: string) => `sha256:${c.repeat(64)}`;
  const index = {
    schemaVersion: 2,
    mediaType: "application/vnd.oci.image.index.v1+json",
    manifests: [
      { mediaType: "application/vnd.oci.image.manifest.v1+json", digest: d("a"), size: 1, platform: { os: "linux", architecture: "amd64" } },
      { mediaType: "application/vnd.oci.image.manifest.v1+json", digest: d("b"), size: 1, platform: { os: "linux", architecture: "arm", variant: "v7" } },
      { mediaType: "application/vnd.oci.image.manifest.v1+json", digest: d("c"), size: 1, platform: { os: "linux", architecture: "arm64", variant: "v8" } },
      { mediaType: "application/vnd.oci.image.manifest.v1+json", digest: d("e"), size: 1, platform: { os: "unknown", architecture: "unknown" } },
    ],
  };
  const parse = (doc: unknown, type?: string) => parseManifest(Buffer.from(JSON.stringify(doc)), type, "sha256:x");

  test("an index: linux/<arch> is picked", () => {
    const m = parse(index);
    if (m.kind !== "index") throw new Error("not an index");
    expect(pickPlatform(m, "amd64", "sha256:x").digest).toBe(d("a"));
    expect(pickPlatform(m, "arm64", "sha256:x").digest).toBe(d("c"));
    const windowsOnly = { manifests: [{ ...index.manifests[0], platform: { os: "windows", architecture: "amd64" } }] };
    const windows = parse(windowsOnly);
    if (windows.kind !== "index") throw new Error("not an index");
    expect(() => pickPlatform(windows, "amd64", "sha256:x")).toThrow("no linux/amd64 image (it has: windows/amd64)");
  });

  test("Docker schema 2 and OCI manifests, with and without mediaType", () => {
    const manifest = { schemaVersion: 2, config: { digest: d("1"), size: 2 }, layers: [{ mediaType: "application/vnd.docker.image.rootfs.diff.tar.gzip", digest: d("2"), size: 3 }] };
    expect(parse({ ...manifest, mediaType: "application/vnd.docker.distribution.manifest.v2+json" })).toMatchObject({ kind: "manifest", layers: [{ digest: d("2"), size: 3 }] });
    expect(parse(manifest, "application/vnd.oci.image.manifest.v1+json")).toMatchObject({ kind: "manifest" });
    expect(parse(manifest)).toMatchObject({ kind: "manifest" });
    expect(parse({ schemaVersion: 2, manifests: index.manifests }, "application/vnd.docker.distribution.manifest.list.v2+json")).toMatchObject({ kind: "index" });
  });

  test("refused: schema 1, other artifacts, bad descriptors", () => {
    expect(() => parse({ schemaVersion: 1, fsLayers: [] })).toThrow("schema 1");
    expect(() => parse({ schemaVersion: 2, mediaType: "application/vnd.example+json" })).toThrow("not an image manifest");
    expect(() => parse({ schemaVersion: 2, config: { digest: d("1"), size: 2 }, layers: [{ digest: "md5:x", size: 1 }] })).toThrow("no sha256 digest");
    expect(() => parseManifest(Buffer.from("{"), undefined, "sha256:x")).toThrow("not JSON");
  });
});
