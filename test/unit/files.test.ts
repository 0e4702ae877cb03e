// src/host/files.ts over a temporary root: round trips, exact modes whatever the umask, atomic replace,
// path validation, symlinks resolved within the root, hostile neighbours, and temp-file cleanup.
import { describe, expect, test } from "bun:test";
import { createHash } from "node:crypto";
import { chmodSync, chownSync, existsSync, lchownSync, lstatSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, statSync, symlinkSync, writeFileSync } from "node:fs";
import { open, readFile } from "node:fs/promises";
import { checkNodePath, createFiles, FileError, type Files, maxTreeDepth } from "../../src/host/files.ts";
import { runDir } from "../harness/exec.ts";

const runOk = (cmd: string[]) => {
  const r = Bun.spawnSync(cmd, { stderr: "pipe" });
  if (r.exitCode !== 0) throw new Error(`${cmd.join(" ")} exited ${r.exitCode}: ${r.stderr.toString()}`);
};

const base = runDir("files-unit"); // kept for post-mortems like every run directory; big files are removed

/** A fresh, empty root for one test. */
function fresh(): { root: string; files: Files } {
  const root = mkdtempSync(`${base}/root-`);
  return { root, files: createFiles(root) };
}

const modeOf = (p: string) => statSync(p).mode & 0o7777;
const sha = (data: string | Uint8Array) => createHash("sha256").update(data).digest("hex");
const text = (data: Uint8Array | undefined) => (data === undefined ? undefined : new TextDecoder().decode(data));
const tempsIn = (dir: string) => readdirSync(dir).filter((n) => n.includes(".trellis-tmp-"));

/** Runs `fn` with the process umask set to `mask`, restoring the previous one afterwards. */
async function withUmask<T>(mask: number, fn: () => Promise<T>): Promise<T> {
  const previous = process.umask(mask);
  try {
    return await fn();
  } finally {
    process.umask(previous);
  }
}

/** The FileError `promise` rejects with (fails the test if it resolves or throws anything else). */
async function fileError(promise: Promise<unknown>): Promise<FileError> {
  const err = await promise.then(
    () => undefined,
    (e: unknown) => e,
  );
  expect(err).toBeInstanceOf(FileError);
  return err as FileError;
}

describe("round trips", () => {
  test("write then read, sha256 and stat; missing paths give undefined", async () => {
    const { root, files } = fresh();
    await files.writeAtomic("/etc/motd", "hello\n", 0o644);
    const bytes = new Uint8Array([0, 1, 2, 255, 10]);
    await files.writeAtomic("/etc/bin.dat", bytes, 0o600);

    expect(text(await files.read("/etc/motd"))).toBe("hello\n");
    expect(readFileSync(`${root}/etc/motd`, "utf8")).toBe("hello\n");
    expect([...((await files.read("/etc/bin.dat")) ?? [])]).toEqual([...bytes]);
    expect(await files.sha256("/etc/motd")).toBe(sha("hello\n"));
    expect(await files.sha256("/etc/bin.dat")).toBe(sha(bytes));
    expect(await files.stat("/etc/motd")).toEqual({ mode: 0o644, size: 6, kind: "file" });
    expect(await files.stat("/etc")).toMatchObject({ mode: 0o755, kind: "dir" });

    for (const missing of ["/etc/nope", "/nope/deeper", "/etc/motd/under-a-file"]) {
      expect(await files.read(missing)).toBeUndefined();
      expect(await files.stat(missing)).toBeUndefined();
      expect(await files.sha256(missing)).toBeUndefined();
    }
  });

  test("sha256 of an empty file and of a file larger than one read buffer", async () => {
    const { files } = fresh();
    const big = new Uint8Array(3 * 1024 * 1024 + 7).map((_, i) => i % 251);
    await files.writeAtomic("/empty", "", 0o644);
    await files.writeAtomic("/big", big, 0o644);
    expect(await files.sha256("/empty")).toBe(sha(""));
    expect(await files.sha256("/big")).toBe(sha(big));
    expect(await files.stat("/big")).toMatchObject({ size: big.length });
    expect(await files.remove("/big")).toBe(true);
  });

  test("stat does not follow a final symlink; read does; writeAtomic replaces the link, not its target", async () => {
    const { root, files } = fresh();
    await files.writeAtomic("/etc/real", "real\n", 0o644);
    symlinkSync("real", `${root}/etc/link`);
    expect(await files.stat("/etc/link")).toEqual({ mode: 0o777, size: 4, kind: "symlink" });
    expect(text(await files.read("/etc/link"))).toBe("real\n");

    await files.writeAtomic("/etc/link", "new\n", 0o600);
    expect(lstatSync(`${root}/etc/link`).isFile()).toBe(true);
    expect(readFileSync(`${root}/etc/real`, "utf8")).toBe("real\n");
  });

  test("a bounded read: up to maxBytes is read, a larger file is a FileError naming its size, a FIFO is refused without blocking", async () => {
    const { root, files } = fresh();
    await files.writeAtomic("/etc/ca.pem", "x".repeat(100), 0o644);
    expect(text(await files.read("/etc/ca.pem", { maxBytes: 100 }))).toBe("x".repeat(100));
    expect(await files.read("/etc/none.pem", { maxBytes: 100 })).toBeUndefined();
    const big = await fileError(files.read("/etc/ca.pem", { maxBytes: 99 }));
    expect(big).toMatchObject({ op: "read", path: "/etc/ca.pem", reason: "is 100 bytes, more than the limit of 99" });
    runOk(["mkfifo", `${root}/etc/fifo`]);
    const started = performance.now();
    expect((await fileError(files.read("/etc/fifo", { maxBytes: 100 }))).reason).toBe("is a FIFO, not a regular file");
    expect(performance.now() - started).toBeLessThan(1000);
  });

  test("a bounded read of a file with no size to go by (procfs) stops past the limit", async () => {
    const files = createFiles("/");
    expect((await files.read("/proc/self/status", { maxBytes: 1 << 20 }))?.byteLength).toBeGreaterThan(100);
    expect((await fileError(files.read("/proc/self/status", { maxBytes: 10 }))).reason).toBe("grew past the limit of 10 bytes while it was read");
  });

  test("reading a directory is a FileError, not undefined", async () => {
    const { files } = fresh();
    await files.writeAtomic("/d/f", "x", 0o644);
    const err = await fileError(files.read("/d"));
    expect(err).toMatchObject({ op: "read", path: "/d" });
    expect(err.message).toContain('read "/d"');
    expect(err.message).toContain("EISDIR");
  });
});

