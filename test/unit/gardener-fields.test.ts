// docs/gardener-fields.md against the list of Gardener's fields (test/fixtures/gardener/fields.txt,
// generated from Gardener v1.150's Go types) and against the schemas trellis parses with: every field has
// a row saying what trellis does with it, no row names a field Gardener does not have, and no schema
// knows a key that Gardener's types do not (a key there and not in the table would be acted on unsaid).
import { describe, expect, test } from "bun:test";
import { readFileSync } from "node:fs";
import type * as v from "valibot";
import { NodeAgentConfigurationSchema } from "../../src/api/agent-config.ts";
import { OperatingSystemConfigSchema } from "../../src/api/osc.ts";

const read = (path: string) => readFileSync(new URL(path, import.meta.url), "utf8");
const kinds = ["OperatingSystemConfig", "NodeAgentConfiguration"] as const;
const verdicts = ["acted on", "refused", "not applicable"];

const gardener = read("../fixtures/gardener/fields.txt")
  .split("\n")
  .filter((l) => l !== "" && !l.startsWith("#"));

const rows = read("../../docs/gardener-fields.md")
  .split("\n")
  .flatMap((l) => {
    const m = /^\| (\w+) \| `([^`]+)` \| ([^|]+?) \| ([^|]+?) \| (.*) \|$/.exec(l);
    return m ? [{ field: `${m[1]} ${m[2]}`, verdict: m[3] as string, gnaAccepts: m[4] as string, why: m[5] as string }] : [];
  });

/** Every key path a valibot schema knows, Gardener-style: `a.b`, a list's items as `a[]`. */
function keysOf(schema: v.GenericSchema, prefix = ""): string[] {
  const s = schema as v.GenericSchema & { type: string; pipe?: v.GenericSchema[]; wrapped?: v.GenericSchema; item?: v.GenericSchema; entries?: Record<string, v.GenericSchema> };
  // A piped schema is its first schema with checks after it (and, in shapes.ts, a guard before it).
  if (s.pipe) return s.pipe.filter((p) => p.kind === "schema").flatMap((p) => keysOf(p, prefix));
  if (s.wrapped) return keysOf(s.wrapped, prefix);
  if (s.item) return [`${prefix}[]`.replace(/^\./, ""), ...keysOf(s.item, `${prefix}[]`)];
  if (!s.entries) return [];
  return Object.entries(s.entries).flatMap(([key, entry]) => {
    const path = prefix === "" ? key : `${prefix}.${key}`;
    const below = keysOf(entry, path);
    // A list field is named by its items (`units[]`), as Gardener's list names it.
    return below.includes(`${path}[]`) ? below : [path, ...below];
  });
}

describe("docs/gardener-fields.md", () => {
  test("the fixture lists both of Gardener's types", () => {
    for (const k of kinds) expect(gardener.filter((f) => f.startsWith(`${k} `)).length).toBeGreaterThan(30);
  });

  test("every field of Gardener's types has exactly one row", () => {
    const documented = rows.map((r) => r.field);
    expect(gardener.filter((f) => !documented.includes(f))).toEqual([]);
    expect(documented.filter((f, i) => documented.indexOf(f) !== i)).toEqual([]);
  });

  test("every row says whether gardener-node-agent accepts the field: yes, or what it refuses", () => {
    expect(rows.filter((r) => !/^(yes|no|only)\b/.test(r.gnaAccepts)).map((r) => `${r.field}: ${r.gnaAccepts}`)).toEqual([]);
  });

  test("no row names a field Gardener's types do not have", () => {
    expect(rows.map((r) => r.field).filter((f) => !gardener.includes(f))).toEqual([]);
  });

  test("every row says acted on, refused or not applicable; a refusal or a field not applicable says why", () => {
    expect(rows.filter((r) => !verdicts.includes(r.verdict)).map((r) => `${r.field}: ${r.verdict}`)).toEqual([]);
    expect(rows.filter((r) => r.verdict !== "acted on" && r.why.trim() === "").map((r) => r.field)).toEqual([]);
  });

  test.each([
    ["OperatingSystemConfig", OperatingSystemConfigSchema as v.GenericSchema, []],
    // trellis's own health checks (gardener-node-agent hard-codes them) and drift handling (README).
    ["NodeAgentConfiguration", NodeAgentConfigurationSchema as v.GenericSchema, ["controllers.healthCheck", "controllers.drift"]],
  ] as const)("every key the %s schema knows is one of Gardener's fields", (kind, schema, own) => {
    const keys = keysOf(schema);
    expect(keys.length).toBeGreaterThan(20);
    const unknown = keys.filter((k) => !own.some((o) => k === o || k.startsWith(`${o}.`))).filter((k) => !gardener.includes(`${kind} ${k}`) && !gardener.includes(`${kind} ${k}[]`));
    expect(unknown).toEqual([]);
  });
});
