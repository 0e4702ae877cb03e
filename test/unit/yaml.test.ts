// Bounded YAML parsing (src/api/yaml.ts): every class of document that made the plain parse spend
// seconds to minutes and gigabytes is refused by the limit it hits, with a message naming the source;
// ordinary documents, anchors and merge keys within the limits read as before.
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
const value = (text: string): unknown => {
  const r = parseYaml(text, SOURCE);
  if (!r.ok) throw new Error(r.errors.join("\n"));
  return r.value;
};

describe("documents that made the plain parse slow or huge are refused by a limit", () => {
  test.each([
    // yaml 2.9.1 measured on this machine, before the limits: 2.3 s and 430 MB
    ["a 1 MiB flow list", () => `spec: [${"1,".repeat(500_000)}]\n`, "has more than 300000 YAML tokens"],
    // 72 s: the duplicate-key check is quadratic
    ["70 000 flow keys", () => `spec:\n  x: {${Array.from({ length: 70_000 }, (_, i) => `k${i}: 1`).join(",")}}\n`, "YAML tokens"],
    ["60 000 block keys", () => `spec:\n${Array.from({ length: 60_000 }, (_, i) => `  k${i}: 1`).join("\n")}\n`, "YAML tokens"],
    // the issue's case: 8 KB, 2 s and 550 MB (15-25 KB took 10-36 s and up to 4.4 GB)
    ["deep nesting plus one alias", () => `spec:\n  x: &a ${"[".repeat(4000)}${"]".repeat(4000)}\n  y: *a\n`, "nested more than 64 levels deep"],
    ["deep block nesting", () => `${"- ".repeat(65)}x\n`, "nested more than 64 levels deep"],
    ["200 000 nested brackets", () => `${"[".repeat(200_000)}${"]".repeat(200_000)}`, "nested more than 64 levels deep"],
    [
      "a billion laughs",
      () => ["a: &a [x,x,x,x,x,x,x,x,x,x]", ..."bcdef".split("").map((c, i) => `${c}: &${c} [${Array(10).fill(`*${"abcdef"[i]}`).join(",")}]`)].join("\n"),
      "expands to more than 500000 nodes",
    ],
    ["a long scalar repeated by aliases", () => `a: &a ${"x".repeat(1 << 20)}\nb: [${Array(17).fill("*a").join(",")}]\n`, "expands to more than 16777216 characters"],
    ["more than 1000 aliases", () => `a: &a x\nb: [${Array(1001).fill("*a").join(",")}]\n`, "more than 1000 aliases"],
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
});

describe("what Go's yaml refuses or reads differently", () => {
  test("a duplicate key is an error naming the key, line and column (checked in linear time)", () => {
    expect(refusal("spec:\n  units: []\n  files: []\n  units: []\n")).toBe(`${SOURCE}: has the mapping key "units" twice at line 4, column 3`);
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
