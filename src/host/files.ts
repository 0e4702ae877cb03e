// The node's files, through a root prefix: "/" on a node, a directory for `trellis plan --root DIR` and
// tests. trellis can be killed (-9, power loss) at any instant, so a file it writes is always either the
// old or the new complete content: temp file in the same directory, fsync, rename over the target, fsync
// the directory. Paths given to the adapter are absolute node paths; errors name the node path.
//
// Paths are resolved here one component at a time, the same way under every root (systemd's chase()
// with CHASE_SAFE and a prefix root): a symlink is followed within the root (an absolute target starts
// again at the root, ".." stops there), so `plan --root` sees what the node will see and nothing leads
// outside. trellis runs as root where other users may write, so it follows only directories and
// symlinks owned by root (or by the owner of the root directory), and never walks through an entry of
// a directory other users may rename entries in (writable by them and not sticky). What was checked is
// what is used: each directory is opened (O_NOFOLLOW) and checked by fstat, and the next lookup goes
// through that open directory, so a component swapped after the check (a symlink an unprivileged user
// plants in a sticky /tmp where trellis is about to create a directory) is met by the walk, not followed
// by a later syscall. A final symlink is not followed by writes and removals: they replace or remove the
// link itself. Only regular files are ever opened: a FIFO, socket or device is refused, never read or
// written.
import { createHash, randomBytes } from "node:crypto";
import { constants, type Stats } from "node:fs";
import { lstat, mkdir, open, readdir, readFile, readlink, rename, rmdir, unlink, type FileHandle } from "node:fs/promises";
import { resolve } from "node:path";
import { nodePathProblem } from "../api/paths.ts";
import { processAlive } from "./process.ts";

export type FileKind = "file" | "dir" | "symlink" | "other";

/** What writeAtomic writes: bytes, text, or a copy of another node file that must have this sha256. */
export type FileContent = Uint8Array | string | { copyFrom: string; sha256: string };

export type FileStat = {
  /** Permission bits only (setuid, setgid and sticky included). */
  mode: number;
  size: number;
  kind: FileKind;
};

/**
 * What identifies a file's content without reading it, as git's index does: device, inode, size, and the
 * modification and change times in ns. A write or a rename over the file changes it; ctime cannot be set
 * back by anyone, so content changed with its mtime restored changes it too.
 */
export type FileIdentity = string;

export type Inspection = {
  /** The node path a write replaces (see Files.landsAt). */
  landsAt: string;
  /**
   * The regular file there. identity is left out when the file changed too recently to be vouched for
   * by it: within the file system's timestamp granularity, a second write may leave every field as it was
   * (git's "racily clean" entries).
   */
  file?: { mode: number; sha256: string; identity?: FileIdentity };
};

/** sha256 recorded earlier for `path` while its identity was `identity`; undefined: read the file. */
export type KnownHashes = (path: string, identity: FileIdentity) => string | undefined;

export interface Files {
  /** The absolute host directory node paths are mapped under ("/" on a node). */
  readonly root: string;
  /**
   * Content, or undefined when the path does not exist (any other error throws FileError). `maxBytes`:
   * a larger file (also one that grows past it while read) is a FileError, and no more than that is read.
   */
  read(path: string, opts?: { maxBytes?: number }): Promise<Uint8Array | undefined>;
  /** Does not follow a final symlink; undefined when the path does not exist. */
  stat(path: string): Promise<FileStat | undefined>;
  /** sha256 hex of the content, or undefined when missing. */
  sha256(path: string): Promise<string | undefined>;
  /**
   * Atomic replace with exactly `mode` whatever the umask; the new file is owned by this process's user.
   * Missing parent directories are created with mode 0755. A directory at `path` is a FileError.
   * Content may be copied from another node path (large files extracted from images), verified against
   * its sha256 while copying so a damaged source is never installed.
   */
  writeAtomic(path: string, content: FileContent, mode: number): Promise<void>;
  /**
   * Why a file cannot be written at `path`, or undefined when it can: a parent is not a directory or
   * is not safe to walk through, or `path` is a directory, FIFO, socket or device.
   */
  writeProblem(path: string): Promise<string | undefined>;
  /**
   * The node path a write of `path` replaces: symlinks on the way followed within the root, a final one
   * not. Two paths landing on the same one are one file. Undefined when it cannot be resolved (see writeProblem).
   */
  landsAt(path: string): Promise<string | undefined>;
  /** landsAt and writeProblem of each path, in one pass (directories the paths share are walked once). */
  writeChecks(paths: readonly string[]): Promise<Map<string, { landsAt: string | undefined; problem: string | undefined }>>;
  /**
   * What observing the node needs of each path, in one pass: where a write of it lands (as landsAt) and
   * the regular file there, if any, with its mode, sha256 and identity. Directories the paths share are
   * opened and checked once per pass. `known` vouches for the sha256 of a file whose identity is
   * unchanged, which is then not read again. Throws FileError where a path cannot be resolved safely.
   */
  inspect(paths: readonly string[], known?: KnownHashes): Promise<Map<string, Inspection>>;
  /** Removes a file or symlink (not a directory); false if it was not there. */
  remove(path: string): Promise<boolean>;
  /** Removes a directory only if it is empty; returns whether it did. A non-directory is a FileError. */
  removeDirIfEmpty(path: string): Promise<boolean>;
  /**
   * Removes what is at `path`, a directory with everything below it (as `rm -rf --one-file-system`, or
   * Go's os.RemoveAll); false if nothing was there. Nothing is ever followed: each directory is opened
   * (O_NOFOLLOW) through its open parent and emptied through that descriptor, so an entry swapped for a
   * symlink meanwhile is removed as the link. A directory is emptied only if no other user can put
   * entries in it (owned by root, not writable by others): else another user could move in what is not
   * theirs to have removed (a directory of a third user) and have root remove it. Such a directory, one
   * on another mount (a bind mount included) or one deeper than maxTreeDepth is a FileError, and its
   * parents stay. Idempotent: what a removal killed midway left is removed by the next call.
   */
  removeTree(path: string): Promise<boolean>;
  /** Names in a directory, sorted; [] if it is missing. */
  list(dir: string): Promise<string[]>;
  /**
   * Deletes the temp files killed writers left in `dir` and returns their names. Writes in flight in this
   * adapter keep theirs, and so do live processes (isLeftoverTemp).
   */
  cleanupTemp(dir: string): Promise<string[]>;
}

