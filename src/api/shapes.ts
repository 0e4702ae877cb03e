// valibot's object and record schemas accept an array (an object that simply lacks the keys), so a list
// where a mapping belongs read as an empty mapping: `spec: []` became an OSC without units or files, and
// applying it removed everything trellis owned. Every mapping read from outside is one of these.
import * as v from "valibot";

const mappingOnly = v.custom<unknown>((input) => !Array.isArray(input), "Invalid type: Expected a mapping but received a list");

export const object = <const E extends v.ObjectEntries>(entries: E) => v.pipe(mappingOnly, v.object(entries));

/**
 * A mapping whose unknown key is an error, never ignored: trellis's own formats, and Gardener's
 * (docs/gardener-fields.md). `unknownKey`: the message for that error (others keep valibot's).
 */
export const strictObject = <const E extends v.ObjectEntries>(entries: E, unknownKey?: string) =>
  v.pipe(
    mappingOnly,
    v.strictObject(entries, unknownKey === undefined ? undefined : (issue) => (issue.type === "strict_object" && issue.expected === "never" ? unknownKey : issue.message)),
  );

/** The message for a key that is not a field of Gardener's type `kind`. */
export const notGardenerField = (kind: string) =>
  `unknown field: not in Gardener v1.150's ${kind}; trellis refuses a field it does not know, as it cannot tell whether that field changes what the node must do`;

export const looseObject = <const E extends v.ObjectEntries>(entries: E) => v.pipe(mappingOnly, v.looseObject(entries));

export const record = <const K extends v.GenericSchema<string, string | number | symbol>, const V extends v.GenericSchema>(key: K, value: V) =>
  v.pipe(mappingOnly, v.record(key, value));
