// The accepted-input corpus (test/fixtures/accepted-input): OSCs gardener-node-agent applies and trellis
// once refused, each with the report it must now make and what the node must hold after applying it.
import { readFileSync } from "node:fs";
import { parse } from "yaml";
import { generated } from "../fixtures/accepted-input/generate.ts";

const dir = new URL("../fixtures/accepted-input/", import.meta.url).pathname;

export type AcceptedCase = {
  name: string;
  class: string;
  /** Text the report (event, condition, plan's note) must contain, after the object's name. */
  report: string;
  /** What the node holds afterwards: path → content. */
  files: Record<string, string>;
  generate?: string;
};

export function loadAcceptedCases(): AcceptedCase[] {
  return parse(readFileSync(`${dir}/cases.yaml`, "utf8")) as AcceptedCase[];
}

/** osc.yaml's bytes of a case. */
export function acceptedOscBytes(c: AcceptedCase): Uint8Array {
  if (!c.generate) return new Uint8Array(readFileSync(`${dir}/${c.name}.yaml`));
  const make = generated[c.generate];
  if (!make) throw new Error(`${c.name}: no generator ${c.generate}`);
  return make();
}
