// A matcher on a compared difference, as data (so that the deliberate differences and the issue items
// can be listed, rendered and checked): every field given must match; a value matcher is a regular
// expression's source, or "absent" for a key that node does not have.
import type { Area, Difference } from "./diff.ts";

export type ValueMatcher = string | "absent";
export type Matcher = { step?: string; area?: Area; key?: string; gna?: ValueMatcher; trellis?: ValueMatcher };

const valueMatches = (m: ValueMatcher | undefined, v: string | undefined) => m === undefined || (m === "absent" ? v === undefined : v !== undefined && new RegExp(m).test(v));

export function matches(m: Matcher, step: string, d: Difference): boolean {
  return (
    (m.step === undefined || new RegExp(`^(?:${m.step})$`).test(step)) &&
    (m.area === undefined || m.area === d.area) &&
    (m.key === undefined || new RegExp(`^(?:${m.key})$`).test(d.key)) &&
    valueMatches(m.gna, d.gna) &&
    valueMatches(m.trellis, d.trellis)
  );
}