describe("modes", () => {
  const modes = [0o600, 0o644, 0o755, 0o640];
  test.each([0o077, 0o000])("files get exactly the requested mode under umask %o", async (mask) => {
    const { root, files } = fresh();
    await withUmask(mask, async () => {
      for (const mode of modes) {
        const path = `/m/${mode.toString(8)}`;
        await files.writeAtomic(path, "content", mode);
        expect(modeOf(root + path)).toBe(mode);
        // an overwrite with another mode changes it exactly, too
        await files.writeAtomic(path, "again", 0o604);
        expect(modeOf(root + path)).toBe(0o604);
        await files.writeAtomic(path, "content", mode);
        expect((await files.stat(path))?.mode).toBe(mode);
      }
    });
  });

  test("missing parents are created 0755 whatever the umask; existing ones keep their mode", async () => {
    const { root, files } = fresh();
    mkdirSync(`${root}/private`, { mode: 0o700 });
    await withUmask(0o077, () => files.writeAtomic("/private/a/b/c/file", "x", 0o600));
    expect(modeOf(`${root}/private`)).toBe(0o700);
    for (const dir of ["/private/a", "/private/a/b", "/private/a/b/c"]) expect(modeOf(root + dir)).toBe(0o755);
    await withUmask(0o000, () => files.writeAtomic("/open/x", "x", 0o600));
    expect(modeOf(`${root}/open`)).toBe(0o755);
  });

  test.each([-1, 0o10000, 1.5, Number.NaN])("mode %p is refused before anything is written", async (mode) => {
    const { root, files } = fresh();
    const err = await fileError(files.writeAtomic("/x/y", "x", mode));
    expect(err).toMatchObject({ op: "writeAtomic", path: "/x/y" });
    expect(existsSync(`${root}/x`)).toBe(false);
  });
});

