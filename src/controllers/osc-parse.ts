// osc.yaml parsed once per content. The YAML parse of a large OSC (1 MiB: 500 files, 50 units) costs
// 100-400 ms of CPU, more than everything else of a reconcile that finds nothing to do; the Secret's
// content rarely changes, so a periodic re-check reuses the last parse of the same bytes (by Gardener's
// checksum of them). The parsed OSC is kept in the state directory too, so a restarted agent's first
// reconcile reads JSON (and validates it again) instead of parsing YAML, when the Secret is unchanged.
// Only an OSC that JSON holds exactly is kept (YAML can carry timestamps, which JSON would turn into text).
import * as v from "valibot";
import { parseOscBytes } from "../api/desired.ts";
import { type OperatingSystemConfig, OperatingSystemConfigSchema } from "../api/osc.ts";
import type { Result } from "../api/result.ts";
import { object } from "../api/shapes.ts";
import type { Files } from "../host/files.ts";
import { describeError, type Logger } from "../log.ts";

const ParsedOscSchema = object({ version: v.literal(1), checksum: v.string(), osc: OperatingSystemConfigSchema });
/** A kept parse larger than this is not read (the OSC itself is at most 2 MiB of YAML). */
const maxFileBytes = 16 << 20;

export type OscParser = (bytes: Uint8Array, checksum: string, source: string) => Promise<Result<OperatingSystemConfig>>;

export function createOscParser(o: { files: Files; path: string; log: Logger }): OscParser {
  let last: { checksum: string; result: Result<OperatingSystemConfig> } | undefined;
  let kept: Promise<{ checksum: string; osc: OperatingSystemConfig } | undefined> | undefined;

  return async (bytes, checksum, source) => {
    if (last?.checksum === checksum) return last.result;
    kept ??= readKept(o.files, o.path, o.log);
    const k = await kept;
    let result: Result<OperatingSystemConfig>;
    if (k?.checksum === checksum) result = { ok: true, value: k.osc };
    else {
      result = parseOscBytes(bytes, source);
      if (result.ok && jsonExact(result.value)) {
        const doc = { version: 1, checksum, osc: result.value };
        await o.files.writeAtomic(o.path, JSON.stringify(doc), 0o600).catch((err: unknown) => o.log.warn("could not keep the parsed OSC; the next start parses it again", { path: o.path, error: describeError(err) }));
        kept = Promise.resolve({ checksum, osc: result.value });
      }
    }
    last = { checksum, result };
    return result;
  };
}

async function readKept(files: Files, path: string, log: Logger): Promise<{ checksum: string; osc: OperatingSystemConfig } | undefined> {
  try {
    const st = await files.stat(path);
    if (!st) return undefined;
    if (st.size > maxFileBytes) throw new Error(`${st.size} bytes, more than ${maxFileBytes}`);
    const parsed = v.safeParse(ParsedOscSchema, JSON.parse(new TextDecoder().decode(await files.read(path))));
    if (!parsed.success) throw new Error(v.summarize(parsed.issues));
    return parsed.output;
  } catch (err) {
    log.warn("ignoring the kept parse of the OSC: parsing osc.yaml", { path, error: describeError(err) });
    return undefined;
  }
}

/** Does JSON hold `value` exactly: plain objects, arrays, strings, finite numbers (not -0), booleans and null only? */
export function jsonExact(value: unknown): boolean {
  if (value === null || typeof value === "string" || typeof value === "boolean") return true;
  if (typeof value === "number") return Number.isFinite(value) && !Object.is(value, -0);
  if (Array.isArray(value)) return value.every(jsonExact);
  if (typeof value !== "object" || Object.getPrototypeOf(value) !== Object.prototype) return false;
  return Object.values(value).every((x) => x !== undefined && jsonExact(x));
}
