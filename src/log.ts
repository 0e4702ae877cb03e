// Structured logs: one JSON object per line on stderr, which journald stores as the MESSAGE and
// `journalctl -o cat | jq` reads back. Credentials are never passed to the logger in the first place.
export type Level = "debug" | "info" | "warn" | "error";
const order: Record<Level, number> = { debug: 10, info: 20, warn: 30, error: 40 };

export type Fields = Record<string, unknown>;

export interface Logger {
  debug(msg: string, fields?: Fields): void;
  info(msg: string, fields?: Fields): void;
  warn(msg: string, fields?: Fields): void;
  error(msg: string, fields?: Fields): void;
  /** A logger that adds `fields` to every line (e.g. the controller's name). */
  with(fields: Fields): Logger;
}

export function createLogger(
  opts: { level?: Level; write?: (line: string) => void; base?: Fields } = {},
): Logger {
  const min = order[opts.level ?? "info"];
  const write = opts.write ?? ((line: string) => process.stderr.write(line + "\n"));
  const base = opts.base ?? {};
  const emit = (level: Level, msg: string, fields?: Fields) => {
    if (order[level] < min) return;
    write(JSON.stringify({ ts: new Date().toISOString(), level, msg, ...base, ...serialise(fields) }));
  };
  return {
    debug: (m, f) => emit("debug", m, f),
    info: (m, f) => emit("info", m, f),
    warn: (m, f) => emit("warn", m, f),
    error: (m, f) => emit("error", m, f),
    with: (fields) => createLogger({ ...opts, base: { ...base, ...fields } }),
  };
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