describe("atomic replace", () => {
  test("an overwrite is a new inode; a reader holding the old file keeps the old content", async () => {
    const { root, files } = fresh();
    await files.writeAtomic("/etc/conf", "old content\n", 0o644);
    const before = statSync(`${root}/etc/conf`).ino;
    const held = await open(`${root}/etc/conf`, "r");
    try {
      await files.writeAtomic("/etc/conf", "new content\n", 0o644);
      expect(statSync(`${root}/etc/conf`).ino).not.toBe(before);
      expect(await held.readFile("utf8")).toBe("old content\n");
      expect(readFileSync(`${root}/etc/conf`, "utf8")).toBe("new content\n");
    } finally {
      await held.close();
    }
    expect(tempsIn(`${root}/etc`)).toEqual([]);
  });

  test("while a large write is in flight, readers see the complete old content, then the complete new one", async () => {
    const { root, files } = fresh();
    const size = 32 * 1024 * 1024;
    const oldContent = Buffer.alloc(size, 0x41);
    const newContent = Buffer.alloc(size, 0x42);
    await files.writeAtomic("/var/big", oldContent, 0o644);

    // A reader must have looked while the temp file existed, or the test proved nothing; on a busy machine
    // one write may finish before the reader got a turn, so the write is repeated (alternating contents).
    let oldWhileTempExisted = 0;
    for (let attempt = 0; attempt < 10 && oldWhileTempExisted === 0; attempt++) {
      const [before, after] = attempt % 2 === 0 ? [oldContent, newContent] : [newContent, oldContent];
      let done = false;
      const writing = files.writeAtomic("/var/big", after, 0o644).finally(() => (done = true));
      while (!done) {
        const temps = tempsIn(`${root}/var`);
        const content = await readFile(`${root}/var/big`);
        const kind = content.equals(before) ? "before" : content.equals(after) ? "after" : "torn";
        expect(kind).not.toBe("torn");
        if (kind === "before" && temps.length > 0) oldWhileTempExisted++;
      }
      await writing;
    }
    expect(oldWhileTempExisted).toBeGreaterThan(0);
    await files.writeAtomic("/var/big", newContent, 0o644);
    expect(text((await files.read("/var/big"))?.subarray(0, 3))).toBe("BBB");
    expect(tempsIn(`${root}/var`)).toEqual([]);
    expect(await files.remove("/var/big")).toBe(true);
  }, 30_000);

  test("writeAtomic over a directory is a FileError naming the path, and leaves no temp file", async () => {
    const { root, files } = fresh();
    await files.writeAtomic("/etc/systemd/system/x.service.d/10.conf", "[Service]\n", 0o644);
    const err = await fileError(files.writeAtomic("/etc/systemd/system/x.service.d", "oops", 0o644));
    expect(err).toMatchObject({ op: "writeAtomic", path: "/etc/systemd/system/x.service.d" });
    expect(err.message).toContain('"/etc/systemd/system/x.service.d"');
    expect(err.message).toContain("is a directory");
    expect(statSync(`${root}/etc/systemd/system/x.service.d`).isDirectory()).toBe(true);
    expect(readdirSync(`${root}/etc/systemd/system`)).toEqual(["x.service.d"]);
    await fileError(files.writeAtomic("/", "x", 0o644));
  });

  test("a file where a parent directory should be is a FileError", async () => {
    const { files } = fresh();
    await files.writeAtomic("/etc/file", "x", 0o644);
    const err = await fileError(files.writeAtomic("/etc/file/sub/y", "y", 0o644));
    expect(err).toMatchObject({ op: "writeAtomic", path: "/etc/file/sub/y" });
    expect(err.message).toContain("not a directory");
  });
});

describe("remove, removeDirIfEmpty, list", () => {
  test("remove deletes files and symlinks, says false when nothing was there, refuses directories", async () => {
    const { root, files } = fresh();
    await files.writeAtomic("/a/f", "x", 0o644);
    symlinkSync("/nowhere", `${root}/a/dangling`);
    expect(await files.remove("/a/f")).toBe(true);
    expect(existsSync(`${root}/a/f`)).toBe(false);
    expect(await files.remove("/a/f")).toBe(false);
    expect(await files.remove("/missing/f")).toBe(false);
    expect(await files.remove("/a/dangling")).toBe(true);
    expect(lstatSync(`${root}/a`).isDirectory()).toBe(true);
    const err = await fileError(files.remove("/a"));
    expect(err.message).toContain('remove "/a"');
    expect(err.message).toContain("is a directory");
  });

  test("removeDirIfEmpty removes only empty directories and refuses files", async () => {
    const { root, files } = fresh();
    await files.writeAtomic("/d/sub/f", "x", 0o644);
    expect(await files.removeDirIfEmpty("/d")).toBe(false);
    expect(await files.removeDirIfEmpty("/d/sub")).toBe(false);
    expect(await files.remove("/d/sub/f")).toBe(true);
    expect(await files.removeDirIfEmpty("/d/sub")).toBe(true);
    expect(existsSync(`${root}/d/sub`)).toBe(false);
    expect(await files.removeDirIfEmpty("/d/sub")).toBe(false);
    expect(await files.removeDirIfEmpty("/d")).toBe(true);
    await files.writeAtomic("/file", "x", 0o644);
    expect((await fileError(files.removeDirIfEmpty("/file"))).message).toContain("not a directory");
    expect(await files.removeDirIfEmpty("/file/under")).toBe(false);
  });

  test("list gives sorted names, [] for a missing directory, and refuses a file", async () => {
    const { files } = fresh();
    for (const name of ["b", "a", "c.conf", ".hidden"]) await files.writeAtomic(`/l/${name}`, name, 0o644);
    await files.writeAtomic("/l/sub/x", "x", 0o644);
    expect(await files.list("/l")).toEqual([".hidden", "a", "b", "c.conf", "sub"]);
    expect(await files.list("/missing")).toEqual([]);
    expect(await files.list("/l/a/under-a-file")).toEqual([]);
    expect((await fileError(files.list("/l/a"))).message).toContain('list "/l/a"');
  });
});

