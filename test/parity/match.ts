// A matcher on a compared difference, as data (so that the deliberate differences and the issue items
// can be listed, rendered and checked): every field given must match; a value matcher is a regular
// expression's source, or "absent" for a key that node does not have.
import type { Area, Difference } from "./diff.ts";

export type ValueMatcher = string | "absent";
/**
 * `ignoring`: the two contents (a file's text, TOML as its parsed value) are the same once every match of
 * this expression is taken out of both: a row that allows one setting, not every difference of the file.
 */
/**
 * `since`: a step id; the matcher holds at that step and every one after it in the scenario (a difference
 * that stays once made, such as a file no later step writes again).
 */
export type Matcher = { step?: string; since?: string; area?: Area; key?: string; gna?: ValueMatcher; trellis?: ValueMatcher; ignoring?: string };

const valueMatches = (m: ValueMatcher | undefined, v: string | undefined) => m === undefined || (m === "absent" ? v === undefined : v !== undefined && new RegExp(m).test(v));

/** `order`: the scenario's step ids in order (for `since`). */
export function matches(m: Matcher, step: string, d: Difference, order: readonly string[] = []): boolean {
  return (
    (m.step === undefined || new RegExp(`^(?:${m.step})$`).test(step)) &&
    (m.since === undefined || (order.includes(m.since) && order.indexOf(step) >= order.indexOf(m.since))) &&
    (m.area === undefined || m.area === d.area) &&
    (m.key === undefined || new RegExp(`^(?:${m.key})$`).test(d.key)) &&
    valueMatches(m.gna, d.gna) &&
    valueMatches(m.trellis, d.trellis) &&
    (m.ignoring === undefined || sameIgnoring(new RegExp(m.ignoring, "g"), d.detail?.gna, d.detail?.trellis))
  );
}

function sameIgnoring(re: RegExp, gna: string | undefined, trellis: string | undefined): boolean {
  const strip = (t: string) => t.replace(re, "").replace(/\s+/g, "");
  return gna !== undefined && trellis !== undefined && strip(gna) === strip(trellis);
}
