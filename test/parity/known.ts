// The differences trellis issue 20 already names (items 1–14), for the report only: they still fail the
// test until fixed, but the report says which item each belongs to, so that only news reads as news.
import type { Matcher } from "./match.ts";

export type KnownItem = { item: string; title: string; match: Matcher[] };

/** The steps whose OSC gardener-node-agent takes and trellis refused at d167130 (issue 20 item 1). */
const refusedSteps = "unknown-field-content|unknown-field-spec|unknown-top-level-anchor|dropin-repeated|dropin-not-conf|same-path-spec-status|big-osc";

export const knownItems: KnownItem[] = [
  { item: "1", title: "refusals that block a pool (unknown fields, drop-in names, a path in spec and status, the YAML token cap)", match: [{ step: refusedSteps }] },
];