describe("removeTree", () => {
  /** /d with files, a subdirectory, a hidden file, and symlinks to a directory and a file outside it. */
  function tree() {
    const { root, files } = fresh();
    mkdirSync(`${root}/d/sub/deeper`, { recursive: true });
    mkdirSync(`${root}/outside`);
    writeFileSync(`${root}/outside/keep`, "keep");
    for (const p of ["/d/a.conf", "/d/.hidden", "/d/sub/b", "/d/sub/deeper/c"]) writeFileSync(`${root}${p}`, p);
    symlinkSync(`${root}/outside`, `${root}/d/to-dir`);
    symlinkSync("/outside/keep", `${root}/d/sub/to-file`);
    return { root, files };
  }

  test("removes a directory with everything below it, links as links (what they name stays); false when nothing is there", async () => {
    const { root, files } = tree();
    expect(await files.removeTree("/d")).toBe(true);
    expect(existsSync(`${root}/d`)).toBe(false);
    expect(readdirSync(`${root}/outside`)).toEqual(["keep"]);
    expect(await files.removeTree("/d")).toBe(false);
    expect(await files.removeTree("/missing/d")).toBe(false);
  });

  test("a symlink or a file at the path is removed itself, never followed", async () => {
    const { root, files } = tree();
    symlinkSync(`${root}/d`, `${root}/link`);
    expect(await files.removeTree("/link")).toBe(true);
    expect(existsSync(`${root}/link`)).toBe(false);
    expect(readdirSync(`${root}/d`).sort()).toEqual([".hidden", "a.conf", "sub", "to-dir"]);
    expect(await files.removeTree("/d/a.conf")).toBe(true);
    expect(existsSync(`${root}/d/a.conf`)).toBe(false);
  });

  test("what a removal cut short left (a kill midway) is removed by the next", async () => {
    const { root, files } = tree();
    Bun.spawnSync(["rm", "-rf", `${root}/d/sub/deeper`, `${root}/d/a.conf`]);
    expect(await files.removeTree("/d")).toBe(true);
    expect(existsSync(`${root}/d`)).toBe(false);
  });

  test("a directory in the tree that another user owns or may write in is not emptied: an error, and its parents stay", async () => {
    for (const [how, setup, message] of [
      ["owned by another user", (p: string) => chownSync(p, 4242, 4242), "is owned by uid 4242, not root"],
      ["world-writable", (p: string) => chmodSync(p, 0o777), "is writable by other users"],
      ["world-writable and sticky", (p: string) => chmodSync(p, 0o1777), "is writable by other users"],
      ["group-writable by another group", (p: string) => (chownSync(p, 0, 4242), chmodSync(p, 0o775)), "is writable by other users"],
    ] as const) {
      const { root, files } = tree();
      setup(`${root}/d/sub/deeper`);
      const err = await fileError(files.removeTree("/d"));
      expect({ how, message: err.message }).toEqual({ how, message: expect.stringContaining(`/d/sub/deeper ${message}`) });
      expect(readFileSync(`${root}/d/sub/deeper/c`, "utf8")).toBe("/d/sub/deeper/c");
      expect(existsSync(`${root}/d/sub`)).toBe(true);
    }
    const { root, files } = tree();
    chownSync(`${root}/d`, 4242, 4242);
    expect((await fileError(files.removeTree("/d"))).message).toContain("/d is owned by uid 4242, not root");
    expect(readdirSync(`${root}/d`)).toContain("a.conf");
  });

  test("another user's file in a directory root owns is removed (as rm -rf does)", async () => {
    const { root, files } = tree();
    chownSync(`${root}/d/sub/b`, 4242, 4242);
    lchownSync(`${root}/d/to-dir`, 4242, 4242);
    expect(await files.removeTree("/d")).toBe(true);
    expect(existsSync(`${root}/d`)).toBe(false);
  });

  test(`a tree deeper than ${maxTreeDepth} levels is refused, not a reason to run out of descriptors`, async () => {
    const { root, files } = fresh();
    const deep = `${root}/t/${Array.from({ length: maxTreeDepth + 1 }, (_, i) => `l${i}`).join("/")}`;
    mkdirSync(deep, { recursive: true });
    expect((await fileError(files.removeTree("/t"))).message).toContain(`is more than ${maxTreeDepth} levels deep`);
    expect(existsSync(deep)).toBe(true);
  });

  test("the path goes through the same checks as any other: no walking through a directory others may rename entries in", async () => {
    const { root, files } = fresh();
    mkdirSync(`${root}/open/d`, { recursive: true });
    chmodSync(`${root}/open`, 0o777);
    writeFileSync(`${root}/open/d/x`, "x");
    expect((await fileError(files.removeTree("/open/d/x"))).message).toContain("lets other users rename d");
    expect(existsSync(`${root}/open/d/x`)).toBe(true);
  });

  test("the root itself cannot be removed", async () => {
    const { files } = fresh();
    expect((await fileError(files.removeTree("/"))).message).toContain("cannot remove the root directory");
  });
});

