// Structured logs: one JSON object per line on stderr, which journald stores as the MESSAGE and
// `journalctl -o cat | jq` reads back; or, with the configuration's `logFormat: text`, a line for people
// as gardener-node-agent's (zap's console encoder) is. Credentials are never passed to the logger in the first place.
// When stderr is the journal, each line starts with its sd-daemon priority prefix ("<4>" for a
// warning), which journald takes off and stores as PRIORITY, so `journalctl -p warning` works.
import { fstatSync } from "node:fs";

export type Level = "debug" | "info" | "warn" | "error";
export type Format = "json" | "text";
const order: Record<Level, number> = { debug: 10, info: 20, warn: 30, error: 40 };
/** syslog priorities (sd-daemon(3)): err, warning, info, debug. */
const priority: Record<Level, number> = { debug: 7, info: 6, warn: 4, error: 3 };

export type Fields = Record<string, unknown>;

export interface Logger {
  debug(msg: string, fields?: Fields): void;
  info(msg: string, fields?: Fields): void;
  warn(msg: string, fields?: Fields): void;
  error(msg: string, fields?: Fields): void;
  /** A logger that adds `fields` to every line (e.g. the controller's name). */
  with(fields: Fields): Logger;
  /** Changes the level of this logger and of every logger made from it with `with` (SIGHUP). */
  setLevel(level: Level): void;
}

export function createLogger(
  opts: { level?: Level; format?: Format; write?: (line: string, level: Level) => void; base?: Fields } = {},
): Logger {
  const shared = { min: order[opts.level ?? "info"], write: opts.write ?? writeStderr, format: formats[opts.format ?? "json"] };
  return make(shared, opts.base ?? {});
}

type Shared = { min: number; write: (line: string, level: Level) => void; format: (ts: string, level: Level, msg: string, fields: Fields) => string };

const formats: Record<Format, Shared["format"]> = {
  json: (ts, level, msg, fields) => JSON.stringify({ ts, level, msg, ...fields }),
  // zap's console encoder: time, level, message and the fields as JSON, tab-separated. The message's
  // line breaks are escaped: one entry must stay one line, one journal record.
  text: (ts, level, msg, fields) => [ts, level.toUpperCase(), msg.replaceAll("\n", "\\n"), ...(Object.keys(fields).length > 0 ? [JSON.stringify(fields)] : [])].join("\t"),
};

function make(shared: Shared, base: Fields): Logger {
  const emit = (level: Level, msg: string, fields?: Fields) => {
    if (order[level] < shared.min) return;
    shared.write(shared.format(new Date().toISOString(), level, msg, { ...base, ...serialise(fields) }), level);
  };
  return {
    debug: (m, f) => emit("debug", m, f),
    info: (m, f) => emit("info", m, f),
    warn: (m, f) => emit("warn", m, f),
    error: (m, f) => emit("error", m, f),
    with: (fields) => make(shared, { ...base, ...fields }),
    setLevel: (level) => (shared.min = order[level]),
  };
}

const writeStderr = (line: string, level: Level) => process.stderr.write(`${journalPrefix(level)}${line}\n`);

let stderrIsJournal: boolean | undefined;
/**
 * "<N>" when stderr is connected to the journal, "" otherwise (a terminal, a pipe, a test). systemd
 * says so in JOURNAL_STREAM (device:inode of the stream), which must match stderr itself: a child
 * whose stderr was redirected inherits the variable too.
 */
export function journalPrefix(level: Level): string {
  stderrIsJournal ??= isJournalStream(process.env.JOURNAL_STREAM);
  return stderrIsJournal ? `<${priority[level]}>` : "";
}

function isJournalStream(value: string | undefined): boolean {
  if (!value) return false;
  try {
    const st = fstatSync(2);
    return value === `${st.dev}:${st.ino}`;
  } catch {
    return false; // no stderr at all: nothing to prefix
  }
}

// Errors do not survive JSON.stringify (their fields are not enumerable): log message and cause chain.
function serialise(fields: Fields | undefined): Fields {
  if (!fields) return {};
  const out: Fields = {};
  for (const [k, v] of Object.entries(fields)) out[k] = v instanceof Error ? describeError(v) : v;
  return out;
}

/** The message and its causes' messages, skipping a cause the message already quotes; String() of a non-Error. */
export function describeError(err: unknown): string {
  if (!(err instanceof Error)) return String(err);
  let text = err.message;
  for (let c: unknown = err.cause; c instanceof Error; c = c.cause) if (!text.includes(c.message)) text += `: ${c.message}`;
  return text;
}
