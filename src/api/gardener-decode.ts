// Gardener's types read as gardener-node-agent's codec reads them (pkg/nodeagent/codec.go: YAML through
// sigs.k8s.io/yaml, then JSON, not strict): a key no field of the type has is dropped, and a key given
// twice takes its later value. trellis does the same and says what it dropped, so that nothing in the
// input goes unread without a word.
import * as v from "valibot";
import { formatIssues } from "./issues.ts";
import { unknownKeys } from "./shapes.ts";
import { parseYaml } from "./yaml.ts";

/** The value, and one line for each part of the input it does not carry (a dropped key, a replaced value). */
export type Decoded<T> = { ok: true; value: T; ignored: string[] } | { ok: false; errors: string[] };

/** `kind`: the type's name, for the report ("OperatingSystemConfig"). Errors and reports name `source` and the field. */
export function decodeGardener<S extends v.GenericSchema>(schema: S, kind: string, text: string, source: string): Decoded<v.InferOutput<S>> {
  const doc = parseYaml(text, source);
  if (!doc.ok) return doc;
  const r = v.safeParse(schema, doc.value);
  if (!r.success) return { ok: false, errors: formatIssues(r.issues).map((e) => `${source}: ${e}`) };
  const ignored = [
    ...doc.replaced.map((what) => `${source}: ${what}, as gardener-node-agent's decoder replaces it`),
    ...unknownKeys(schema, doc.value).map((path) => `${source}: ${path}: not a field of Gardener v1.150's ${kind}; ignored, as gardener-node-agent ignores it`),
  ];
  return { ok: true, value: r.output, ignored };
}
