// One trellis at a time on a machine: the agent, `trellis apply` and `trellis bootstrap` each hold an
// exclusive flock(2) on a lock file in the agent's state directory while they change the node.
//
// flock rather than an O_EXCL pid file: the kernel drops the lock with the last descriptor, so a
// killed holder (kill -9, OOM, power loss) leaves nothing stale behind, and no liveness guess from a
// PID that may have been reused is ever needed. The file holds the holder's PID and command only to
// name them to whoever is refused.
import { closeSync, constants, ftruncateSync, mkdirSync, openSync, readFileSync, writeSync } from "node:fs";
import { dirname } from "node:path";
import { tryExclusiveFlock } from "../runtime.ts";

export class StateLockedError extends Error {
  override name = "StateLockedError";
  constructor(
    readonly path: string,
    /** The holder as its lock file names it (undefined: it has not written itself in yet). */
    readonly holder: { pid: number; command: string; since: string } | undefined,
  ) {
    super(
      holder
        ? `another trellis is running on this machine: PID ${holder.pid} (trellis ${holder.command}, since ${holder.since}) holds ${path}; wait for it to finish, or stop it first`
        : `another trellis is running on this machine: it holds ${path} (its PID is not written yet); try again`,
    );
  }
}

export type StateLock = { readonly path: string; release(): void };

/** Takes the lock at `path` (creating it and its directory), or throws StateLockedError naming the holder. */
export async function lockStateDir(path: string, command: string): Promise<StateLock> {
  mkdirSync(dirname(path), { recursive: true, mode: 0o700 });
  const fd = openSync(path, constants.O_RDWR | constants.O_CREAT | constants.O_NOFOLLOW, 0o600); // close-on-exec by default: no child inherits the lock
  let locked = false;
  try {
    locked = await tryExclusiveFlock(fd);
  } finally {
    if (!locked) closeSync(fd);
  }
  if (!locked) throw new StateLockedError(path, holderOf(path));
  ftruncateSync(fd, 0);
  writeSync(fd, `${JSON.stringify({ pid: process.pid, command, since: new Date().toISOString() })}\n`, 0);
  return {
    path,
    // Closing the descriptor is what releases the lock; the file stays (removing it would race a newcomer).
    release: () => closeSync(fd),
  };
}

function holderOf(path: string): StateLockedError["holder"] {
  try {
    const doc = JSON.parse(readFileSync(path, "utf8")) as { pid?: unknown; command?: unknown; since?: unknown };
    if (typeof doc.pid === "number" && typeof doc.command === "string" && typeof doc.since === "string") return { pid: doc.pid, command: doc.command, since: doc.since };
  } catch {
    // Empty or half-written: the holder has the lock but has not written itself in yet.
  }
  return undefined;
}
