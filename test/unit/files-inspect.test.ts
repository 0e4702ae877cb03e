// Files.inspect (src/host/files.ts) and the known-hashes table over it (src/host/known-hashes.ts): one pass
// gives what observing the node needs, a file's identity changes with anything that can change its
// content, and a sha256 is taken on trust only for an unchanged identity.
import { describe, expect, test } from "bun:test";
import { createHash } from "node:crypto";
import { chownSync, chmodSync, mkdirSync, mkdtempSync, renameSync, statSync, symlinkSync, utimesSync, writeFileSync } from "node:fs";
import { createFiles, type FileIdentity, FileError, type Files } from "../../src/host/files.ts";
import { withKnownHashes } from "../../src/host/known-hashes.ts";
import { createLogger } from "../../src/log.ts";
import { runDir } from "../harness/exec.ts";

const base = runDir("files-inspect");
const sha = (data: string) => createHash("sha256").update(data).digest("hex");
const quiet = createLogger({ level: "error" });

function fresh(): { root: string; files: Files } {
  const root = mkdtempSync(`${base}/root-`);
  mkdirSync(`${root}/etc/a`, { recursive: true });
  return { root, files: createFiles(root) };
}

/** Sets a file's times into the past, so its identity is settled (not racily clean). */
const age = (p: string) => utimesSync(p, new Date(Date.now() - 60_000), new Date(Date.now() - 60_000));
/** Waits until a change made now is more than a second old: a second write could otherwise leave the identity as it was. */
const settle = () => Bun.sleep(1_100);

describe("inspect", () => {
  test("one pass: landsAt, and mode and sha256 of regular files; nothing for missing paths, directories and symlinks", async () => {
    const { root, files } = fresh();
    writeFileSync(`${root}/etc/a/f`, "content");
    chmodSync(`${root}/etc/a/f`, 0o640);
    symlinkSync("/etc/a/f", `${root}/etc/a/link`);
    mkdirSync(`${root}/etc/linked`);
    symlinkSync("/etc/a", `${root}/etc/viaLink`);
    const seen = await files.inspect(["/etc/a/f", "/etc/a/missing", "/etc/a", "/etc/a/link", "/etc/viaLink/f", "/etc/nodir/x", "/etc/a/f/under-a-file"]);
    expect(seen.get("/etc/a/f")).toMatchObject({ landsAt: "/etc/a/f", file: { mode: 0o640, sha256: sha("content") } });
    expect(seen.get("/etc/a/missing")).toEqual({ landsAt: "/etc/a/missing" });
    expect(seen.get("/etc/a")?.file).toBeUndefined();
    expect(seen.get("/etc/a/link")).toEqual({ landsAt: "/etc/a/link" }); // a write replaces the link: no file there
    expect(seen.get("/etc/viaLink/f")).toMatchObject({ landsAt: "/etc/a/f", file: { sha256: sha("content") } });
    expect(seen.get("/etc/nodir/x")).toEqual({ landsAt: "/etc/nodir/x" });
    expect(seen.get("/etc/a/f/under-a-file")).toEqual({ landsAt: "/etc/a/f/under-a-file" });
  });

  test("agrees with stat, sha256 and landsAt path by path", async () => {
    const { root, files } = fresh();
    for (let i = 0; i < 50; i++) {
      mkdirSync(`${root}/etc/d${i % 7}`, { recursive: true });
      writeFileSync(`${root}/etc/d${i % 7}/f${i}`, "x".repeat(i * 100));
    }
    const paths = Array.from({ length: 60 }, (_, i) => `/etc/d${i % 7}/f${i}`);
    const seen = await files.inspect(paths);
    for (const p of paths) {
      const st = await files.stat(p);
      expect(seen.get(p)?.landsAt).toBe((await files.landsAt(p)) as string);
      expect(seen.get(p)?.file && { mode: seen.get(p)?.file?.mode, sha256: seen.get(p)?.file?.sha256 }).toEqual(st?.kind === "file" ? { mode: st.mode, sha256: (await files.sha256(p)) as string } : undefined);
    }
  });

  test("an unsafe path fails the pass as it fails any other operation", async () => {
    const { root, files } = fresh();
    mkdirSync(`${root}/tmp`, { mode: 0o1777 });
    chmodSync(`${root}/tmp`, 0o1777);
    mkdirSync(`${root}/tmp/theirs`);
    chownSync(`${root}/tmp/theirs`, 4242, 4242);
    const err = await files.inspect(["/etc/a/f", "/tmp/theirs/x"]).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(FileError);
    expect((err as FileError).message).toContain("unsafe path transition");
  });

  test("the identity changes with a write in place (mtime put back: ctime tells), a rename over the file, and a chmod; not with a read", async () => {
    const { root, files } = fresh();
    const p = `${root}/etc/a/f`;
    writeFileSync(p, "one");
    age(p);
    await settle();
    const id = async () => (await files.inspect(["/etc/a/f"])).get("/etc/a/f")?.file?.identity;
    const first = await id();
    expect(first).toBeString();
    expect(await id()).toBe(first as string);
    const { mtime } = statSync(p);
    writeFileSync(p, "two"); // same inode, same size
    utimesSync(p, mtime, mtime);
    await settle();
    const inPlace = await id();
    expect(inPlace).not.toBe(first as string);
    writeFileSync(`${root}/etc/a/g`, "two");
    utimesSync(`${root}/etc/a/g`, mtime, mtime);
    renameSync(`${root}/etc/a/g`, p);
    await settle();
    const renamed = await id();
    expect(renamed).not.toBe(inPlace as string);
    chmodSync(p, 0o600);
    await settle();
    expect(await id()).not.toBe(renamed as string);
  });

  test("a file changed within the last second has no identity yet (racily clean), and is vouched for once settled", async () => {
    const { root, files } = fresh();
    writeFileSync(`${root}/etc/a/f`, "fresh");
    expect((await files.inspect(["/etc/a/f"])).get("/etc/a/f")?.file?.identity).toBeUndefined();
    await settle();
    expect((await files.inspect(["/etc/a/f"])).get("/etc/a/f")?.file?.identity).toBeString();
  });

  test("known: a sha256 is taken on trust for exactly the identity it was recorded with", async () => {
    const { root, files } = fresh();
    writeFileSync(`${root}/etc/a/f`, "real");
    age(`${root}/etc/a/f`);
    await settle();
    const identity = (await files.inspect(["/etc/a/f"])).get("/etc/a/f")?.file?.identity as FileIdentity;
    const vouched = "0".repeat(64);
    const known = (path: string, id: FileIdentity) => (path === "/etc/a/f" && id === identity ? vouched : undefined);
    expect((await files.inspect(["/etc/a/f"], known)).get("/etc/a/f")?.file?.sha256).toBe(vouched);
    writeFileSync(`${root}/etc/a/f`, "edit");
    expect((await files.inspect(["/etc/a/f"], known)).get("/etc/a/f")?.file?.sha256).toBe(sha("edit"));
  });
});

