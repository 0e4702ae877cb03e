// valibot's object and record schemas accept an array (an object that simply lacks the keys), so a list
// where a mapping belongs read as an empty mapping: `spec: []` became an OSC without units or files, and
// applying it removed everything trellis owned. Every mapping read from outside is one of these.
import * as v from "valibot";
import { fieldPath } from "./issues.ts";

const mappingOnly = v.custom<unknown>((input) => !Array.isArray(input), "Invalid type: Expected a mapping but received a list");

/** A mapping whose unknown keys are dropped: Gardener's types, decoded as Gardener's non-strict decoder does (unknownKeys names them). */
export const object = <const E extends v.ObjectEntries>(entries: E) => v.pipe(mappingOnly, v.object(entries));

/** A mapping whose unknown key is an error: trellis's own formats. */
export const strictObject = <const E extends v.ObjectEntries>(entries: E) => v.pipe(mappingOnly, v.strictObject(entries));

export const looseObject = <const E extends v.ObjectEntries>(entries: E) => v.pipe(mappingOnly, v.looseObject(entries));

export const record = <const K extends v.GenericSchema<string, string | number | symbol>, const V extends v.GenericSchema>(key: K, value: V) =>
  v.pipe(mappingOnly, v.record(key, value));

/** What unknownKeys reads of a valibot schema. */
type Shape = { kind: string; type: string; pipe?: readonly Shape[]; wrapped?: Shape; item?: Shape; entries?: Record<string, Shape>; value?: Shape };

/**
 * The keys of `input` (which `schema` parsed) that an `object` schema in it dropped, as paths like
 * "spec.files[2].content.foo", in document order. What lies below such a key is not looked at.
 */
export function unknownKeys(schema: v.GenericSchema, input: unknown): string[] {
  const found: string[] = [];
  const walk = (s: Shape, x: unknown, path: string): void => {
    if (x === null || typeof x !== "object") return;
    if (s.pipe) {
      for (const p of s.pipe) if (p.kind === "schema") walk(p, x, path);
    } else if (s.wrapped) walk(s.wrapped, x, path);
    else if (s.type === "array" && s.item && Array.isArray(x)) {
      const item = s.item;
      x.forEach((e, i) => walk(item, e, fieldPath(path, i)));
    } else if (s.entries) {
      // Only `object` drops a key: a strict one refused it, a loose one keeps it.
      for (const [key, e] of Object.entries(x)) {
        const entry = Object.hasOwn(s.entries, key) ? s.entries[key] : undefined;
        if (entry) walk(entry, e, fieldPath(path, key));
        else if (s.type === "object") found.push(fieldPath(path, key));
      }
    } else if (s.type === "record" && s.value) {
      const value = s.value;
      for (const [key, e] of Object.entries(x)) walk(value, e, fieldPath(path, key));
    }
  };
  walk(schema as unknown as Shape, input, "");
  return found;
}
