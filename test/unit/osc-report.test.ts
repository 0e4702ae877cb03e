// How the parts of an applied OSC that are not acted on are listed in its Warning event and the Node's
// condition (src/controllers/osc/report.ts): whole items within a bound, the rest counted.
import { expect, test } from "bun:test";
import { listed } from "../../src/controllers/osc/report.ts";

test("items within the bound are all listed", () => {
  expect(listed(["a", "b"], "; ", 100)).toBe("a; b");
});

test("past the bound, whole items are listed and the rest counted, pointing at trellis plan", () => {
  const items = Array.from({ length: 10_000 }, (_, i) => `Secret kube-system/osc: spec.files[${i}].owner: not a field of Gardener v1.150's OperatingSystemConfig`);
  const text = listed(items, "\n");
  const shown = text.split("\n");
  expect(shown.slice(0, -1)).toEqual(items.slice(0, shown.length - 1));
  expect(shown.at(-1)).toBe(`… and ${items.length - shown.length + 1} more (trellis plan --osc lists them all)`);
  // With the event's first line ("OSC … is applied, but 10000 part(s) of it …"), within an event's 1 kB.
  expect(text.length).toBeLessThanOrEqual(880);
});

test("one item longer than the bound is cut", () => {
  const more = "; … and 1 more (trellis plan --osc lists them all)";
  expect(listed(["x".repeat(2000), "y"], "; ", 100)).toBe(`${"x".repeat(100 - more.length - 1)}…${more}`);
  expect(listed(["x".repeat(2000)], "; ", 100)).toBe(`${"x".repeat(99)}…`);
});
