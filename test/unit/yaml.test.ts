// Bounded YAML parsing (src/api/yaml.ts): every document a Secret can carry is read as Go's decoder reads
// it (anchors, aliases, merge keys, a repeated key), and what made the plain parse spend minutes and
// gigabytes — aliases expanding past their bound, deep nesting — is refused by the limit it hits, with a
// message naming the source.
import { describe, expect, test } from "bun:test";
import { parseOscBytes } from "../../src/api/desired.ts";
import { decodeYamlBytes, oscYamlLimits, parseYaml } from "../../src/api/yaml.ts";

const SOURCE = "Secret kube-system/osc";
const refusal = (text: string): string => {
  const r = parseYaml(text, SOURCE);
  if (r.ok) throw new Error("expected the document to be refused");
  expect(r.errors).toHaveLength(1);
  expect(r.errors[0]).toStartWith(`${SOURCE}: `);
  return r.errors[0] as string;
};
const parsed = (text: string) => {
  const r = parseYaml(text, SOURCE);
  if (!r.ok) throw new Error(r.errors.join("\n"));
  return r;
};
const value = (text: string): unknown => parsed(text).value;

describe("every document within a Secret's size is read, whatever its number of tokens", () => {
  // Refused by a cap of 300 000 tokens before: a Secret carries them (issue 20). Measured: bun run bench:yaml.
  test.each([
    ["a flow list of 1 MiB", () => `spec: [${"1,".repeat(oscYamlLimits.maxBytes / 2 - 8)}]\n`, (v: { spec: unknown[] }) => v.spec.length === oscYamlLimits.maxBytes / 2 - 8],
    // Over several lines: the fast path leaves it to the yaml package.
    ["70 000 flow keys", () => `spec:\n  x: {${Array.from({ length: 70_000 }, (_, i) => `k${i}: 1`).join(",\n    ")}}\n`, (v: { spec: { x: object } }) => Object.keys(v.spec.x).length === 70_000],
    ["60 000 block keys", () => `spec:\n${Array.from({ length: 60_000 }, (_, i) => `  k${i}: 1`).join("\n")}\n`, (v: { spec: object }) => Object.keys(v.spec).length === 60_000],
  ] as const)("%s", (_, make, holds) => {
    const text = make();
    expect(text.length).toBeLessThanOrEqual(oscYamlLimits.maxBytes);
    expect(holds(value(text) as never)).toBe(true);
  });

  test("a megabyte of syntax errors is refused at the first one", () => {
    expect(refusal(`spec: [${",".repeat(oscYamlLimits.maxBytes - 16)}]\n`)).toMatch(/^Secret kube-system\/osc: not valid YAML: Unexpected , in flow sequence at line 1, column \d+$/);
  });
});

describe("documents that made the plain parse slow or huge are refused by a limit", () => {
  test.each([
    // the issue's case: 8 KB, 2 s and 550 MB (15-25 KB took 10-36 s and up to 4.4 GB)
    ["deep nesting plus one alias", () => `spec:\n  x: &a ${"[".repeat(4000)}${"]".repeat(4000)}\n  y: *a\n`, "nested more than 64 levels deep"],
    ["deep block nesting", () => `${"- ".repeat(65)}x\n`, "nested more than 64 levels deep"],
    ["200 000 nested brackets", () => `${"[".repeat(200_000)}${"]".repeat(200_000)}`, "nested more than 64 levels deep"],
    [
      "a billion laughs",
      () => ["a: &a [x,x,x,x,x,x,x,x,x,x]", ..."bcdef".split("").map((c, i) => `${c}: &${c} [${Array(10).fill(`*${"abcdef"[i]}`).join(",")}]`)].join("\n"),
      "expands to more than 500000 nodes more through aliases",
    ],
    ["a long scalar repeated by aliases", () => `a: &a ${"x".repeat(512 << 10)}\nb: [${Array(129).fill("*a").join(",")}]\n`, "expands to more than 67108864 characters more through aliases"],
    ["a recursive alias", () => "a: &a [1, *a]\n", "alias *a refers to a node that contains it"],
  ])("%s", (_, make, limit) => {
    expect(refusal(make())).toContain(limit);
  });

  test("more bytes than the cap is refused before parsing, as text and as bytes", () => {
    const big = `a: ${"x".repeat(oscYamlLimits.maxBytes)}\n`;
    expect(refusal(big)).toContain(`is more than ${oscYamlLimits.maxBytes} bytes`);
    const r = decodeYamlBytes(new TextEncoder().encode(big), SOURCE);
    expect(r.ok ? "" : r.errors.join()).toBe(`${SOURCE}: is ${big.length} bytes, more than the limit of ${oscYamlLimits.maxBytes}`);
  });

  test("brackets inside scalars are not nesting", () => {
    expect(value(`a: "${"[".repeat(100)}"\nb: '${"{".repeat(100)}'\nc: x${"[".repeat(100)}\n`)).toEqual({ a: "[".repeat(100), b: "{".repeat(100), c: `x${"[".repeat(100)}` });
  });

  test("64 levels and aliases within the limits are read, the aliases expanded", () => {
    expect(JSON.stringify(value(`${"[".repeat(63)}${"]".repeat(63)}`))).toBe(`${"[".repeat(63)}${"]".repeat(63)}`);
    expect(value("a: &a {x: 1, l: [1, 2]}\nb: *a\nc: [*a, *a]\n")).toEqual({ a: { x: 1, l: [1, 2] }, b: { x: 1, l: [1, 2] }, c: [{ x: 1, l: [1, 2] }, { x: 1, l: [1, 2] }] });
  });

  test("the alias bounds count what aliases add, not the document's own nodes: any number of aliases within them is read", () => {
    expect((value(`a: &a x\nb: [${Array(100_000).fill("*a").join(",")}]\n`) as { b: string[] }).b).toHaveLength(100_000);
    const node = `{${Array.from({ length: 9 }, (_, i) => `k${i}: ${i}`).join(", ")}}`;
    // 19 nodes each (the mapping, 9 keys, 9 values): 26 315 aliases add 499 985, one more passes the bound.
    expect((value(`a: &a ${node}\nb: [${Array(26_315).fill("*a").join(",")}]\n`) as { b: unknown[] }).b).toHaveLength(26_315);
    expect(refusal(`a: &a ${node}\nb: [${Array(26_316).fill("*a").join(",")}]\n`)).toContain("expands to more than 500000 nodes more through aliases");
  });
});

