// The fuzz harness (test/fuzz) in CI: a fixed seed's generated OSCs through the resolver and planner,
// its valid OSCs with fields, anchors and merge keys Gardener's decoder takes (valid.ts), and every saved
// finding (test/fixtures/fuzz), each of which once broke a property. `bun run fuzz`
// runs 100 000 cases of a fresh seed on demand.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { readdirSync } from "node:fs";
import { join } from "node:path";
import { type FuzzCase, fixturesDir } from "../fuzz/case.ts";
import { generateCase } from "../fuzz/generate.ts";
import { createEnv, disposeEnv, type Env, runCase } from "../fuzz/property.ts";
import { checkValid, generateValidCase } from "../fuzz/valid.ts";

const seed = 20261125;
const cases = 10_000;
/** Valid OSCs (test/fuzz/valid.ts), the first few of about a megabyte each. */
const validCases = 1_000;
const largeValidCases = 3;

describe("fuzz: resolver and planner", () => {
  let env: Env;
  beforeAll(() => {
    env = createEnv();
  });
  afterAll(() => disposeEnv(env));

  test(`${cases} generated cases (seed ${seed}) keep every property`, async () => {
    const findings: string[] = [];
    const outcomes = new Map<string, number>();
    for (let i = 0; i < cases; i++) {
      const r = await runCase(generateCase(seed, i), env);
      outcomes.set(r.outcome, (outcomes.get(r.outcome) ?? 0) + 1);
      for (const f of r.findings) findings.push(`bun run fuzz --seed ${seed} --case ${i}: ${f.property}: ${f.detail}`);
    }
    expect(findings).toEqual([]);
    // Most cases are refused, as they should be; enough must get through to exercise planning and apply.
    expect(outcomes.get("applied") ?? 0).toBeGreaterThan(cases / 20);
    expect(outcomes.get("invalid") ?? 0).toBeGreaterThan(cases / 2);
  });

  test(`${validCases} generated valid OSCs (seed ${seed}, ${largeValidCases} of about a megabyte) with unknown fields, anchors, aliases and merge keys: accepted, read as written, every unknown field reported`, async () => {
    const findings: string[] = [];
    let unknown = 0;
    for (let i = 0; i < validCases; i++) {
      const c = generateValidCase(seed, i, i < largeValidCases);
      unknown += c.unknown.length;
      for (const f of await checkValid(c, env.dir)) findings.push(`valid case ${i}: ${f.property}: ${f.detail}`);
    }
    expect(findings).toEqual([]);
    expect(unknown).toBeGreaterThan(validCases);
  });

  for (const name of readdirSync(fixturesDir).filter((f) => f.endsWith(".json")).sort()) {
    test(`saved finding ${name} keeps every property`, async () => {
      const c = (await Bun.file(join(fixturesDir, name)).json()) as FuzzCase;
      const r = await runCase(c, env);
      expect(r.findings).toEqual([]);
    });
  }
});