describe("node paths", () => {
  test.each([
    ["", "is not absolute"],
    ["etc/hosts", "is not absolute"],
    ["./etc", "is not absolute"],
    ["/etc/../root/.ssh", '".."'],
    ["/..", '".."'],
    ["/a/./b", '"."'],
    ["/.", '"."'],
    ["//etc", '"//"'],
    ["/etc//hosts", '"//"'],
    ["/etc/", "trailing slash"],
    ["/etc/hosts\0.bak", "NUL"],
    [`/etc/${"n".repeat(256)}`, "a name of 256 bytes, more than Linux's limit of 255"],
    [`/etc/${"é".repeat(128)}`, "a name of 256 bytes"],
    [`/etc/${"€".repeat(85)}a`, "a name of 256 bytes"],
    [`/etc/${"😀".repeat(64)}`, "a name of 256 bytes"],
    [`/${Array(410).fill("abcdefghi").join("/")}`, "is 4100 bytes long, more than Linux's limit of 4095"],
  ])("%p is rejected", async (path, why) => {
    let err: unknown;
    try {
      checkNodePath(path);
    } catch (e) {
      err = e;
    }
    expect(err).toBeInstanceOf(FileError);
    expect((err as FileError).message).toContain(JSON.stringify(path));
    expect((err as FileError).message).toContain(why);
    // ...and every adapter operation applies the same check, under its own name
    const { files } = fresh();
    expect(await fileError(files.read(path))).toMatchObject({ op: "read", path });
    expect(await fileError(files.writeAtomic(path, "x", 0o644))).toMatchObject({ op: "writeAtomic", path });
    expect(await fileError(files.list(path))).toMatchObject({ op: "list", path });
  });

  test.each(["/", "/etc", "/etc/hosts", "/a/..b", "/a/.hidden", "/a/b c/d", "/x/..."])("%p is accepted", (path) => {
    expect(() => checkNodePath(path)).not.toThrow();
  });

  test("the root maps node paths; a relative root is resolved; root / is the host itself", async () => {
    const { root, files } = fresh();
    expect(files.root).toBe(root);
    expect(createFiles(`${root}/`).root).toBe(root);
    expect(createFiles().root).toBe("/");
    const cwd = process.cwd();
    process.chdir(root);
    try {
      expect(createFiles("sub").root).toBe(`${root}/sub`);
    } finally {
      process.chdir(cwd);
    }
    expect(await files.list("/")).toEqual([]);
    expect(await createFiles("/").sha256("/etc/os-release")).toBe(sha(readFileSync("/etc/os-release")));
  });

  test("a root given as a symlink (a node's /proc/PID/root) is the directory it names, not a swappable 0777 entry", async () => {
    const { root } = fresh();
    mkdirSync(`${root}/tree/etc`, { recursive: true });
    writeFileSync(`${root}/tree/etc/x`, "x\n");
    symlinkSync(`${root}/tree`, `${root}/link`);
    const files = createFiles(`${root}/link`);
    expect(new TextDecoder().decode(await files.read("/etc/x"))).toBe("x\n");
    await files.writeAtomic("/etc/y", "y\n", 0o644);
    expect(readFileSync(`${root}/tree/etc/y`, "utf8")).toBe("y\n");
  });
});

describe("symlinks resolve within the root, as the node sees them", () => {
  test("an absolute target starts again at the root and '..' stops there: nothing outside is read or created", async () => {
    const { root, files } = fresh();
    const outside = mkdtempSync(`${base}/outside-`);
    writeFileSync(`${outside}/secret`, "host secret\n");
    mkdirSync(`${root}/var`);
    mkdirSync(`${root}/run`);
    symlinkSync("/run", `${root}/var/run`); // a node's /var/run -> /run
    symlinkSync(outside, `${root}/var/host`); // a host path: inside the root it names root + that path
    symlinkSync("../../..", `${root}/var/up`); // climbing out stops at the root

    await files.writeAtomic("/var/run/a", "a", 0o644);
    expect(readFileSync(`${root}/run/a`, "utf8")).toBe("a");
    expect(await files.read(`/var/host/secret`)).toBeUndefined();
    await files.writeAtomic("/var/host/new", "n", 0o644);
    expect(readFileSync(`${root}${outside}/new`, "utf8")).toBe("n");
    await files.writeAtomic("/var/up/top", "t", 0o644);
    expect(readFileSync(`${root}/top`, "utf8")).toBe("t");
    expect(await files.list("/var/up")).toEqual(readdirSync(root).sort());
    expect(await files.list("/var/up")).toContain("top");
    expect(readdirSync(outside)).toEqual(["secret"]);
  });

  test("a final symlink is read through within the root; a write replaces the link, never its target", async () => {
    const { root, files } = fresh();
    mkdirSync(`${root}/etc`);
    writeFileSync(`${root}/etc/real`, "real\n");
    symlinkSync("/etc/real", `${root}/etc/link`);
    symlinkSync("/etc/real", `${root}/etc/link2`);
    expect(text(await files.read("/etc/link"))).toBe("real\n");
    expect(await files.sha256("/etc/link")).toBe(sha("real\n"));
    expect(await files.stat("/etc/link")).toMatchObject({ kind: "symlink" });
    expect(await files.remove("/etc/link2")).toBe(true);
    await files.writeAtomic("/etc/link", "new\n", 0o644);
    expect(readFileSync(`${root}/etc/real`, "utf8")).toBe("real\n");
    expect(lstatSync(`${root}/etc/link`).isFile()).toBe(true);
  });

  test("landsAt: the path a write replaces, through parent symlinks but not a final one; undefined when unresolvable", async () => {
    const { root, files } = fresh();
    mkdirSync(`${root}/var`);
    mkdirSync(`${root}/run`);
    symlinkSync("/run", `${root}/var/run`);
    symlinkSync("/run/a", `${root}/link`);
    symlinkSync("/b", `${root}/a`);
    symlinkSync("/a", `${root}/b`);
    expect(await files.landsAt("/var/run/x/y")).toBe("/run/x/y");
    expect(await files.landsAt("/link")).toBe("/link");
    expect(await files.landsAt("/etc/new")).toBe("/etc/new");
    expect(await files.landsAt("/a/x")).toBeUndefined();
    expect(await createFiles("/").landsAt("/")).toBe("/");
  });

  test("a symlink loop is a FileError", async () => {
    const { root, files } = fresh();
    symlinkSync("/b", `${root}/a`);
    symlinkSync("/a", `${root}/b`);
    expect((await fileError(files.writeAtomic("/a/x", "x", 0o644))).message).toContain("more than 40 symlinks");
  });

  test("a missing root is a FileError naming the root", async () => {
    const files = createFiles(`${base}/does-not-exist`);
    const err = await fileError(files.writeAtomic("/x", "x", 0o644));
    expect(err.message).toContain(`(root ${base}/does-not-exist)`);
    expect(err.message).toContain("cannot resolve the root");
  });
});