describe("what Go's yaml refuses or reads differently", () => {
  test("a key given twice takes its later value, as go-yaml v2 sets it again; the replaced one is named with both lines", () => {
    const r = parsed("spec:\n  units: [a]\n  files: []\n  units: [b]\n");
    expect(r.value).toEqual({ spec: { units: ["b"], files: [] } });
    expect(r.replaced).toEqual(["spec.units: the value at line 2 is replaced by the key given again at line 4"]);
  });

  test("40 000 keys, each twice: linear time (the yaml package's own duplicate check is quadratic: 70 000 keys took 72 s)", () => {
    const keys = Array.from({ length: 40_000 }, (_, i) => `k${i}: 1`).join(",");
    const started = performance.now();
    expect(parsed(`x: {${keys},${keys}}\n`).replaced).toHaveLength(40_000);
    expect(performance.now() - started).toBeLessThan(15_000);
  });

  // Checked against gardener-node-agent's decoder (sigs.k8s.io/yaml v1.6.0, go.yaml.in/yaml/v2 v2.4.4): a merge
  // key sets each key of its mapping where it stands, so it replaces a key before it and a key after it
  // replaces it; of a sequence of mappings the earlier one wins; two merge keys are both merged, in turn.
  test.each([
    ["a key after the merge key replaces the merged one", "b: &b {p: 1, q: 2}\nx:\n  <<: *b\n  q: 3\n", { p: 1, q: 3 }, []],
    ["the merge key replaces a key before it", "b: &b {p: 1, q: 2}\nx:\n  q: 3\n  <<: *b\n", { q: 2, p: 1 }, ["x.q: the value at line 3 is replaced by the merge key (<<) at line 4"]],
    ["of a sequence of mappings the earlier one wins", "b: &b {p: 1}\nc: &c {p: 2, r: 5}\nx:\n  <<: [*b, *c]\n", { p: 1, r: 5 }, []],
    ["two merge keys are merged in turn", "b: &b {p: 1}\nc: &c {p: 2, r: 5}\nx:\n  <<: *b\n  <<: *c\n", { p: 2, r: 5 }, []],
    ["a merge key of an inline mapping", "x: {<<: {p: 1}, q: 2}\n", { p: 1, q: 2 }, []],
    ["a quoted \"<<\" is an ordinary key", 'x: {"<<": {p: 1}}\n', { "<<": { p: 1 } }, []],
  ])("merge keys: %s", (_, text, x, replaced) => {
    const r = parsed(text);
    expect((r.value as { x: unknown }).x).toEqual(x);
    expect(r.replaced).toEqual(replaced);
  });

  test.each([
    ["a scalar", "x: {<<: 1}\n"],
    ["a sequence holding a scalar", "x: {<<: [{p: 1}, 2]}\n"],
    ["an alias of a sequence", "s: &s [{p: 1}]\nx: {<<: *s}\n"],
    ["nothing", "x:\n  <<:\n"],
  ])("a merge key whose value is %s is refused, as gardener-node-agent's decoder refuses it", (_, text) => {
    expect(refusal(text)).toContain("x: the merge key (<<) at line");
  });

  test("an anchor, aliases and merge keys anywhere, a key holding only anchors among them: read, each alias of an anchored node sharing its value", () => {
    const v = value("x-anchors:\n  file: &file {permissions: 0644}\n  unit: &unit {enable: true}\nfiles:\n- <<: *file\n  path: /a\n- {<<: *file, path: /b}\nunits: [*unit, *unit]\n") as Record<string, unknown[]>;
    expect(v.files).toEqual([
      { permissions: 0o644, path: "/a" },
      { permissions: 0o644, path: "/b" },
    ]);
    expect(v.units?.[0]).toBe(v.units?.[1]);
  });

  test("a key __proto__ is a key like any other", () => {
    const v = value("a: {__proto__: {polluted: 1}}\n") as { a: object };
    expect(Object.keys(v.a)).toEqual(["__proto__"]);
    expect(Object.getPrototypeOf(v.a)).toBe(Object.prototype);
  });

  test("a YAML 1.1 timestamp, as a value or a key, stays the text it was written as (Go's yaml.v2 into interface{})", () => {
    expect(value("a: 2026-11-27T10:00:00Z\nb: 2001-12-14 21:59:43.10 -5\n2002-01-01: c\nd: [2026-11-27]\n")).toEqual({ a: "2026-11-27T10:00:00Z", b: "2001-12-14 21:59:43.10 -5", "2002-01-01": "c", d: ["2026-11-27"] });
  });

  test("an in-place OSC whose lastInitiationTime is an unquoted timestamp is accepted (gardener-node-agent accepts it)", () => {
    const osc = `apiVersion: extensions.gardener.cloud/v1alpha1
kind: OperatingSystemConfig
metadata: {name: o, namespace: kube-system}
spec:
  type: debian
  purpose: reconcile
  inPlaceUpdates:
    operatingSystemVersion: "12"
    kubelet: 1.35.4
    credentialsRotation:
      serviceAccountKey: {lastInitiationTime: 2026-11-27T10:00:00Z}
`;
    const r = parseOscBytes(new TextEncoder().encode(osc), SOURCE);
    if (!r.ok) throw new Error(r.errors.join("\n"));
    expect(r.value.spec.inPlaceUpdates?.credentialsRotation?.serviceAccountKey?.lastInitiationTime).toBe("2026-11-27T10:00:00Z");
  });

  test("a key that is not a scalar is an error", () => {
    expect(refusal("? [a, b]\n: 1\n")).toContain("a mapping key that is not a scalar");
  });

  test("two documents in one osc.yaml are an error", () => {
    expect(refusal("a: 1\n---\nb: 2\n")).toContain("more than one YAML document");
  });

  test("a syntax error names the line and column", () => {
    expect(refusal('spec:\n  x: "open\n')).toMatch(/not valid YAML: .* at line \d+, column \d+$/);
  });

  test("a control character outside YAML's printable set is refused with its line and column, as Go's reader does", () => {
    expect(refusal("a: 1\nb: x\u001b[2J\n")).toBe(`${SOURCE}: not valid YAML: the control character U+001B is not allowed at line 2, column 5`);
    for (const c of ["\u0000", "\u007f", "\u0008", "\u0090"]) expect(refusal(`a: "${c}"\n`)).toContain("is not allowed");
    expect(value("\ufeffa: \"tab\there, NEL\u0085, 🌱\"\r\n")).toEqual({ a: "tab\there, NEL\u0085, 🌱" });
  });

  test("a document of comments only is empty", () => {
    expect(refusal("# nothing\n")).toBe(`${SOURCE}: is empty`);
  });

  test("YAML 1.1 as Go reads it: octal 0644, yes/no booleans, merge keys", () => {
    expect(value("mode: 0644\non: yes\noff: no\n")).toEqual({ mode: 0o644, true: true, false: false });
    expect(value("base: &b {a: 1, b: 2}\nx:\n  <<: *b\n  b: 3\n")).toEqual({ base: { a: 1, b: 2 }, x: { a: 1, b: 3 } });
  });
});