describe("writeChecks", () => {
  test("answers for each path what landsAt and writeProblem answer, in one pass", async () => {
    const { root, files } = fresh();
    writeFileSync(`${root}/etc/a/f`, "f");
    mkdirSync(`${root}/etc/a/dir`);
    symlinkSync("/etc/a/dir", `${root}/etc/a/toDir`);
    symlinkSync("/etc/a/f", `${root}/etc/a/toFile`);
    symlinkSync("/etc/a", `${root}/etc/viaLink`);
    Bun.spawnSync(["mkfifo", `${root}/etc/a/fifo`]);
    mkdirSync(`${root}/tmp`, { mode: 0o1777 });
    chmodSync(`${root}/tmp`, 0o1777);
    mkdirSync(`${root}/tmp/theirs`);
    chownSync(`${root}/tmp/theirs`, 4242, 4242);
    const paths = ["/", "/etc/a/f", "/etc/a/new", "/etc/a/dir", "/etc/a/toDir", "/etc/a/toFile", "/etc/viaLink/f", "/etc/a/fifo", "/etc/a/f/below", "/etc/missing/x", "/tmp/theirs/x"];
    const checks = await files.writeChecks(paths);
    for (const p of paths) expect({ p, ...checks.get(p) }).toEqual({ p, landsAt: await files.landsAt(p), problem: await files.writeProblem(p) });
    expect(checks.get("/etc/a/dir")?.problem).toBeString();
    expect(checks.get("/tmp/theirs/x")?.problem).toContain("unsafe path transition");
    expect(checks.get("/etc/viaLink/f")).toEqual({ landsAt: "/etc/a/f", problem: undefined });
  });
});

describe("known hashes, persisted", () => {
  const table = "/var/lib/trellis-test/known-hashes.json";

  test("a second adapter over the same table reads no settled file again; a changed one is read", async () => {
    const { root, files } = fresh();
    for (const n of ["f", "g"]) {
      writeFileSync(`${root}/etc/a/${n}`, n);
      age(`${root}/etc/a/${n}`);
    }
    await settle();
    const first = await withKnownHashes(files, { path: table, log: quiet });
    await first.inspect(["/etc/a/f", "/etc/a/g"]);
    expect(statSync(`${root}${table}`).mode & 0o777).toBe(0o600);
    // Whatever the table vouches for is what a pass reports: forge g's entry to prove g is not read.
    const doc = JSON.parse(await Bun.file(`${root}${table}`).text());
    doc.files["/etc/a/g"].sha256 = "1".repeat(64);
    writeFileSync(`${root}${table}`, JSON.stringify(doc));
    writeFileSync(`${root}/etc/a/f`, "F");
    const second = await withKnownHashes(createFiles(root), { path: table, log: quiet });
    const seen = await second.inspect(["/etc/a/f", "/etc/a/g"]);
    expect(seen.get("/etc/a/g")?.file?.sha256).toBe("1".repeat(64));
    expect(seen.get("/etc/a/f")?.file?.sha256).toBe(sha("F"));
  });

  test.each([["more than 8 MiB", `{"version":1,"files":{}}${" ".repeat(8 << 20)}`], ["not JSON", "{"], ["a wrong shape", JSON.stringify({ version: 2, files: {} })], ["a bad sha256", JSON.stringify({ version: 1, files: { "/etc/a/f": { identity: "x", sha256: "nope" } } })]])(
    "a table with %s is ignored with a warning: every file is read",
    async (_, content) => {
      const { root, files } = fresh();
      writeFileSync(`${root}/etc/a/f`, "f");
      mkdirSync(`${root}/var/lib/trellis-test`, { recursive: true });
      writeFileSync(`${root}${table}`, content);
      const lines: string[] = [];
      const log = createLogger({ level: "warn", write: (l: string) => lines.push(l) });
      const seen = await (await withKnownHashes(files, { path: table, log })).inspect(["/etc/a/f"]);
      expect(seen.get("/etc/a/f")?.file?.sha256).toBe(sha("f"));
      expect(lines.join("\n")).toContain("ignoring the files' known hashes");
    },
  );
});