export class FileError extends Error {
  override name = "FileError";
  constructor(
    /** The adapter operation (read, writeAtomic, ...). */
    readonly op: string,
    /** The node path the operation was given. */
    readonly path: string,
    /** What went wrong, without the op/path prefix of `message`. */
    readonly reason: string,
    options?: { cause?: unknown; root?: string },
  ) {
    const under = options?.root && options.root !== "/" ? ` (root ${options.root})` : "";
    super(`${op} ${JSON.stringify(path)}${under}: ${reason}`, options);
  }
}

/**
 * Throws FileError unless `path` is absolute, normalised (no "." or ".." segments, no "//", no trailing
 * slash except "/") and free of NUL bytes. The adapter checks every path it is given with this.
 */
export function checkNodePath(path: string, op = "checkNodePath"): void {
  const problem = nodePathProblem(path);
  if (problem !== undefined) throw new FileError(op, path, problem);
}

const showMode = (mode: number) => (Number.isInteger(mode) && mode > 0 ? `0o${mode.toString(8)}` : String(mode));

// `.<basename>.trellis-tmp-<pid>-<12 hex>`: hidden, unique across processes and calls, and recognisable
// by cleanupTemp. The basename is cut so that the name stays under NAME_MAX (255 bytes) even in UTF-8.
const tempPattern = /^\..*\.trellis-tmp-(\d+)-[0-9a-f]{12}$/s;
export const tempName = (base: string) => `.${base.slice(0, 64)}.trellis-tmp-${process.pid}-${randomBytes(6).toString("hex")}`;

/**
 * Is `name` a temp file no live writer owns? Another live process's (its PID is in the name) may be
 * being filled right now; our own PID's is from before a restart under the same PID (a new PID
 * namespace), since this process's writes in flight are known by their paths.
 */
export function isLeftoverTemp(name: string): boolean {
  const m = tempPattern.exec(name);
  if (!m) return false;
  const pid = Number(m[1]);
  return pid === process.pid || !processAlive(pid);
}

const errno = (err: unknown) => (err as { code?: unknown } | null)?.code;

const reasons: Record<string, string> = {
  EISDIR: "is a directory",
  ENOTDIR: "not a directory",
  EACCES: "permission denied",
  EROFS: "read-only file system",
  ENOSPC: "no space left on device",
  ELOOP: "too many levels of symbolic links",
};

function describe(err: unknown): string {
  const code = errno(err);
  if (typeof code === "string" && reasons[code]) return `${reasons[code]} (${code})`;
  return err instanceof Error ? err.message : String(err);
}

function kindOf(s: { isFile(): boolean; isDirectory(): boolean; isSymbolicLink(): boolean }): FileKind {
  if (s.isFile()) return "file";
  if (s.isDirectory()) return "dir";
  return s.isSymbolicLink() ? "symlink" : "other";
}

/** Why what is at a path is not a regular file trellis may open (undefined: it is one). */
function notRegular(s: Stats): string | undefined {
  if (s.isFile()) return undefined;
  if (s.isDirectory()) return "is a directory (EISDIR)";
  if (s.isFIFO()) return "is a FIFO, not a regular file";
  if (s.isSocket()) return "is a socket, not a regular file";
  if (s.isCharacterDevice() || s.isBlockDevice()) return "is a device, not a regular file";
  return s.isSymbolicLink() ? "is a symlink" : "is not a regular file";
}

/** Why writeAtomic must not replace what is at a path (undefined: a file, a symlink, or nothing). */
function unreplaceable(s: Stats): string | undefined {
  if (s.isDirectory()) return "is a directory";
  return s.isFile() || s.isSymbolicLink() ? undefined : notRegular(s);
}