// One rule under every root: run for a temporary root and for "/" itself (the tree then lives in /tmp).
describe.each([["a temporary root", false], ['root "/"', true]] as const)("hostile neighbours, %s", (_, hostRoot) => {
  const setup = () => {
    const { root, files } = fresh();
    return hostRoot ? { root, files: createFiles("/"), at: (p: string) => `${root}${p}` } : { root, files, at: (p: string) => p };
  };
  const user = 4242;

  test("a symlink another user owns is not followed, even to a root-owned target", async () => {
    const { root, files, at } = setup();
    mkdirSync(`${root}/etc`);
    mkdirSync(`${root}/tmp`, { mode: 0o1777 });
    chmodSync(`${root}/tmp`, 0o1777);
    symlinkSync(hostRoot ? `${root}/etc` : "/etc", `${root}/tmp/planted`);
    lchownSync(`${root}/tmp/planted`, user, user);
    for (const op of [() => files.writeAtomic(at("/tmp/planted/passwd"), "x", 0o644), () => files.read(at("/tmp/planted/passwd")), () => files.list(at("/tmp/planted"))]) {
      expect((await fileError(op())).message).toContain(`is owned by uid ${user}, not root`);
    }
    expect(await files.writeProblem(at("/tmp/planted/passwd"))).toContain("unsafe path transition");
    expect(readdirSync(`${root}/etc`)).toEqual([]);
  });

  test("a directory another user owns is not walked through; root's own in a sticky directory is", async () => {
    const { root, files, at } = setup();
    mkdirSync(`${root}/tmp`, { mode: 0o1777 });
    chmodSync(`${root}/tmp`, 0o1777);
    mkdirSync(`${root}/tmp/theirs`);
    chownSync(`${root}/tmp/theirs`, user, user);
    mkdirSync(`${root}/tmp/ours`);
    expect((await fileError(files.writeAtomic(at("/tmp/theirs/x"), "x", 0o644))).message).toContain("unsafe path transition");
    await files.writeAtomic(at("/tmp/ours/x"), "x", 0o644);
    expect(readFileSync(`${root}/tmp/ours/x`, "utf8")).toBe("x");
  });

  test("no walking through a directory others may rename entries in (world-writable, not sticky)", async () => {
    const { root, files, at } = setup();
    mkdirSync(`${root}/open/sub`, { recursive: true });
    chmodSync(`${root}/open`, 0o777);
    // Writing into it is safe (O_EXCL temp file, rename); walking through an entry of it is not.
    await files.writeAtomic(at("/open/file"), "x", 0o644);
    expect((await fileError(files.writeAtomic(at("/open/sub/x"), "x", 0o644))).message).toContain("lets other users rename sub");
  });

  test("writeProblem names what cannot be written: a directory, a FIFO, a parent that is a file", async () => {
    const { root, files, at } = setup();
    mkdirSync(`${root}/etc/dir`, { recursive: true });
    writeFileSync(`${root}/etc/file`, "x");
    Bun.spawnSync(["mkfifo", `${root}/etc/fifo`]);
    expect(await files.writeProblem(at("/etc/dir"))).toBe("is a directory");
    expect(await files.writeProblem(at("/etc/fifo"))).toBe("is a FIFO, not a regular file");
    expect(await files.writeProblem(at("/etc/file/below"))).toContain("a parent is not a directory");
    expect(await files.writeProblem(at("/etc/file"))).toBeUndefined();
    expect(await files.writeProblem(at("/etc/new/deeper"))).toBeUndefined();
    expect((await fileError(files.writeAtomic(at("/etc/fifo"), "x", 0o644))).message).toContain("is a FIFO");
    expect(statSync(`${root}/etc/fifo`).isFIFO()).toBe(true);
  });
});

