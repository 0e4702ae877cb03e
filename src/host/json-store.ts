// The JSON files the agent keeps in its state directory: written atomically, read through Files and
// parsed at the edge like everything else read from outside.
import * as v from "valibot";
import { formatIssues } from "../api/issues.ts";
import type { Files } from "./files.ts";

/**
 * A JSON file of the agent's (0600), parsed with `schema`; missing is `empty()`, unreadable (or larger
 * than `maxBytes`) is an error naming the file.
 */
export function jsonStore<S extends v.GenericSchema>(files: Files, path: string, schema: S, empty: () => v.InferOutput<S>, opts: { maxBytes?: number } = {}) {
  return {
    read: async (): Promise<v.InferOutput<S>> => {
      const raw = await files.read(path, opts);
      if (!raw) return empty();
      let doc: unknown;
      try {
        doc = JSON.parse(new TextDecoder().decode(raw));
      } catch (err) {
        throw new Error(`${path}: not valid JSON (${err instanceof Error ? err.message : String(err)}); move it away to start over`);
      }
      const r = v.safeParse(schema, doc);
      if (!r.success) throw new Error(`${path}: ${formatIssues(r.issues).join("; ")}; move it away to start over`);
      return r.output;
    },
    write: (value: v.InferOutput<S>) => files.writeAtomic(path, `${JSON.stringify(value)}\n`, 0o600),
  };
}
