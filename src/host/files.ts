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
// a directory other users may rename entries in (writable by them and not sticky): such an entry could
// be swapped for a symlink between the check and the write. A final symlink is not followed by writes
// and removals: they replace or remove the link itself.
import { createHash, randomBytes } from "node:crypto";
import type { Stats } from "node:fs";
import { chmod, lstat, mkdir, open, readdir, readFile, readlink, rename, rmdir, stat, unlink, type FileHandle } from "node:fs/promises";
import { basename, dirname, join, resolve } from "node:path";
import { nodePathProblem } from "../api/paths.ts";

export type FileKind = "file" | "dir" | "symlink" | "other";

/** What writeAtomic writes: bytes, text, or a copy of another node file that must have this sha256. */
export type FileContent = Uint8Array | string | { copyFrom: string; sha256: string };

export type FileStat = {
  /** Permission bits only (setuid, setgid and sticky included). */
  mode: number;
  size: number;
  kind: FileKind;
};

export interface Files {
  /** The absolute host directory node paths are mapped under ("/" on a node). */
  readonly root: string;
  /** Content, or undefined when the path does not exist (any other error throws FileError). */
  read(path: string): Promise<Uint8Array | undefined>;
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
  /** Removes a file or symlink (not a directory); false if it was not there. */
  remove(path: string): Promise<boolean>;
  /** Removes a directory only if it is empty; returns whether it did. A non-directory is a FileError. */
  removeDirIfEmpty(path: string): Promise<boolean>;
  /** Names in a directory, sorted; [] if it is missing. */
  list(dir: string): Promise<string[]>;
  /**
   * Deletes the temp files killed writers left in `dir` and returns their names. Writes in flight in this
   * adapter keep theirs; no other process may be writing into `dir` meanwhile.
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
const tempPattern = /^\..*\.trellis-tmp-\d+-[0-9a-f]{12}$/s;
const tempName = (base: string) => `.${base.slice(0, 64)}.trellis-tmp-${process.pid}-${randomBytes(6).toString("hex")}`;

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

/** Does anything (a dangling symlink included) exist at `p`? Other errors than "missing" throw as they are. */
async function lexists(p: string): Promise<boolean> {
  try {
    await lstat(p);
    return true;
  } catch (err) {
    if (errno(err) === "ENOENT" || errno(err) === "ENOTDIR") return false;
    throw err;
  }
}

/** Does `err`, from an operation on `p`, mean nothing is there? ENOTDIR may also mean `p` is a file. */
async function absent(p: string, err: unknown): Promise<boolean> {
  if (errno(err) === "ENOENT") return true;
  // When even lstat fails, `err` is the better report: say "present" so the caller throws it.
  return errno(err) === "ENOTDIR" && !(await lexists(p).catch(() => true));
}

function kindOf(s: { isFile(): boolean; isDirectory(): boolean; isSymbolicLink(): boolean }): FileKind {
  if (s.isFile()) return "file";
  if (s.isDirectory()) return "dir";
  return s.isSymbolicLink() ? "symlink" : "other";
}

/** Why writeAtomic must not replace what is at a path (undefined: a file, a symlink, or nothing). */
function unreplaceable(s: Stats): string | undefined {
  if (s.isDirectory()) return "is a directory";
  if (s.isFIFO()) return "is a FIFO, not a regular file";
  if (s.isSocket()) return "is a socket, not a regular file";
  if (s.isCharacterDevice() || s.isBlockDevice()) return "is a device, not a regular file";
  return undefined;
}

/** The kernel follows at most 40 symlinks in one lookup; so does the resolution here. */
const maxSymlinks = 40;

async function hashHandle(fh: FileHandle): Promise<string> {
  const hash = createHash("sha256");
  const buf = new Uint8Array(1 << 20); // streamed: binaries under /opt/bin are hashed too
  for (;;) {
    const { bytesRead } = await fh.read(buf, 0, buf.length, null);
    if (bytesRead === 0) return hash.digest("hex");
    hash.update(buf.subarray(0, bytesRead));
  }
}

// Streamed in 1 MiB chunks (binaries of 100 MB and more), hashing what was copied.
async function copyVerified(to: FileHandle, sourceHost: string, source: string, sha256: string): Promise<void> {
  const from = await open(sourceHost, "r");
  try {
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
  } finally {
    await from.close();
  }
}

/** The host path of node path `path` for a Files adapter whose root is `root` (as Files.root gives it). */
export function hostPathUnder(root: string, path: string): string {
  return root === "/" ? path : path === "/" ? root : root + path;
}

export function createFiles(rootDir = "/"): Files {
  const root = resolve(rootDir);
  // Host paths of the temp files writes in flight are filling: cleanupTemp must not pull them away.
  const inFlight = new Set<string>();

  const fail = (op: string, path: string, reason: string, cause?: unknown) => new FileError(op, path, reason, { cause, root });
  const host = (path: string) => hostPathUnder(root, path);

  // Who may own what is walked through: root, and the owner of the root directory (a tree unpacked by
  // another user for `plan --root`). Read once: the root does not change owners under a running agent.
  // The root is the caller's choice, so a symlink naming it (a node's /proc/PID/root) is followed: its
  // own mode (0777) says nothing about who may rename entries of the directory it names.
  let rootInfo: Promise<{ trusted: Set<number>; stat: Stats }> | undefined;
  const rootOf = (op: string, path: string) =>
    (rootInfo ??= stat(root).then((st) => ({ trusted: new Set([0, st.uid]), stat: st }))).catch((err: unknown) => {
      rootInfo = undefined;
      throw fail(op, path, `cannot resolve the root: ${describe(err)}`, err);
    });

  // Can users other than the trusted ones rename entries of this directory?
  const swappable = (dir: Stats, trusted: Set<number>) =>
    !(dir.mode & 0o1000) && (!!(dir.mode & 0o002) || (!!(dir.mode & 0o020) && !trusted.has(dir.gid)));

  /**
   * Checks `path` and returns its host path with every symlink on the way resolved within the root;
   * `follow`: the final component too. Components that do not exist yet are kept as they are.
   */
  async function locate(op: string, path: string, follow: boolean): Promise<string> {
    checkNodePath(path, op);
    const { trusted, stat: rootStat } = await rootOf(op, path);
    const todo = path.split("/").filter((p) => p !== "");
    let dir = ""; // the resolved node path walked so far ("" is the root)
    let dirStat = rootStat;
    let links = 0;
    while (todo.length > 0) {
      const name = todo.shift() as string;
      if (name === ".") continue;
      if (name === "..") {
        dir = dirname(dir || "/") === "/" ? "" : dirname(dir);
        dirStat = await lstat(host(dir || "/"));
        continue;
      }
      const node = `${dir}/${name}`;
      const last = todo.length === 0;
      if (last && !follow) return host(node);
      let st: Stats;
      try {
        st = await lstat(host(node));
      } catch (err) {
        if (errno(err) === "ENOENT") return host([node, ...todo].join("/"));
        throw fail(op, path, `resolving ${node}: ${describe(err)}`, err);
      }
      if (!trusted.has(st.uid)) throw fail(op, path, `${node} is owned by uid ${st.uid}, not root: trellis does not walk through it (unsafe path transition)`);
      if (swappable(dirStat, trusted)) throw fail(op, path, `${dir || "/"} lets other users rename ${name} in it: trellis does not walk through it (unsafe path transition)`);
      if (st.isSymbolicLink()) {
        if (++links > maxSymlinks) throw fail(op, path, `more than ${maxSymlinks} symlinks on the way (${reasons.ELOOP})`);
        const target = await readlink(host(node));
        todo.unshift(...target.split("/").filter((p) => p !== ""));
        if (target.startsWith("/")) [dir, dirStat] = ["", rootStat];
        continue;
      }
      if (st.isDirectory()) [dir, dirStat] = [node, st];
      // A file where a directory should be: the operation itself meets ENOTDIR ("missing" for reads).
      else return host([node, ...todo].join("/"));
    }
    return host(dir || "/");
  }

  /** The host path a write of `path` renames over, after checking that what is there may be replaced. */
  async function replaceable(op: string, path: string): Promise<string> {
    if (path === "/") throw fail(op, path, "cannot replace the root directory");
    const target = await locate(op, path, false);
    try {
      const problem = unreplaceable(await lstat(target));
      if (problem) throw fail(op, path, problem);
    } catch (err) {
      if (err instanceof FileError) throw err;
      if (errno(err) === "ENOTDIR") throw fail(op, path, "a parent is not a directory (ENOTDIR)", err);
      if (errno(err) !== "ENOENT") throw fail(op, path, describe(err), err);
    }
    return target;
  }

  async function syncDir(op: string, path: string, dir: string): Promise<void> {
    let fh: FileHandle | undefined;
    try {
      fh = await open(dir, "r");
      await fh.sync();
    } catch (err) {
      throw fail(op, path, `fsync of directory ${dir}: ${describe(err)}`, err);
    } finally {
      await fh?.close();
    }
  }

  // mkdir -p, except that each directory made gets exactly 0755 (mkdir's mode is masked by the umask)
  // and is fsynced into its parent: a crash must not lose a directory a file was already renamed into.
  async function makeParents(op: string, path: string, dir: string): Promise<void> {
    const missing: string[] = [];
    try {
      for (let d = dir; !(await lexists(d)); d = dirname(d)) missing.unshift(d);
    } catch (err) {
      throw fail(op, path, `looking for missing parents of ${dir}: ${describe(err)}`, err);
    }
    for (const d of missing) {
      try {
        await mkdir(d, 0o755);
        await chmod(d, 0o755);
      } catch (err) {
        throw fail(op, path, `creating directory ${d}: ${describe(err)}`, err);
      }
      await syncDir(op, path, dirname(d));
    }
  }

  // "wx" is O_CREAT|O_EXCL: never opens an existing file or follows a symlink planted at the temp path.
  // 0600 until the fchmod, so the content is never readable by others before it is complete.
  async function createTemp(op: string, path: string, temp: string): Promise<FileHandle> {
    try {
      return await open(temp, "wx", 0o600);
    } catch (err) {
      if (errno(err) !== "ENOENT") throw fail(op, path, `creating temp file ${temp}: ${describe(err)}`, err);
    }
    await makeParents(op, path, dirname(temp));
    try {
      return await open(temp, "wx", 0o600);
    } catch (err) {
      throw fail(op, path, `creating temp file ${temp}: ${describe(err)}`, err);
    }
  }

  /** Removes the temp file of a failed write and returns the FileError to throw (naming both failures). */
  async function abandon(op: string, path: string, temp: string, step: string, err: unknown): Promise<FileError> {
    let reason = `${step}: ${describe(err)}`;
    try {
      await unlink(temp);
    } catch (unlinkErr) {
      if (errno(unlinkErr) !== "ENOENT") reason += `; removing the temp file ${temp} failed too: ${describe(unlinkErr)}`;
    }
    return fail(op, path, reason, err);
  }

  async function fillTemp(op: string, path: string, temp: string, content: FileContent, mode: number): Promise<void> {
    let fill: (fh: FileHandle) => Promise<void>;
    if (typeof content === "object" && "copyFrom" in content) {
      const from = await locate(op, content.copyFrom, true); // a bad source path fails before any temp file exists
      fill = (fh) => copyVerified(fh, from, content.copyFrom, content.sha256);
    } else fill = (fh) => fh.writeFile(content);
    const fh = await createTemp(op, path, temp);
    let failure: unknown;
    try {
      await fill(fh);
      await fh.chmod(mode); // after writing: a write by a non-root user would clear setuid/setgid
      await fh.sync();
    } catch (err) {
      failure = err;
    }
    try {
      await fh.close();
    } catch (err) {
      failure ??= err;
    }
    if (failure !== undefined) throw await abandon(op, path, temp, `writing temp file ${temp}`, failure);
  }

  return {
    root,

    async read(path) {
      const p = await locate("read", path, true);
      try {
        return await readFile(p);
      } catch (err) {
        if (await absent(p, err)) return undefined;
        throw fail("read", path, describe(err), err);
      }
    },

    async stat(path) {
      const p = await locate("stat", path, false);
      try {
        const s = await lstat(p);
        return { mode: s.mode & 0o7777, size: s.size, kind: kindOf(s) };
      } catch (err) {
        if (await absent(p, err)) return undefined;
        throw fail("stat", path, describe(err), err);
      }
    },

    async sha256(path) {
      const p = await locate("sha256", path, true);
      let fh: FileHandle;
      try {
        fh = await open(p, "r");
      } catch (err) {
        if (await absent(p, err)) return undefined;
        throw fail("sha256", path, describe(err), err);
      }
      try {
        return await hashHandle(fh);
      } catch (err) {
        throw fail("sha256", path, describe(err), err);
      } finally {
        await fh.close();
      }
    },

    async writeProblem(path) {
      try {
        await replaceable("writeAtomic", path);
        return undefined;
      } catch (err) {
        if (err instanceof FileError) return err.reason;
        throw err;
      }
    },
    async landsAt(path) {
      try {
        const at = await locate("landsAt", path, false);
        return root === "/" ? at : at.slice(root.length) || "/";
      } catch (err) {
        if (err instanceof FileError) return undefined;
        throw err;
      }
    },

    async writeAtomic(path, content, mode) {
      const op = "writeAtomic";
      if (!Number.isInteger(mode) || mode < 0 || mode > 0o7777) throw fail(op, path, `mode ${showMode(mode)} is not a permission mode (0 to 0o7777)`);
      const target = await replaceable(op, path);
      const dir = dirname(target);
      const temp = join(dir, tempName(basename(target)));
      inFlight.add(temp);
      try {
        await fillTemp(op, path, temp, content, mode);
        try {
          await rename(temp, target);
        } catch (err) {
          throw await abandon(op, path, temp, "renaming the temp file over it", err);
        }
      } finally {
        inFlight.delete(temp);
      }
      await syncDir(op, path, dir);
    },

    async remove(path) {
      const p = await locate("remove", path, false);
      try {
        await unlink(p);
      } catch (err) {
        if (await absent(p, err)) return false;
        throw fail("remove", path, describe(err), err);
      }
      await syncDir("remove", path, dirname(p));
      return true;
    },

    async removeDirIfEmpty(path) {
      const p = await locate("removeDirIfEmpty", path, false);
      try {
        await rmdir(p);
      } catch (err) {
        if (errno(err) === "ENOTEMPTY" || errno(err) === "EEXIST" || (await absent(p, err))) return false;
        throw fail("removeDirIfEmpty", path, describe(err), err);
      }
      await syncDir("removeDirIfEmpty", path, dirname(p));
      return true;
    },

    async list(dir) {
      const p = await locate("list", dir, true);
      try {
        return (await readdir(p)).sort(); // sorted: plans built from listings must be deterministic
      } catch (err) {
        if (await absent(p, err)) return [];
        throw fail("list", dir, describe(err), err);
      }
    },

    async cleanupTemp(dir) {
      const op = "cleanupTemp";
      const p = await locate(op, dir, true);
      let names: string[];
      try {
        const entries = await readdir(p, { withFileTypes: true });
        names = entries.filter((e) => e.isFile() && tempPattern.test(e.name) && !inFlight.has(join(p, e.name))).map((e) => e.name);
      } catch (err) {
        if (await absent(p, err)) return [];
        throw fail(op, dir, describe(err), err);
      }
      const removed: string[] = [];
      for (const name of names.sort()) {
        try {
          await unlink(join(p, name));
          removed.push(name);
        } catch (err) {
          if (errno(err) !== "ENOENT") throw fail(op, dir, `removing ${name}: ${describe(err)}`, err);
        }
      }
      if (removed.length > 0) await syncDir(op, dir, p);
      return removed;
    },
  };
}