// Special files at a target path: never opened for writing (a FIFO would block, a device be written to)
// nor read (a FIFO blocks, /dev/zero never ends); a write refuses them and leaves them as they are.
describe.each([["a temporary root", false], ['root "/"', true]] as const)("FIFOs, sockets and devices, %s", (_, hostRoot) => {
  const setup = () => {
    const { root, files } = fresh();
    mkdirSync(`${root}/etc`);
    runOk(["mkfifo", `${root}/etc/fifo`]);
    runOk(["mknod", `${root}/etc/null`, "c", "1", "3"]); // what /dev/null is
    runOk(["mknod", `${root}/etc/zero`, "c", "1", "5"]); // what /dev/zero is: endless
    // bound by a process that exits: the socket file stays (node's server.close() would unlink it)
    runOk(["perl", "-MIO::Socket::UNIX", "-e", "IO::Socket::UNIX->new(Local => $ARGV[0], Listen => 1) or die $!", `${root}/etc/socket`]);
    return hostRoot ? { root, files: createFiles("/"), at: (p: string) => `${root}${p}` } : { root, files, at: (p: string) => p };
  };
  const special: [string, string][] = [
    ["fifo", "is a FIFO, not a regular file"],
    ["null", "is a device, not a regular file"],
    ["zero", "is a device, not a regular file"],
    ["socket", "is a socket, not a regular file"],
  ];

  test("writeProblem and writeAtomic refuse each; it stays what it was; no temp file is left", async () => {
    const { root, files, at } = setup();
    for (const [name, why] of special) {
      expect(await files.writeProblem(at(`/etc/${name}`))).toBe(why);
      expect((await fileError(files.writeAtomic(at(`/etc/${name}`), "x", 0o644))).reason).toBe(why);
    }
    expect(statSync(`${root}/etc/fifo`).isFIFO()).toBe(true);
    expect(statSync(`${root}/etc/null`).isCharacterDevice()).toBe(true);
    expect(statSync(`${root}/etc/socket`).isSocket()).toBe(true);
    expect(tempsIn(`${root}/etc`)).toEqual([]);
  });

  test("read and sha256 refuse each at once (a FIFO without writer would block them forever), directly and through a root-owned symlink", async () => {
    const { root, files, at } = setup();
    for (const [name, why] of special) {
      symlinkSync(name, `${root}/etc/link-${name}`);
      for (const path of [`/etc/${name}`, `/etc/link-${name}`]) {
        expect((await fileError(files.read(at(path)))).reason).toBe(why);
        expect((await fileError(files.sha256(at(path)))).reason).toBe(why);
      }
    }
  });
});

// A symlink at a file's path: gardener-node-agent renames its temp file over the path (files.Move), which
// replaces the link, after a stat() through it that refuses a target that is not a regular file. trellis
// does the same for links it may follow (root-owned, safe transitions); a link it may not follow is
// simply replaced.
describe.each([["a temporary root", false], ['root "/"', true]] as const)("a symlink at a file's path, %s", (_, hostRoot) => {
  const setup = () => {
    const { root, files } = fresh();
    mkdirSync(`${root}/etc/dir`, { recursive: true });
    mkdirSync(`${root}/run`);
    writeFileSync(`${root}/run/stub-resolv.conf`, "nameserver 127.0.0.53\n");
    runOk(["mknod", `${root}/etc/null`, "c", "1", "3"]);
    const inRoot = (p: string) => (hostRoot ? `${root}${p}` : p); // absolute link targets as the node sees them
    return { root, inRoot, files: hostRoot ? createFiles("/") : files, at: inRoot };
  };

  test("a root-owned link to a regular file (/etc/resolv.conf): the link is replaced by the file, its target untouched", async () => {
    const { root, inRoot, files, at } = setup();
    symlinkSync("../run/stub-resolv.conf", `${root}/etc/resolv.conf`);
    symlinkSync(inRoot("/run/stub-resolv.conf"), `${root}/etc/absolute`);
    for (const name of ["resolv.conf", "absolute"]) {
      expect(await files.writeProblem(at(`/etc/${name}`))).toBeUndefined();
      await files.writeAtomic(at(`/etc/${name}`), "nameserver 10.0.0.10\n", 0o644);
      expect(lstatSync(`${root}/etc/${name}`).isFile()).toBe(true);
      expect(readFileSync(`${root}/etc/${name}`, "utf8")).toBe("nameserver 10.0.0.10\n");
    }
    expect(readFileSync(`${root}/run/stub-resolv.conf`, "utf8")).toBe("nameserver 127.0.0.53\n");
  });

  test("a dangling link is replaced; nothing is created where it pointed", async () => {
    const { root, inRoot, files, at } = setup();
    symlinkSync(inRoot("/run/missing/file"), `${root}/etc/dangling`);
    await files.writeAtomic(at("/etc/dangling"), "x", 0o644);
    expect(lstatSync(`${root}/etc/dangling`).isFile()).toBe(true);
    expect(existsSync(`${root}/run/missing`)).toBe(false);
  });

  test("a root-owned link to a directory or a device (a unit masked as /dev/null) is refused, not replaced", async () => {
    const { root, inRoot, files, at } = setup();
    symlinkSync(inRoot("/etc/null"), `${root}/etc/masked.service`);
    symlinkSync("dir", `${root}/etc/to-dir`);
    expect(await files.writeProblem(at("/etc/masked.service"))).toBe(`is a symlink to ${at("/etc/null")}, which is a device, not a regular file`);
    expect((await fileError(files.writeAtomic(at("/etc/to-dir"), "x", 0o644))).reason).toBe(`is a symlink to ${at("/etc/dir")}, which is a directory`);
    expect(lstatSync(`${root}/etc/masked.service`).isSymbolicLink()).toBe(true);
    expect(lstatSync(`${root}/etc/to-dir`).isSymbolicLink()).toBe(true);
    expect(readdirSync(`${root}/etc/dir`)).toEqual([]);
  });

  test("a link another user left in a sticky directory is replaced, never looked through, whatever it names", async () => {
    const { root, inRoot, files, at } = setup();
    mkdirSync(`${root}/tmp`, { mode: 0o1777 });
    chmodSync(`${root}/tmp`, 0o1777);
    for (const [name, target] of [["to-device", "/etc/null"], ["to-dir", "/etc/dir"], ["to-file", "/run/stub-resolv.conf"]] as const) {
      symlinkSync(inRoot(target), `${root}/tmp/${name}`);
      lchownSync(`${root}/tmp/${name}`, 4242, 4242);
      expect(await files.writeProblem(at(`/tmp/${name}`))).toBeUndefined();
      await files.writeAtomic(at(`/tmp/${name}`), "ours\n", 0o600);
      expect(lstatSync(`${root}/tmp/${name}`)).toMatchObject({ uid: 0 });
      expect(lstatSync(`${root}/tmp/${name}`).isFile()).toBe(true);
    }
    expect(readFileSync(`${root}/run/stub-resolv.conf`, "utf8")).toBe("nameserver 127.0.0.53\n");
    expect(statSync(`${root}/etc/null`).isCharacterDevice()).toBe(true);
  });

  test("remove takes the link away, never its target", async () => {
    const { root, files, at } = setup();
    symlinkSync("../run/stub-resolv.conf", `${root}/etc/resolv.conf`);
    expect(await files.remove(at("/etc/resolv.conf"))).toBe(true);
    expect(existsSync(`${root}/etc/resolv.conf`)).toBe(false);
    expect(readFileSync(`${root}/run/stub-resolv.conf`, "utf8")).toBe("nameserver 127.0.0.53\n");
  });
});

