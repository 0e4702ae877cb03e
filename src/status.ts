// The status board the controllers report into. /readyz reads it in memory; `trellis status` reads the
// copy written to /run/trellis/status.json — atomically, at most once a second however often the
// controllers report, and at least every heartbeat so a reader can tell a running agent from a dead one.
//
// The file is world-readable (0644) so that `trellis status` needs no root. Controllers must not put
// credentials into their details; as a second line of defence, anything that looks like one (a bearer
// token, a JWT, a bootstrap token, a private key) is replaced before it is kept or written.
import { statusPath, type StatusFile } from "./api/status-file.ts";
import type { ComponentStatus, StatusBoard } from "./controllers/types.ts";
import type { Files } from "./host/files.ts";
import { describeError, type Logger } from "./log.ts";
import type { Readiness } from "./server.ts";
import { monotonicMs } from "./time.ts";

export type PersistentStatusBoard = StatusBoard & {
  /** Stops the periodic writes and writes the last snapshot, marked as stopped. */
  close(): Promise<void>;
};

export type StatusBoardOptions = {
  files: Files;
  log: Logger;
  /** Writes are at least this far apart (1 s). */
  minIntervalMs?: number;
  /** The file is rewritten at least this often (30 s). */
  heartbeatMs?: number;
  /** The wall clock: the file's timestamps, for people and `trellis status` (the write pacing is monotonic). */
  now?: () => number;
};

export function createStatusBoard(opts: StatusBoardOptions): PersistentStatusBoard {
  const log = opts.log.with({ component: "status" });
  const now = opts.now ?? Date.now;
  const minIntervalMs = opts.minIntervalMs ?? 1000;
  const heartbeatMs = opts.heartbeatMs ?? 30_000;
  const startedAt = iso(now());
  const components: Record<string, ComponentStatus> = {};
  let lastWrite = -Infinity;
  let timer: ReturnType<typeof setTimeout> | undefined;
  let writing: Promise<void> | undefined;
  let dirty = false;
  let closed = false;
  let failing = false;

  const snapshot = (stoppedAt?: string): StatusFile => ({
    version: 1,
    pid: process.pid,
    startedAt,
    writtenAt: iso(now()),
    heartbeatSeconds: heartbeatMs / 1000,
    ...(stoppedAt ? { stoppedAt } : {}),
    components,
  });

  const write = async (file: StatusFile) => {
    lastWrite = monotonicMs();
    try {
      await opts.files.writeAtomic(statusPath, `${JSON.stringify(file, null, 2)}\n`, 0o644);
      if (failing) log.info("writing the status file works again", { path: statusPath });
      failing = false;
    } catch (err) {
      // Once per failing streak: a read-only /run would otherwise log every heartbeat.
      if (!failing) log.warn("could not write the status file; `trellis status` will show the agent as not running", { error: err });
      failing = true;
    }
  };

  // Single flight: a change during a write is written after it, no sooner than minIntervalMs later.
  const schedule = () => {
    if (closed || timer) return;
    if (writing) return void (dirty = true);
    timer = setTimeout(
      () => {
        timer = undefined;
        dirty = false;
        writing = write(snapshot()).finally(() => {
          writing = undefined;
          if (dirty) schedule();
        });
      },
      Math.max(0, lastWrite + minIntervalMs - monotonicMs()),
    );
  };
  const heartbeat = setInterval(schedule, heartbeatMs);
  schedule();

  return {
    set(component, status) {
      components[component] = { ...(scrub(status) as ComponentStatus), at: iso(now()) };
      schedule();
    },
    snapshot: () => ({ ...components }),
    async close() {
      closed = true;
      clearInterval(heartbeat);
      if (timer) clearTimeout(timer);
      await writing;
      await write(snapshot(iso(now())));
    },
  };
}

/** Ready while every component that reported is ok; the reasons name the ones that are not. */
export function readiness(board: StatusBoard): Readiness {
  const failing = Object.entries(board.snapshot()).filter(([, s]) => !s.ok);
  return { ok: failing.length === 0, reasons: failing.map(([name, s]) => `${name}: ${s.summary}`) };
}

const credentialPatterns: RegExp[] = [
  /-----BEGIN [A-Z ]*PRIVATE KEY-----[\s\S]*?(-----END [A-Z ]*PRIVATE KEY-----|$)/g,
  /\bBearer\s+\S+/gi,
  /\beyJ[\w-]*\.[\w-]+\.[\w-]*/g, // a JWT (service account token): base64url of '{"'
  /\b[a-z0-9]{6}\.[a-z0-9]{16}\b/g, // a bootstrap token
];

/** A JSON-safe copy with credential-looking strings replaced; Errors become their messages. */
function scrub(value: unknown): unknown {
  if (typeof value === "string") return credentialPatterns.reduce((s, re) => s.replace(re, "[redacted]"), value);
  if (value instanceof Error) return scrub(describeError(value));
  if (value instanceof Date) return value.toISOString();
  if (typeof value === "bigint") return String(value);
  if (Array.isArray(value)) return value.map(scrub);
  if (value && typeof value === "object") return Object.fromEntries(Object.entries(value).map(([k, v]) => [k, scrub(v)]));
  return value;
}

const iso = (ms: number) => new Date(ms).toISOString();