describe("bytes that are not UTF-8", () => {
  test.each([
    ["a lone 0xff", [0x61, 0x3a, 0x20, 0xff, 0x0a], 3],
    ["a truncated two-byte sequence", [0x61, 0x3a, 0x20, 0xc3], 3],
    ["an overlong encoding of '/'", [0x61, 0x3a, 0x20, 0xc0, 0xaf], 3],
    ["a UTF-16 surrogate encoded in UTF-8", [0x61, 0x3a, 0x20, 0xed, 0xa0, 0x80], 3],
  ])("%s is refused (Go's decoder refuses it too), naming the byte", (_, raw, at) => {
    const r = decodeYamlBytes(new Uint8Array(raw), SOURCE);
    expect(r.ok ? "" : r.errors.join()).toBe(`${SOURCE}: is not valid UTF-8 (byte ${at})`);
  });

  test("in an OSC path: refused, not written with U+FFFD in its name", () => {
    const head = new TextEncoder().encode("apiVersion: extensions.gardener.cloud/v1alpha1\nkind: OperatingSystemConfig\nspec:\n  files:\n  - path: /etc/");
    const tail = new TextEncoder().encode("\n    content: {inline: {data: x}}\n");
    const r = parseOscBytes(new Uint8Array([...head, 0xfe, ...tail]), SOURCE);
    expect(r.ok ? "" : r.errors.join()).toBe(`${SOURCE}: is not valid UTF-8 (byte ${head.length})`);
  });

  test("multi-byte characters are fine", () => {
    const r = decodeYamlBytes(new TextEncoder().encode("a: grüße 🌱\n"), SOURCE);
    expect(r.ok && r.value).toBe("a: grüße 🌱\n");
  });
});
