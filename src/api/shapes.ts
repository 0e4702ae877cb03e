// valibot's object and record schemas accept an array (an object that simply lacks the keys), so a list
// where a mapping belongs read as an empty mapping: `spec: []` became an OSC without units or files, and
// applying it removed everything trellis owned. Every mapping read from outside is one of these.
import * as v from "valibot";

const mappingOnly = v.custom<unknown>((input) => !Array.isArray(input), "Invalid type: Expected a mapping but received a list");

export const object = <const E extends v.ObjectEntries>(entries: E) => v.pipe(mappingOnly, v.object(entries));

/** A mapping of trellis's own formats: a key it does not know is an error, never ignored. */
export const strictObject = <const E extends v.ObjectEntries>(entries: E) => v.pipe(mappingOnly, v.strictObject(entries));

export const looseObject = <const E extends v.ObjectEntries>(entries: E) => v.pipe(mappingOnly, v.looseObject(entries));

export const record = <const K extends v.GenericSchema<string, string | number | symbol>, const V extends v.GenericSchema>(key: K, value: V) =>
  v.pipe(mappingOnly, v.record(key, value));
