// The differential test's pure parts (test/parity): the comparison of two node snapshots, the matchers
// that classify a difference, and docs/gardener-fields.md's "Deliberate differences" section, which must
// be exactly what test/parity/deliberate.ts renders.
import { describe, expect, test } from "bun:test";
import { existsSync, readFileSync } from "node:fs";
import { deliberate, docMarkers, renderDeliberate } from "../parity/deliberate.ts";
import { type Difference, differences, type Outcome } from "../parity/diff.ts";
import { knownItems } from "../parity/known.ts";
import { matches } from "../parity/match.ts";
import type { Snapshot } from "../parity/snapshot.ts";
import { boundedIds, selectSteps, steps } from "../parity/steps.ts";

const empty = (): Snapshot => ({ files: {}, units: {}, labels: {}, annotations: {}, conditions: {}, events: [], leases: {} });
const applied: Outcome = { result: "applied", evidence: "" };

describe("the comparison", () => {
  test("equal snapshots differ in nothing", () => {
    const s = empty();
    s.files["/etc/parity/a"] = { type: "file", mode: "0644", sha256: "ab", text: "a" };
    expect(differences({ gna: s, trellis: s }, { gna: s, trellis: s }, { gna: applied, trellis: applied })).toEqual([]);
  });

  test("a file on one node only, another mode, a unit restarted on one node, an event reason, the outcome", () => {
    const [before, g, t] = [empty(), empty(), empty()];
    before.units["a.service"] = { load: "loaded", active: "active", sub: "running", enabled: "enabled", invocation: "1" };
    g.units["a.service"] = { ...before.units["a.service"], invocation: "2" };
    t.units["a.service"] = { ...before.units["a.service"] };
    g.files["/etc/x"] = { type: "file", mode: "0644", sha256: "abcdef0123456789", text: "x" };
    g.files["/etc/y"] = { type: "dir", mode: "0755" };
    t.files["/etc/y"] = { type: "dir", mode: "0700" };
    t.events = ["Warning/OSCInvalid"];
    const d = differences({ gna: before, trellis: before }, { gna: g, trellis: t }, { gna: applied, trellis: { result: "error", evidence: "bad" } });
    expect(d).toEqual([
      { area: "outcome", key: "result", gna: "applied", trellis: "error", detail: { gna: "", trellis: "bad" } },
      { area: "file", key: "/etc/x", gna: "file 0644 sha256:abcdef012345", trellis: undefined, detail: { gna: "x" } },
      { area: "file", key: "/etc/y", gna: "dir 0755", trellis: "dir 0700" },
      { area: "restarted", key: "a.service", gna: "restarted", trellis: "not restarted" },
      { area: "event", key: "Warning/OSCInvalid", gna: undefined, trellis: "present" },
    ]);
  });
});

describe("matchers", () => {
  const d: Difference = { area: "label", key: "worker.gardener.cloud/gardener-node-agent-secret-name", gna: undefined, trellis: "<osc-secret>" };
  test.each([
    [{ area: "label" as const }, true],
    [{ area: "file" as const }, false],
    [{ key: "worker\\.gardener\\.cloud/.*" }, true],
    [{ key: "worker" }, false], // anchored
    [{ gna: "absent" }, true],
    [{ trellis: "absent" }, false],
    [{ trellis: "<osc-secret>" }, true],
    [{ step: "first-apply|recover" }, true],
    [{ step: "first" }, false],
  ])("%j matches: %p", (m, expected) => {
    expect(matches(m, "first-apply", d)).toBe(expected);
  });

  test.each([
    ["b", true],
    ["c", true],
    ["a", false],
    ["elsewhere", false],
  ])("since b, at step %s: %p", (step, expected) => {
    expect(matches({ since: "b" }, step, d, ["a", "b", "c"])).toBe(expected);
  });

  test("every matcher's patterns compile and name a step that exists", () => {
    const ids = new Set(steps.map((s) => s.id));
    for (const m of [...deliberate.flatMap((r) => r.match), ...knownItems.flatMap((k) => k.match)]) {
      for (const p of [m.step, m.key, m.gna, m.trellis]) if (p !== undefined && p !== "absent") expect(() => new RegExp(p)).not.toThrow();
      if (m.step) for (const id of m.step.split("|")) expect(ids.has(id)).toBe(true);
      if (m.since) expect(ids.has(m.since)).toBe(true);
    }
  });
});

describe("the scenario", () => {
  test("at least 40 steps, unique ids; the bounded run's ids exist and keep the scenario's order", () => {
    expect(steps.length).toBeGreaterThanOrEqual(40);
    expect(new Set(steps.map((s) => s.id)).size).toBe(steps.length);
    expect(selectSteps(boundedIds).map((s) => s.id)).toEqual([...boundedIds]);
  });
});

describe("docs/gardener-fields.md", () => {
  test("its Deliberate differences section is what test/parity/deliberate.ts renders", () => {
    const doc = readFileSync(new URL("../../docs/gardener-fields.md", import.meta.url), "utf8");
    const begin = doc.indexOf(docMarkers.begin);
    const end = doc.indexOf(docMarkers.end);
    expect(begin).toBeGreaterThan(-1);
    expect(end).toBeGreaterThan(begin);
    expect(doc.slice(begin + docMarkers.begin.length, end).trim()).toBe(renderDeliberate());
    expect(new Set(deliberate.map((r) => r.id)).size).toBe(deliberate.length);
  });

  test("every row is asserted: by differences of the differential run it matches, or by a test it names that exists", () => {
    expect(deliberate.filter((r) => r.match.length === 0 && !r.assertedBy).map((r) => r.id)).toEqual([]);
    const files = deliberate.flatMap((r) => [...(r.assertedBy ?? "").matchAll(/test\/[\w./-]+\.test\.ts/g)].map((m) => m[0]));
    for (const f of files) expect(existsSync(new URL(`../../${f}`, import.meta.url))).toBe(true);
  });
});
