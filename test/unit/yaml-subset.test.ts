// src/api/yaml-subset.ts gives exactly the bounded parse's value (src/api/yaml.ts, parseYamlFully) or
// declines: on the repository's YAML fixtures, on the OSC fuzzer's documents, on documents generated to
// sit on the subset's edges (YAML 1.1's words and numbers, escapes, compact sequences, comments, depth)
// and on byte-level mutations of all of them. A value that differs in type, content or key order fails.
import { describe, expect, test } from "bun:test";
import { readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { oscYamlLimits, parseYamlFully } from "../../src/api/yaml.ts";
import { parseYamlSubset } from "../../src/api/yaml-subset.ts";
import { oscYaml } from "../bench/lib/bench-osc.ts";
import { generateCase } from "../fuzz/generate.ts";
import { mutateBytes, type Rng } from "../fuzz/mutate.ts";
import { prng } from "../harness/prng.ts";

/** Same value, same types, same key order (NaN equal to NaN, -0 apart from 0). */
function same(a: unknown, b: unknown): boolean {
  if (typeof a === "number" && typeof b === "number") return Object.is(a, b);
  if (Array.isArray(a)) return Array.isArray(b) && a.length === b.length && a.every((x, i) => same(x, b[i]));
  if (a !== null && typeof a === "object") {
    if (b === null || typeof b !== "object" || Array.isArray(b) || Object.getPrototypeOf(a) !== Object.getPrototypeOf(b)) return false;
    const ka = Object.keys(a);
    const kb = Object.keys(b);
    return ka.length === kb.length && ka.every((k, i) => k === kb[i] && same((a as Record<string, unknown>)[k], (b as Record<string, unknown>)[k]));
  }
  return a === b;
}

let taken = 0;
/** Fails unless the subset declines `text` or agrees with the full parse; counts the documents it took. */
function check(text: string, what: string): void {
  const sub = parseYamlSubset(text, oscYamlLimits);
  if (!sub) return;
  taken++;
  const full = parseYamlFully(text, what);
  if (!full.ok || !same(sub.value, full.value)) {
    throw new Error(`${what}: the subset read ${JSON.stringify(sub.value)?.slice(0, 400)}, the full parse ${JSON.stringify(full)?.slice(0, 400)}\n--- document:\n${text.slice(0, 2000)}`);
  }
}

const repo = join(import.meta.dir, "../..");
function yamlFiles(dir: string): string[] {
  return readdirSync(join(repo, dir), { recursive: true, withFileTypes: true })
    .filter((e) => e.isFile() && /\.ya?ml$/.test(e.name))
    .map((e) => join(e.parentPath, e.name));
}

describe("the subset agrees with the full parse or declines", () => {
  test("the OSC Gardener renders (test/peer/osc-render: base64 data, literal blocks, image references), taken", () => {
    const before = taken;
    check(readFileSync(join(repo, "test/fixtures/gardener/osc-rendered.yaml"), "utf8"), "Gardener's OSC");
    expect(taken - before).toBe(1);
  });

  test("the benchmark OSCs, all taken", () => {
    const before = taken;
    for (const change of [0, 1, 7]) for (const shape of [undefined, { units: 8, filesPerUnit: 4 }]) check(oscYaml(change, shape), `bench ${change}`);
    expect(taken - before).toBe(6);
  });

  test("every YAML file in test/fixtures and docs, and byte mutations of each", () => {
    const r = prng(1125);
    for (const file of [...yamlFiles("test/fixtures"), ...yamlFiles("docs")]) {
      const text = readFileSync(file, "utf8");
      check(text, file);
      for (let i = 0; i < 20; i++) check(new TextDecoder().decode(mutateBytes(r, new TextEncoder().encode(text), 1 + r.int(3))), `${file} mutated`);
    }
  });

  test("2000 documents of the OSC fuzzer and their byte mutations", () => {
    const r = prng(77);
    for (let i = 0; i < 2000; i++) {
      const c = generateCase(20261125, i);
      if (typeof c.osc !== "string") continue;
      check(c.osc, `fuzz case ${i}`);
      check(new TextDecoder().decode(mutateBytes(r, new TextEncoder().encode(c.osc), 1 + r.int(3))), `fuzz case ${i} mutated`);
    }
  });

  test("20 000 documents generated on the subset's edges, half of them mutated", () => {
    const before = taken;
    const r = prng(4242);
    for (let i = 0; i < 20_000; i++) {
      const text = edgeDocument(r);
      check(text, `edge document ${i}`);
      if (i % 2) check(new TextDecoder().decode(mutateBytes(r, new TextEncoder().encode(text), 1 + r.int(2))), `edge document ${i} mutated`);
    }
    // The generator must exercise the fast path, not only its refusals.
    expect(taken - before).toBeGreaterThan(5_000);
  });
});

test("what it declines", () => {
  const declined = [
    "",
    "# only a comment\n",
    "  indented: first\n",
    "a: 1\na: 2\n",
    "a: >\n  folded\n",
    "a: |2\n   indicated\n",
    "a: |\n",
    "a: |\n  no final break",
    "a: |\n    x\n  y\n",
    "a: |\n      \n  x\n",
    "a: foo:\n",
    "a: [,]\n",
    "a: [1, 2] # two\n",
    "a: [1,\n  2]\n",
    "a: {b:1}\n",
    "a: {b: 1, b: 2}\n",
    "a: {yes: 1}\n",
    "a: [b: 1]\n",
    "a: [&x 1, *x]\n",
    "a: ['single']\n",
    "a: [a:b]\n",
    "- [1, 2] x\n",
    "a: &x 1\nb: *x\n",
    "a: !!str 1\n",
    "a: 'single'\n",
    'a: "x\\/y"\n',
    'a: "\\u0041"\n',
    "a: b # comment\n",
    "a:\tb\n",
    "a: b\r\n",
    "---\na: b\n",
    "a: 2001-12-14\n",
    "? a\n: b\n",
    "<<: {}\n",
    "yes: 1\n",
    "__proto__: 1\n",
    "a: b: c\n",
    "- - a\n",
    `a: "line\u2028sep"\n`,
  ];
  for (const text of declined) expect({ text, parsed: parseYamlSubset(text, oscYamlLimits) }).toEqual({ text, parsed: undefined });
  let deep = "";
  for (let d = 0; d < 70; d++) deep += `${" ".repeat(d * 2)}k:\n`;
  expect(parseYamlSubset(deep, oscYamlLimits)).toBeUndefined();
});

test("flow collections on one line are taken, as the full parse reads them", () => {
  const text = 'a: [1, "x y", {b: [c, 0644, yes, ~]}, [], {},]\nb:\n- {k0: 0, k1: "1" , }\n- []\n';
  expect(parseYamlSubset(text, oscYamlLimits)?.value).toEqual({ a: [1, "x y", { b: ["c", 0o644, true, null] }, [], {}], b: [{ k0: 0, k1: "1" }, []] });
  const flood = `flood: [${Array(200_000).fill("1").join(",")}]\n`;
  expect((parseYamlSubset(flood, oscYamlLimits)?.value as { flood: number[] }).flood).toHaveLength(200_000);
});

test("a megabyte of small keys, as many lines as the Secret's bytes allow, is taken", () => {
  const keys = Math.floor(oscYamlLimits.maxBytes / 16);
  const text = `spec:\n${Array.from({ length: keys }, (_, i) => `  field-${i.toString(36)}: 1`).join("\n")}\n`;
  expect(text.length).toBeGreaterThan(oscYamlLimits.maxBytes * 0.75);
  expect(Object.keys((parseYamlSubset(text, oscYamlLimits)?.value as { spec: object }).spec)).toHaveLength(keys);
});

test("YAML 1.1 as the full parse reads it: octal modes, yes/no, ~, hex; a key YAML reads as true declines", () => {
  const text = "mode: 0644\non: yes\nnone: ~\nexp: 1e3\nhex: 0x1F\nname: kubelet.service\n";
  expect(parseYamlSubset(text, oscYamlLimits)).toBeUndefined();
  const value = parseYamlSubset(text.replace("on: yes", "flag: yes"), oscYamlLimits)?.value;
  expect(value).toEqual({ mode: 0o644, flag: true, none: null, exp: 1000, hex: 31, name: "kubelet.service" });
});

const words = ["y", "Y", "yes", "No", "NO", "on", "Off", "true", "False", "null", "Null", "~", "n", "ok", "start", "enable"];
const numbers = ["0", "0644", "0755", "420", "-1", "+1", "1_000", "0x1f", "0o17", "0b101", "1:30", "1.5", ".5", "1e3", "1.0e+3", ".inf", "-.Inf", ".nan", "08", "0.", "2001-12-14", "12:30:45"];
const plains = [
  "kubelet.service", "/etc/systemd/system/a.service", "extensions.gardener.cloud/v1alpha1", "a-b_c.d", "...", "a=b", "x+y", "~x", "--", "a..b", "Infinity", "NaN",
  "localhost:5000/pause:3.10", "a:b", "12:30:45", "1:2", "x:", "2001-12-14T21:59:43.10Z", "2001-12-14t21:59:43Z", "IyEvYmluL2Jhc2gK", "LS0tLS1CRUdJTiBD+/=", "0+1=2", "123456789012", "1e10x", "0x1fz", ".infinity", "-.inf", "+.5", "1_0:30",
];
const keys = ["name", "path", "content", "data", "encoding", "units", "files", "a", "y", "on", "No", "null", "ab", "checksum/x", "x.y", "_k", "kind", "spec", "12", "__proto__"];
const chars = ["a", " ", "\\n", "\\t", '\\"', "\\\\", "\\/", "\\u00e9", "é", "#", ": ", "- ", "'", "$", "\\x41", "\\0", "\\e", "\\N", "\\ ", "\u2028", "\u0085", "ü", "😀", "{", "["];

const blockLines = ["text", "  indented", "", "   ", "# not a comment", "- not an item", "key: not a key", '"quoted"', "tail  "];

/** A literal block scalar's header and lines (indented `indent` + 2, now and then less or more). */
function blockText(r: Rng, indent: number): string {
  const pad = " ".repeat(indent + 2 + (r.chance(0.2) ? 2 : 0));
  const lines: string[] = [];
  for (let n = r.int(5); n >= 0; n--) {
    const l = r.pick(blockLines);
    lines.push(l.trim() === "" ? (r.chance(0.5) ? "" : l) : `${r.chance(0.05) ? " ".repeat(indent + 1) : pad}${l}`);
  }
  return `${r.pick(["|", "|-", "|+", "|", ">"])}\n${lines.join("\n")}`;
}

/** A flow collection on one line, now and then with something the subset must decline (or read right). */
function flowText(r: Rng, depth = 0): string {
  const item = (): string => (depth < 3 && r.chance(0.25) ? flowText(r, depth + 1) : r.pick([r.pick(words), r.pick(numbers), r.pick(plains), `"${r.pick(chars)}${r.pick(chars)}"`]));
  const sep = () => r.pick([", ", ",", " , ", ",  ", ", "]);
  const n = r.int(4);
  if (r.chance(0.5)) return `[${Array.from({ length: n }, item).join(sep())}${r.chance(0.05) ? "," : ""}]`;
  const entry = () => `${r.pick(keys)}${r.pick([": ", ": ", ": ", ":", " : "])}${item()}`;
  return `{${Array.from({ length: n }, entry).join(sep())}}`;
}

function scalarText(r: Rng, indent = 0): string {
  const kind = r.int(7);
  if (kind === 6) return flowText(r);
  if (kind === 5) return blockText(r, indent);
  if (kind === 0) return r.pick(words);
  if (kind === 1) return r.pick(numbers);
  if (kind === 2) return r.pick(plains);
  if (kind === 3) return r.pick(["[]", "{}", "", "  "]);
  let s = "";
  for (let i = r.int(12); i > 0; i--) s += r.pick(chars);
  return `"${s}"`;
}

/** A block document from the subset's grammar, with its edges: odd keys, odd scalars, both sequence styles. */
function edgeDocument(r: Rng): string {
  const lines: string[] = [];
  const node = (indent: number, depth: number, inItem: boolean): void => {
    const pad = " ".repeat(indent);
    const entries = 1 + r.int(4);
    const asSeq = r.chance(0.35);
    for (let e = 0; e < entries; e++) {
      if (r.chance(0.05)) lines.push(r.chance(0.5) ? "" : `${pad}# note`);
      const lead = inItem && e === 0 ? "" : pad;
      if (asSeq) {
        const nest = depth < 5 && r.chance(0.3);
        if (nest && r.chance(0.5)) {
          lines.push(`${lead}- ${r.pick(keys)}: ${scalarText(r, indent + 2)}`.trimEnd());
          node(indent + 2, depth + 1, false);
        } else if (nest) {
          lines.push(`${lead}-`);
          node(indent + 2, depth + 1, false);
        } else lines.push(`${lead}- ${scalarText(r, indent)}`.trimEnd());
      } else {
        const key = r.chance(0.9) ? r.pick(keys.slice(0, 8)) + (r.chance(0.5) ? String(e) : "") : r.pick(keys);
        if (depth < 5 && r.chance(0.35)) {
          lines.push(`${lead}${key}:`);
          const compact = r.chance(0.5);
          if (compact) {
            for (let k = 1 + r.int(3); k > 0; k--) lines.push(`${pad}- ${scalarText(r, indent)}`.trimEnd());
          } else node(indent + 2, depth + 1, false);
        } else lines.push(`${lead}${key}:${r.chance(0.1) ? "" : ` ${scalarText(r, indent)}`}`.trimEnd());
      }
    }
  };
  node(0, 1, false);
  return `${lines.join("\n")}${r.chance(0.8) ? "\n" : ""}`;
}