/** How recent a change is too recent for a file's identity to vouch for its content (Files.inspect). */
const racyNs = 1_000_000_000n;

/** The kernel follows at most 40 symlinks in one lookup; so does the resolution here. */
const maxSymlinks = 40;

/** removeTree holds one descriptor per level: a tree deeper than this is refused, not a reason to run out of them. */
export const maxTreeDepth = 32;


// Every lookup goes through a directory trellis holds open and has checked: the kernel resolves
// /proc/self/fd/<fd>/<name> as <name> in the directory that fd names, whatever became of the path that
// led there (node has no openat; this is its equivalent, as systemd's chase() and glibc's fexecve use).
const { O_RDONLY, O_WRONLY, O_CREAT, O_EXCL, O_NOFOLLOW, O_DIRECTORY, O_NONBLOCK } = constants;

/** An open directory that passed the checks: what fstat said about it, and its resolved node path. */
type Dir = { fh: FileHandle; st: Stats; node: string };
/** Entry `name` of the open directory `dir` ("." for the directory itself); st: what lstat saw there, if anything. */
type Place = { dir: Dir; name: string; node: string; st?: Stats };
/**
 * Where a walk ended: at a place (whose entry may be missing), or before it, at a missing or non-directory
 * parent `node`, with the components it did not walk yet (`rest`).
 */
type Walk = { kind: "place"; at: Place } | { kind: "missing" | "notDir"; node: string; rest: string[] };

const via = (dir: Dir, name: string) => `/proc/self/fd/${dir.fh.fd}/${name}`;
const child = (node: string, name: string) => `${node === "/" ? "" : node}/${name}`;

async function lstatIfAny(p: string): Promise<Stats | undefined> {
  try {
    return await lstat(p);
  } catch (err) {
    if (errno(err) === "ENOENT") return undefined;
    throw err;
  }
}

/** `size`: what fstat said, so a small file is read into a buffer its size (one more byte sees the end). */
async function hashHandle(fh: FileHandle, size?: number): Promise<string> {
  const hash = createHash("sha256");
  // Streamed in at most 1 MiB: binaries under /opt/bin are hashed too.
  const buf = new Uint8Array(size === undefined ? 1 << 20 : Math.min(1 << 20, Math.max(4096, size + 1)));
  for (;;) {
    const { bytesRead } = await fh.read(buf, 0, buf.length, null);
    if (bytesRead === 0) return hash.digest("hex");
    hash.update(buf.subarray(0, bytesRead));
  }
}

/** The content, refused once it is larger than `maxBytes` (by its size, or by what could be read). */
async function readAtMost(fh: FileHandle, maxBytes: number): Promise<Uint8Array> {
  const { size } = await fh.stat();
  if (size > maxBytes) throw new Error(`is ${size} bytes, more than the limit of ${maxBytes}`);
  const chunks: Uint8Array[] = [];
  let total = 0;
  for (;;) {
    const buf = new Uint8Array(Math.min(Math.max(size, 1 << 16), maxBytes + 1 - total));
    const { bytesRead } = await fh.read(buf, 0, buf.length, null);
    if (bytesRead === 0) {
      const out = new Uint8Array(total);
      let at = 0;
      for (const c of chunks) {
        out.set(c, at);
        at += c.byteLength;
      }
      return out;
    }
    chunks.push(buf.subarray(0, bytesRead));
    total += bytesRead;
    if (total > maxBytes) throw new Error(`grew past the limit of ${maxBytes} bytes while it was read`);
  }
}

// Streamed in 1 MiB chunks (binaries of 100 MB and more), hashing what was copied.
async function copyVerified(to: FileHandle, from: FileHandle, source: string, sha256: string): Promise<void> {
  const hash = createHash("sha256");
  const buf = new Uint8Array(1 << 20);
  for (;;) {
    const { bytesRead } = await from.read(buf, 0, buf.length, null);
    if (bytesRead === 0) break;
    const chunk = buf.subarray(0, bytesRead);
    hash.update(chunk);
    await to.write(chunk);
  }
  const got = hash.digest("hex");
  if (got !== sha256) throw new Error(`source ${source} has sha256 ${got}, expected ${sha256}`);
}

/** The host path of node path `path` for a Files adapter whose root is `root` (as Files.root gives it). */
export function hostPathUnder(root: string, path: string): string {
  return root === "/" ? path : path === "/" ? root : root + path;
}