describe("cleanupTemp", () => {
  test("removes only files named like its own temp files", async () => {
    const { root, files } = fresh();
    await files.writeAtomic("/etc/kubelet.conf", "x", 0o644);
    const dir = `${root}/etc`;
    // PIDs of writers that are gone (a live writer's temp file stays: test/integration/state-lock.test.ts).
    const dead = Bun.spawnSync(["true"]).pid;
    const stale = [`.kubelet.conf.trellis-tmp-${dead}-0123456789ab`, `.other.trellis-tmp-${process.pid}-abcdefabcdef`];
    const keep = [
      ".kubelet.conf.tmp", // someone else's temp
      `kubelet.conf.trellis-tmp-${dead}-0123456789ab`, // not hidden
      `.kubelet.conf.trellis-tmp-${dead}-0123456789AB`, // not our hex
      ".kubelet.conf.trellis-tmp-x-0123456789ab", // not a pid
      `.kubelet.conf.trellis-tmp-${dead}-0123456789ab.bak`,
    ];
    for (const name of [...stale, ...keep]) writeFileSync(`${dir}/${name}`, "partial");
    mkdirSync(`${dir}/.dir.trellis-tmp-1-0123456789ab`); // a directory is never ours
    symlinkSync("kubelet.conf", `${dir}/.link.trellis-tmp-1-0123456789ab`); // nor is a symlink

    expect(await files.cleanupTemp("/etc")).toEqual([...stale].sort());
    expect(readdirSync(dir).sort()).toEqual(
      ["kubelet.conf", ...keep, ".dir.trellis-tmp-1-0123456789ab", ".link.trellis-tmp-1-0123456789ab"].sort(),
    );
    expect(await files.cleanupTemp("/etc")).toEqual([]);
    expect(await files.cleanupTemp("/missing")).toEqual([]);
  });

  test("a temp file of a write in flight in the same adapter is kept", async () => {
    const { root, files } = fresh();
    await files.writeAtomic("/var/big", "old", 0o644);
    const writing = files.writeAtomic("/var/big", new Uint8Array(64 * 1024 * 1024).fill(0x42), 0o644);
    let seenTemp = false;
    let done = false;
    writing.finally(() => (done = true)).catch(() => {});
    while (!done) {
      if (tempsIn(`${root}/var`).length > 0) {
        seenTemp = true;
        expect(await files.cleanupTemp("/var")).toEqual([]);
      }
      await Bun.sleep(1);
    }
    await writing;
    expect(seenTemp).toBe(true);
    expect((await files.stat("/var/big"))?.size).toBe(64 * 1024 * 1024);
    expect(await files.remove("/var/big")).toBe(true);
  }, 30_000);

  test("the temp name stays under NAME_MAX for a 255-byte file name", async () => {
    const { files } = fresh();
    const name = "é".repeat(127); // 254 bytes in UTF-8
    await files.writeAtomic(`/long/${name}`, "x", 0o644);
    expect(await files.list("/long")).toEqual([name]);
  });
});
