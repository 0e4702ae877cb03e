// osc.yaml parsed once per content. The YAML parse of a large OSC (1 MiB: 500 files, 50 units) costs
// 100-400 ms of CPU, more than everything else of a reconcile that finds nothing to do; the Secret's
// content rarely changes, so a re-check of the same bytes (by Gardener's checksum of them) does not parse
// them again. Once its OSC was applied, the parse is kept in the state directory (an OSC that fails
// changes nothing on the node) and no longer in memory: a re-check of an applied OSC, and a restarted
// agent's first reconcile, read that JSON and validate it again (5-10 ms for the 1 MiB OSC), where the
// parse held in memory would cost its megabytes on every node for as long as the OSC stays (issue 21).
// Until then (an OSC that fails, and is retried) the last parse stays in memory.
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
  /**
   * osc.yaml's bytes parsed (or the last parse of the same checksum, or the kept one). Without the bytes
   * (the caller let go of them once their OSC was kept): the kept parse, or undefined when it is not there
   * or unreadable.
   */
  parse(bytes: Uint8Array, checksum: string, source: string): Promise<Decoded<OperatingSystemConfig>>;
  parse(bytes: Uint8Array | undefined, checksum: string, source: string): Promise<Decoded<OperatingSystemConfig> | undefined>;
  /**
   * Keeps the parse of `checksum` for the next start, once that OSC was applied: an OSC that fails later
   * (resolving, applying) changes nothing in the state directory, the last good one stays kept.
   */
  keep(checksum: string): Promise<void>;
  /** The checksum of the parse kept in the state directory, as far as this parser knows (it read or wrote it). */
  kept(): string | undefined;
};

export function createOscParser(o: { files: Files; path: string; log: Logger }): OscParser {
  const store = jsonStore(o.files, o.path, v.optional(ParsedOscSchema), () => undefined, { maxBytes: maxFileBytes });
  /** A parse not kept (yet): an OSC that was not applied, retried. */
  let last: { checksum: string; result: Decoded<OperatingSystemConfig> } | undefined;
  /** What the state directory holds, once read (or written): only the checksum, the parse is read again when asked for. */
  let kept: { checksum: string | undefined } | undefined;

  async function parse(bytes: Uint8Array, checksum: string, source: string): Promise<Decoded<OperatingSystemConfig>>;
  async function parse(bytes: Uint8Array | undefined, checksum: string, source: string): Promise<Decoded<OperatingSystemConfig> | undefined>;
  async function parse(bytes: Uint8Array | undefined, checksum: string, source: string): Promise<Decoded<OperatingSystemConfig> | undefined> {
    if (last?.checksum === checksum) return last.result;
    if (!kept || kept.checksum === checksum) {
      const k = await readKept(store, o.path, o.log);
      kept = { checksum: k?.checksum };
      if (k?.checksum === checksum) {
        last = undefined; // an OSC that failed, no longer the Secret's
        return { ok: true, value: k.osc, ignored: k.ignored };
      }
    }
    if (!bytes) return undefined;
    const result = parseOscBytes(bytes, source);
    last = { checksum, result };
    return result;
  }

  return {
    parse,
    async keep(checksum) {
      // Not parsed here (the kept one was read: nothing to keep), failed, or what JSON would change.
      if (last?.checksum !== checksum || !last.result.ok || !jsonExact(last.result.value)) return;
      const { value: osc, ignored } = last.result;
      try {
        await store.write({ version: 1, checksum, osc, ignored });
      } catch (err) {
        o.log.warn("could not keep the parsed OSC; the next start parses it again", { path: o.path, error: describeError(err) });
        return;
      }
      kept = { checksum };
      last = undefined;
    },
    kept: () => kept?.checksum,
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