export function createFiles(rootDir = "/"): Files {
  const root = resolve(rootDir);
  // Temp files (resolved node path) that writes in flight are filling: cleanupTemp must not pull them away.
  const inFlight = new Set<string>();

  const fail = (op: string, path: string, reason: string, cause?: unknown) => new FileError(op, path, reason, { cause, root });

  // Who may own what is walked through: root, and the owner of the root directory (a tree unpacked by
  // another user for `plan --root`). Read once: the root does not change owners under a running agent.
  let trustedUids: Set<number> | undefined;

  // The root is the caller's choice, so a symlink naming it (a node's /proc/PID/root) is followed: its
  // own mode (0777) says nothing about who may rename entries of the directory it names.
  async function openRoot(op: string, path: string): Promise<Dir> {
    let fh: FileHandle | undefined;
    try {
      fh = await open(root, O_RDONLY | O_DIRECTORY);
      const st = await fh.stat();
      trustedUids ??= new Set([0, st.uid]);
      return { fh, st, node: "/" };
    } catch (err) {
      await fh?.close();
      throw fail(op, path, `cannot resolve the root: ${describe(err)}`, err);
    }
  }

  // Can users other than the trusted ones rename entries of this directory?
  const swappable = (dir: Stats, trusted: Set<number>) =>
    !(dir.mode & 0o1000) && (!!(dir.mode & 0o002) || (!!(dir.mode & 0o020) && !trusted.has(dir.gid)));

  /** Throws unless entry `name` (owned by `uid`) of `dir` may be walked through: systemd's unsafe transition. */
  function checkTransition(op: string, path: string, dir: Dir, name: string, uid: number): void {
    const trusted = trustedUids as Set<number>; // set by openRoot, before any walk
    if (!trusted.has(uid)) throw fail(op, path, `${child(dir.node, name)} is owned by uid ${uid}, not root: trellis does not walk through it (unsafe path transition)`);
    if (swappable(dir.st, trusted)) throw fail(op, path, `${dir.node} lets other users rename ${name} in it: trellis does not walk through it (unsafe path transition)`);
  }

  /** Opens directory `name` of `dir` without following a symlink, and checks what it holds, not what lstat saw. */
  async function openDir(op: string, path: string, dir: Dir, name: string): Promise<Dir> {
    const node = child(dir.node, name);
    let fh: FileHandle | undefined;
    try {
      fh = await open(via(dir, name), O_RDONLY | O_DIRECTORY | O_NOFOLLOW);
      const st = await fh.stat();
      checkTransition(op, path, dir, name, st.uid);
      return { fh, st, node };
    } catch (err) {
      await fh?.close();
      if (err instanceof FileError) throw err;
      throw fail(op, path, `opening directory ${node}: ${describe(err)}`, err);
    }
  }

  // Each directory made gets exactly 0755 (mkdir's mode is masked by the umask), set through the open
  // directory, and is fsynced into its parent: a crash must not lose a directory a file was renamed into.
  // EEXIST is fine: whatever got there first is looked at by the walk like anything else.
  async function makeDir(op: string, path: string, dir: Dir, name: string): Promise<void> {
    try {
      await mkdir(via(dir, name), 0o755);
    } catch (err) {
      if (errno(err) === "EEXIST") return;
      throw fail(op, path, `creating directory ${child(dir.node, name)}: ${describe(err)}`, err);
    }
    const made = await openDir(op, path, dir, name);
    try {
      await made.fh.chmod(0o755);
    } catch (err) {
      throw fail(op, path, `creating directory ${made.node}: ${describe(err)}`, err);
    } finally {
      await made.fh.close();
    }
    await syncDir(op, path, dir);
  }

  /**
   * Resolves `path` one component at a time through open directories, each checked before it is walked
   * through; a symlink is followed within the root. `follow`: the final component too (it is then checked
   * like the others). `create`: missing parents are made. The caller closes the place's directory.
   */
  async function walk(op: string, path: string, o: { follow: boolean; create: boolean }, pass?: Pass): Promise<Walk> {
    checkNodePath(path, op);
    const stack: Dir[] = [await shared(pass, "/", () => openRoot(op, path))];
    let kept: Dir | undefined;
    const place = (dir: Dir, name: string, st?: Stats): Walk => {
      kept = dir;
      return { kind: "place", at: { dir, name, node: name === "." ? dir.node : child(dir.node, name), ...(st ? { st } : {}) } };
    };
    const up = async (to: number) => {
      while (stack.length > to) await release(pass, stack.pop() as Dir);
    };
    try {
      const todo = path.split("/").filter((p) => p !== "");
      let links = 0;
      while (todo.length > 0) {
        const dir = stack[stack.length - 1] as Dir;
        const name = todo.shift() as string;
        if (name === ".") continue;
        if (name === "..") {
          await up(Math.max(1, stack.length - 1)); // ".." stops at the root
          continue;
        }
        const last = todo.length === 0;
        if (last && !o.follow) return place(dir, name);
        // A directory this pass opened and checked already is walked through as it was then.
        const opened = last ? undefined : pass?.get(child(dir.node, name));
        if (opened) {
          stack.push(await opened);
          continue;
        }
        let st: Stats | undefined;
        try {
          st = await lstatIfAny(via(dir, name));
        } catch (err) {
          throw fail(op, path, `resolving ${child(dir.node, name)}: ${describe(err)}`, err);
        }
        if (st === undefined) {
          if (last) return place(dir, name);
          if (!o.create) return { kind: "missing", node: child(dir.node, name), rest: todo };
          await makeDir(op, path, dir, name);
          todo.unshift(name);
          continue;
        }
        checkTransition(op, path, dir, name, st.uid);
        if (st.isSymbolicLink()) {
          if (++links > maxSymlinks) throw fail(op, path, `more than ${maxSymlinks} symlinks on the way (${reasons.ELOOP})`);
          const target = await readlink(via(dir, name));
          todo.unshift(...target.split("/").filter((p) => p !== ""));
          if (target.startsWith("/")) await up(1);
          continue;
        }
        if (st.isDirectory()) stack.push(await shared(pass, child(dir.node, name), () => openDir(op, path, dir, name)));
        else if (last) return place(dir, name, st);
        else return { kind: "notDir", node: child(dir.node, name), rest: todo };
      }
      const top = stack[stack.length - 1] as Dir; // the path named a directory: the root, or through a final symlink or ".."
      return place(top, ".", top.st);
    } finally {
      for (const d of stack) if (d !== kept) await release(pass, d);
    }
  }

  /**
   * The directories one inspect pass opened and checked, by resolved node path: each is walked through
   * by every path below it in the pass, and closed when the pass ends. Held open, a directory stays the
   * one that was checked, whatever is renamed meanwhile, as during a single walk.
   */
  type Pass = Map<string, Promise<Dir>>;

  function shared(pass: Pass | undefined, node: string, open: () => Promise<Dir>): Promise<Dir> {
    if (!pass) return open();
    let dir = pass.get(node);
    if (!dir) {
      dir = open();
      pass.set(node, dir);
      // A failed open is not cached: the next path through it fails with its own error.
      dir.catch(() => pass.delete(node));
    }
    return dir;
  }

  async function release(pass: Pass | undefined, dir: Dir): Promise<void> {
    if (pass && (await pass.get(dir.node)) === dir) return;
    await dir.fh.close();
  }

  async function endPass(pass: Pass): Promise<void> {
    const dirs = await Promise.allSettled(pass.values());
    pass.clear();
    for (const d of dirs) if (d.status === "fulfilled") await d.value.fh.close();
  }

  /** One path of a writeChecks pass: as landsAt and writeProblem would answer. */
  async function writeCheck(path: string, pass: Pass): Promise<{ landsAt: string | undefined; problem: string | undefined }> {
    const op = "writeAtomic";
    if (path === "/") return { landsAt: "/", problem: "cannot replace the root directory" };
    let w: Walk;
    try {
      w = await walk(op, path, { follow: false, create: false }, pass);
    } catch (err) {
      if (err instanceof FileError) return { landsAt: undefined, problem: err.reason };
      throw err;
    }
    if (w.kind !== "place") return { landsAt: [w.node, ...w.rest].join("/"), problem: w.kind === "notDir" ? notADirectory(w.node) : undefined };
    try {
      return { landsAt: w.at.node, problem: await replaceProblem(op, path, w.at) };
    } catch (err) {
      if (err instanceof FileError) return { landsAt: w.at.node, problem: err.reason };
      throw err;
    } finally {
      await release(pass, w.at.dir);
    }
  }

  /** Runs `one` for every path with one pass's shared directories; every path settles before they are closed. */
  async function inPass<T>(paths: readonly string[], one: (path: string, pass: Pass) => Promise<T>): Promise<Map<string, T>> {
    const pass: Pass = new Map();
    const results = await Promise.allSettled(paths.map(async (path) => [path, await one(path, pass)] as const));
    await endPass(pass);
    const failed = results.find((r) => r.status === "rejected");
    if (failed) throw failed.reason;
    return new Map(results.map((r) => (r as PromiseFulfilledResult<readonly [string, T]>).value));
  }

  /** One path of an inspect pass (Files.inspect). */
  async function inspectOne(path: string, pass: Pass, known: KnownHashes | undefined): Promise<Inspection> {
    const op = "inspect";
    const w = await walk(op, path, { follow: false, create: false }, pass);
    if (w.kind !== "place") return { landsAt: [w.node, ...w.rest].join("/") };
    const { at } = w;
    try {
      let st: Stats | undefined;
      try {
        st = await lstatIfAny(via(at.dir, at.name));
      } catch (err) {
        throw fail(op, path, describe(err), err);
      }
      if (!st?.isFile()) return { landsAt: at.node };
      const fh = await openRegular(op, path, { ...at, st });
      if (!fh) return { landsAt: at.node };
      try {
        const startedNs = BigInt(Date.now()) * 1_000_000n;
        const f = await fh.stat({ bigint: true });
        const identity = `${f.dev}:${f.ino}:${f.size}:${f.mtimeNs}:${f.ctimeNs}`;
        const sha256 = known?.(path, identity) ?? (await hashHandle(fh, Number(f.size)));
        // A change in the last second may share every field with the next one: not vouched for yet.
        const settled = f.ctimeNs < startedNs - racyNs && f.mtimeNs < startedNs - racyNs;
        return { landsAt: at.node, file: { mode: Number(f.mode) & 0o7777, sha256, ...(settled ? { identity } : {}) } };
      } catch (err) {
        if (err instanceof FileError) throw err;
        throw fail(op, path, describe(err), err);
      } finally {
        await fh.close();
      }
    } finally {
      await release(pass, at.dir);
    }
  }

  async function syncDir(op: string, path: string, dir: Dir): Promise<void> {
    try {
      await dir.fh.sync();
    } catch (err) {
      throw fail(op, path, `fsync of directory ${dir.node}: ${describe(err)}`, err);
    }
  }

  /**
   * Opens a file for reading, if there is one: only a regular file is opened, so a FIFO is never waited
   * on and a device never read (O_NONBLOCK and the fstat cover an entry swapped since the lstat).
   */
  async function openRegular(op: string, path: string, at: Place): Promise<FileHandle | undefined> {
    const problem = at.st && notRegular(at.st);
    if (problem) throw fail(op, path, problem);
    let fh: FileHandle | undefined;
    try {
      fh = await open(via(at.dir, at.name), O_RDONLY | O_NOFOLLOW | O_NONBLOCK);
      const swapped = notRegular(await fh.stat());
      if (swapped) throw fail(op, path, swapped);
      return fh;
    } catch (err) {
      await fh?.close();
      if (err instanceof FileError) throw err;
      if (errno(err) === "ENOENT") return undefined;
      throw fail(op, path, describe(err), err);
    }
  }

  /** Runs `fn` on the place `path` leads to (undefined when a parent is missing or not a directory). */
  async function at<T>(op: string, path: string, o: { follow: boolean; create: boolean }, fn: (at: Place) => Promise<T>): Promise<T | undefined> {
    const w = await walk(op, path, o);
    if (w.kind !== "place") return undefined;
    try {
      return await fn(w.at);
    } finally {
      await w.at.dir.fh.close();
    }
  }

  /** The content of a regular file through `fn`, or undefined when there is none. */
  const readWith = <T>(op: string, path: string, fn: (fh: FileHandle) => Promise<T>) =>
    at(op, path, { follow: true, create: false }, async (place) => {
      const fh = await openRegular(op, path, place);
      if (!fh) return undefined;
      try {
        return await fn(fh);
      } catch (err) {
        throw fail(op, path, describe(err), err);
      } finally {
        await fh.close();
      }
    });

  /**
   * Why a write may not rename its file over what is at `place`: a directory, FIFO, socket or device. A
   * symlink is replaced, never written through (as gardener-node-agent renames over it); like
   * gardener-node-agent's stat() of the path, a link that trellis may follow is looked through first, and
   * one naming a directory or device (a unit masked as /dev/null) is refused rather than replaced.
   */
  async function replaceProblem(op: string, path: string, place: Place): Promise<string | undefined> {
    let st: Stats | undefined;
    try {
      st = await lstatIfAny(via(place.dir, place.name));
    } catch (err) {
      throw fail(op, path, describe(err), err);
    }
    if (st === undefined) return undefined;
    if (!st.isSymbolicLink() || !trustedUids?.has(st.uid)) return unreplaceable(st);
    return at(op, path, { follow: true, create: false }, async (target) => {
      const problem = target.st && unreplaceable(target.st);
      return problem && `is a symlink to ${target.node}, which ${problem}`;
    });
  }

  /** Places the temp file's content: bytes, or a verified copy of a regular node file opened first. */
  async function fillTemp(op: string, path: string, dir: Dir, temp: string, content: FileContent, mode: number): Promise<void> {
    let source: FileHandle | undefined;
    if (typeof content === "object" && "copyFrom" in content) {
      // A bad source fails before any temp file exists.
      const w = await walk(op, content.copyFrom, { follow: true, create: false });
      if (w.kind === "place") {
        const from = w.at;
        source = await openRegular(op, path, from).finally(() => from.dir.fh.close());
      }
      if (!source) throw fail(op, path, `source ${content.copyFrom} does not exist (ENOENT)`);
    }
    let fh: FileHandle;
    try {
      // O_EXCL|O_NOFOLLOW: never opens an existing file or follows a symlink planted at the temp name.
      // 0600 until the fchmod, so the content is never readable by others before it is complete.
      fh = await open(via(dir, temp), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW, 0o600);
    } catch (err) {
      await source?.close();
      throw fail(op, path, `creating temp file ${child(dir.node, temp)}: ${describe(err)}`, err);
    }
    let failure: unknown;
    try {
      if (source && typeof content === "object" && "copyFrom" in content) await copyVerified(fh, source, content.copyFrom, content.sha256);
      else await fh.writeFile(content as Uint8Array | string);
      await fh.chmod(mode); // after writing: a write by a non-root user would clear setuid/setgid
      await fh.sync();
    } catch (err) {
      failure = err;
    }
    for (const h of [fh, source]) {
      try {
        await h?.close();
      } catch (err) {
        failure ??= err;
      }
    }
    if (failure !== undefined) throw await abandon(op, path, dir, temp, `writing temp file ${child(dir.node, temp)}`, failure);
  }

  /** Removes the temp file of a failed write and returns the FileError to throw (naming both failures). */
  async function abandon(op: string, path: string, dir: Dir, temp: string, step: string, err: unknown): Promise<FileError> {
    let reason = `${step}: ${describe(err)}`;
    try {
      await unlink(via(dir, temp));
    } catch (unlinkErr) {
      if (errno(unlinkErr) !== "ENOENT") reason += `; removing the temp file ${child(dir.node, temp)} failed too: ${describe(unlinkErr)}`;
    }
    return fail(op, path, reason, err);
  }

  const notADirectory = (node: string) => `a parent is not a directory (ENOTDIR): ${node}`;

  /**
   * Removes entry `name` of the open directory `dir` (a directory emptied first, through its own open
   * descriptor); false if it was not there. `mount`: the mount the tree is on; `depth`: levels below the top.
   */
  async function removeEntry(op: string, path: string, dir: Dir, name: string, mount: string, depth: number): Promise<boolean> {
    const node = child(dir.node, name);
    let st: Stats | undefined;
    try {
      st = await lstatIfAny(via(dir, name));
    } catch (err) {
      throw fail(op, path, `${node}: ${describe(err)}`, err);
    }
    if (st === undefined) return false;
    if (!st.isDirectory()) return unlinkEntry(op, path, dir, name);
    if (depth >= maxTreeDepth) throw fail(op, path, `${node} is more than ${maxTreeDepth} levels deep: trellis does not remove it`);
    let fh: FileHandle;
    try {
      fh = await open(via(dir, name), O_RDONLY | O_DIRECTORY | O_NOFOLLOW);
    } catch (err) {
      // Swapped for a symlink or a file since the lstat: that is removed, not followed.
      if (errno(err) === "ELOOP" || errno(err) === "ENOTDIR") return unlinkEntry(op, path, dir, name);
      if (errno(err) === "ENOENT") return false;
      throw fail(op, path, `opening directory ${node}: ${describe(err)}`, err);
    }
    try {
      const sub: Dir = { fh, st: await fh.stat(), node };
      const trusted = trustedUids as Set<number>; // set by openRoot, before any walk
      if (!trusted.has(sub.st.uid)) throw fail(op, path, `${node} is owned by uid ${sub.st.uid}, not root: trellis does not remove what others may have put there`);
      if (sub.st.mode & 0o002 || (sub.st.mode & 0o020 && !trusted.has(sub.st.gid))) throw fail(op, path, `${node} is writable by other users: trellis does not remove what others may have put there`);
      if ((await mountOf(op, path, sub)) !== mount) throw fail(op, path, `${node} is a mount point: trellis does not remove what is on another mount`);
      let names: string[];
      try {
        names = await readdir(via(sub, "."));
      } catch (err) {
        throw fail(op, path, `listing ${node}: ${describe(err)}`, err);
      }
      for (const entry of names.sort()) await removeEntry(op, path, sub, entry, mount, depth + 1);
    } finally {
      await fh.close();
    }
    try {
      await rmdir(via(dir, name));
    } catch (err) {
      if (errno(err) === "ENOENT") return false;
      throw fail(op, path, `removing directory ${node}: ${describe(err)}`, err);
    }
    return true;
  }

  async function unlinkEntry(op: string, path: string, dir: Dir, name: string): Promise<boolean> {
    try {
      await unlink(via(dir, name));
      return true;
    } catch (err) {
      if (errno(err) === "ENOENT") return false;
      throw fail(op, path, `removing ${child(dir.node, name)}: ${describe(err)}`, err);
    }
  }

  /** The mount an open directory is on (the kernel's mnt_id, which tells a bind mount from its source too). */
  async function mountOf(op: string, path: string, dir: Dir): Promise<string> {
    try {
      const info = await readFile(`/proc/self/fdinfo/${dir.fh.fd}`, "utf8");
      const m = /^mnt_id:\s*(\d+)$/m.exec(info);
      if (m) return m[1] as string;
    } catch (err) {
      throw fail(op, path, `reading the mount of ${dir.node}: ${describe(err)}`, err);
    }
    throw fail(op, path, `reading the mount of ${dir.node}: no mnt_id in /proc/self/fdinfo`);
  }

  return {
    root,

    read: (path, opts = {}) => readWith("read", path, (fh) => (opts.maxBytes === undefined ? fh.readFile() : readAtMost(fh, opts.maxBytes))),

    sha256: (path) => readWith("sha256", path, hashHandle),

    async stat(path) {
      return at("stat", path, { follow: false, create: false }, async (place) => {
        try {
          const s = await lstatIfAny(via(place.dir, place.name));
          return s && { mode: s.mode & 0o7777, size: s.size, kind: kindOf(s) };
        } catch (err) {
          throw fail("stat", path, describe(err), err);
        }
      });
    },

    async writeProblem(path) {
      const op = "writeAtomic";
      if (path === "/") return "cannot replace the root directory";
      try {
        const w = await walk(op, path, { follow: false, create: false });
        if (w.kind !== "place") return w.kind === "notDir" ? notADirectory(w.node) : undefined;
        try {
          return await replaceProblem(op, path, w.at);
        } finally {
          await w.at.dir.fh.close();
        }
      } catch (err) {
        if (err instanceof FileError) return err.reason;
        throw err;
      }
    },
    inspect: (paths, known) => inPass(paths, (path, pass) => inspectOne(path, pass, known)),

    writeChecks: (paths) => inPass(paths, writeCheck),

    async landsAt(path) {
      let w: Walk;
      try {
        w = await walk("landsAt", path, { follow: false, create: false });
      } catch (err) {
        if (err instanceof FileError) return undefined;
        throw err;
      }
      if (w.kind !== "place") return [w.node, ...w.rest].join("/");
      await w.at.dir.fh.close();
      return w.at.node;
    },

    async writeAtomic(path, content, mode) {
      const op = "writeAtomic";
      if (!Number.isInteger(mode) || mode < 0 || mode > 0o7777) throw fail(op, path, `mode ${showMode(mode)} is not a permission mode (0 to 0o7777)`);
      if (path === "/") throw fail(op, path, "cannot replace the root directory");
      const w = await walk(op, path, { follow: false, create: true });
      if (w.kind !== "place") throw fail(op, path, notADirectory(w.node)); // with create, a missing parent was made
      const { dir, name } = w.at;
      const temp = tempName(name);
      const key = child(dir.node, temp);
      inFlight.add(key);
      try {
        const problem = await replaceProblem(op, path, w.at);
        if (problem) throw fail(op, path, problem);
        await fillTemp(op, path, dir, temp, content, mode);
        // rename replaces whatever entry is at the name by then (a symlink, a FIFO planted in a sticky
        // directory) and never opens it; a directory there makes it fail.
        try {
          await rename(via(dir, temp), via(dir, name));
        } catch (err) {
          throw await abandon(op, path, dir, temp, "renaming the temp file over it", err);
        }
        await syncDir(op, path, dir);
      } finally {
        inFlight.delete(key);
        await dir.fh.close();
      }
    },

    async remove(path) {
      const removed = await at("remove", path, { follow: false, create: false }, async (place) => {
        try {
          await unlink(via(place.dir, place.name));
        } catch (err) {
          if (errno(err) === "ENOENT") return false;
          throw fail("remove", path, describe(err), err);
        }
        await syncDir("remove", path, place.dir);
        return true;
      });
      return removed ?? false;
    },

    async removeDirIfEmpty(path) {
      const removed = await at("removeDirIfEmpty", path, { follow: false, create: false }, async (place) => {
        try {
          await rmdir(via(place.dir, place.name));
        } catch (err) {
          if (errno(err) === "ENOTEMPTY" || errno(err) === "EEXIST" || errno(err) === "ENOENT") return false;
          throw fail("removeDirIfEmpty", path, describe(err), err);
        }
        await syncDir("removeDirIfEmpty", path, place.dir);
        return true;
      });
      return removed ?? false;
    },

    async removeTree(path) {
      const op = "removeTree";
      if (path === "/") throw fail(op, path, "cannot remove the root directory");
      const removed = await at(op, path, { follow: false, create: false }, async (place) => {
        const gone = await removeEntry(op, path, place.dir, place.name, await mountOf(op, path, place.dir), 0);
        if (gone) await syncDir(op, path, place.dir); // journaled in order: the entries below went before it
        return gone;
      });
      return removed ?? false;
    },

    async list(dir) {
      const names = await at("list", dir, { follow: true, create: false }, async (place) => {
        if (place.st === undefined) return [];
        if (!place.st.isDirectory()) throw fail("list", dir, `${reasons.ENOTDIR} (ENOTDIR)`);
        try {
          return (await readdir(via(place.dir, "."))).sort(); // sorted: plans built from listings must be deterministic
        } catch (err) {
          throw fail("list", dir, describe(err), err);
        }
      });
      return names ?? [];
    },

    async cleanupTemp(dir) {
      const op = "cleanupTemp";
      const removed = await at(op, dir, { follow: true, create: false }, async (place) => {
        if (place.st === undefined) return [];
        if (!place.st.isDirectory()) throw fail(op, dir, `${reasons.ENOTDIR} (ENOTDIR)`);
        let names: string[];
        try {
          const entries = await readdir(via(place.dir, "."), { withFileTypes: true });
          names = entries.filter((e) => e.isFile() && isLeftoverTemp(e.name) && !inFlight.has(child(place.dir.node, e.name))).map((e) => e.name);
        } catch (err) {
          throw fail(op, dir, describe(err), err);
        }
        const gone: string[] = [];
        for (const name of names.sort()) {
          try {
            await unlink(via(place.dir, name));
            gone.push(name);
          } catch (err) {
            if (errno(err) !== "ENOENT") throw fail(op, dir, `removing ${name}: ${describe(err)}`, err);
          }
        }
        if (gone.length > 0) await syncDir(op, dir, place.dir);
        return gone;
      });
      return removed ?? [];
    },
  };
}
