// osc.yaml parsed once per content. The YAML parse of a large OSC (1 MiB: 500 files, 50 units) costs
// 100-400 ms of CPU, more than everything else of a reconcile that finds nothing to do; the Secret's
// content rarely changes, so a periodic re-check reuses the last parse of the same bytes (by Gardener's
// checksum of them). The parsed OSC is kept in the state directory too, so a restarted agent's first
// reconcile reads JSON (and validates it again) instead of parsing YAML, when the Secret is unchanged.
// It is kept once its OSC was applied, so an OSC that fails changes nothing on the node.
// Only an OSC that JSON holds exactly is kept (YAML 1.1 can carry .inf and .nan, which JSON cannot).
import * as v from "valibot";
import { parseOscBytes } from "../../api/desired.ts";
import type { Decoded } from "../../api/gardener-decode.ts";
import { type OperatingSystemConfig, OperatingSystemConfigSchema } from "../../api/osc.ts";
import { object } from "../../api/shapes.ts";
import type { Files } from "../../host/files.ts";
import { jsonStore } from "../../host/json-store.ts";
import { describeError, type Logger } from "../../log.ts";

// `ignored`: what the parse did not read, reported again after a restart (absent in a file of a trellis that refused unknown fields).
const ParsedOscSchema = object({ version: v.literal(1), checksum: v.string(), osc: OperatingSystemConfigSchema, ignored: v.optional(v.array(v.string()), []) });
type Kept = { checksum: string; osc: OperatingSystemConfig; ignored: string[] };
/** A kept parse larger than this is not read (the OSC itself is at most 1 MiB of YAML). */
const maxFileBytes = 16 << 20;

export type OscParser = {
  /** osc.yaml's bytes parsed (or the last parse of the same checksum, or the kept one). */
  parse(bytes: Uint8Array, checksum: string, source: string): Promise<Decoded<OperatingSystemConfig>>;
  /**
   * Keeps the parse of `checksum` for the next start, once that OSC was applied: an OSC that fails later
   * (resolving, applying) changes nothing in the state directory, the last good one stays kept.
   */
  keep(checksum: string): Promise<void>;
};

export function createOscParser(o: { files: Files; path: string; log: Logger }): OscParser {
  const store = jsonStore(o.files, o.path, v.optional(ParsedOscSchema), () => undefined, { maxBytes: maxFileBytes });
  let last: { checksum: string; result: Decoded<OperatingSystemConfig> } | undefined;
  let kept: Promise<Kept | undefined> | undefined;
  const readOnce = () => (kept ??= readKept(store, o.path, o.log));

  return {
    async parse(bytes, checksum, source) {
      if (last?.checksum === checksum) return last.result;
      const k = await readOnce();
      const result: Decoded<OperatingSystemConfig> = k?.checksum === checksum ? { ok: true, value: k.osc, ignored: k.ignored } : parseOscBytes(bytes, source);
      last = { checksum, result };
      return result;
    },
    async keep(checksum) {
      if ((await readOnce())?.checksum === checksum) return;
      if (last?.checksum !== checksum || !last.result.ok || !jsonExact(last.result.value)) return;
      const { value: osc, ignored } = last.result;
      kept = Promise.resolve({ checksum, osc, ignored });
      await store.write({ version: 1, checksum, osc, ignored }).catch((err: unknown) => o.log.warn("could not keep the parsed OSC; the next start parses it again", { path: o.path, error: describeError(err) }));
    },
  };
}

async function readKept(store: { read(): Promise<Kept | undefined> }, path: string, log: Logger): Promise<Kept | undefined> {
  try {
    return await store.read();
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
