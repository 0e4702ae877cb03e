// A fast path for the YAML that programs write: block mappings and sequences, one scalar per line,
// double-quoted scalars in JSON's escapes (JSON.stringify's output, as the OSC benchmarks and many
// generators write), literal block scalars (`|`, `|-`, `|+`, as Go's YAML writes multi-line text),
// plain scalars of a safe alphabet (names, paths, numbers, base64) and flow collections of them on one
// line (`[1, 2]`, `{a: b}`). The `yaml` package parses 1 MiB of that in 140–400 ms of CPU, most of it in
// its general scalar and token machinery, and a megabyte of tiny flow items in 1.8 s and 440 MiB; read
// line by line it takes a few ms. Anything outside the subset (folded scalars, flow collections over
// several lines, anchors, aliases, tags, single quotes, comments after a value, tabs, CR, duplicate
// keys, a key that is not a plain name, escapes JSON and YAML might read differently) makes it decline, and the document
// goes through parseYaml's bounded parse as before: the subset gives exactly that parse's value or
// nothing (test/unit/yaml-subset.test.ts holds it to this on the fixtures, Gardener's rendered OSC, the
// fuzz corpus and generated documents).
import { Document, parse } from "yaml";

/** A line of structure: its indentation, its text after it, and its index among the physical lines. */
type Line = { indent: number; text: string; at: number };

class Decline extends Error {}

/** A plain key: YAML reads it as this very string (unless it is one of YAML 1.1's short words, checked apart). */
const keyPattern = /^([A-Za-z_][A-Za-z0-9_./-]*):(?: +(.*))?$/;
/** A plain scalar that is a string whatever the schema, once longer than YAML 1.1's longest word ("false"). */
const plainString = /^[A-Za-z/][A-Za-z0-9_./-]*$/;
/** Other plain scalars the subset takes: typed by the `yaml` package itself (numbers, octal modes, booleans). */
const plainOther = /^[A-Za-z0-9_./+~-][A-Za-z0-9_./+=~:-]*$/;
/**
 * A character no number, timestamp or special value of YAML 1.1 has (theirs: digits, a–f, x, o, b, e,
 * ".inf", ".nan", "T", "t", "Z", "z", ":"): a longer plain scalar holding one is a string (base64, an image
 * reference, say).
 */
const stringEvidence = /[ghj-mpqrsuvwyGHJ-MPQRSUVWY/=]/;
/** YAML 1.1's words that are not strings (y, no, null, false …) are at most this long. */
const longestWord = 5;

/**
 * The tests by which the `yaml` package types a plain scalar in YAML 1.1 (its schema's default tags: null,
 * bool, int, float, timestamp …); a plain scalar none of them matches is a string.
 */
const typedPlain = (new Document(null, { version: "1.1" }).schema.tags as { default?: unknown; test?: RegExp }[]).flatMap((t) => (t.default === true && t.test ? [t.test] : []));

/**
 * What the `yaml` package makes of a plain scalar as a mapping's value (its type depends only on its
 * text; alone, "..." would end the document), remembered.
 */
const resolved = new Map<string, unknown>();
function resolvePlain(text: string): unknown {
  if (resolved.has(text)) return resolved.get(text);
  let doc: unknown;
  try {
    doc = parse(`v: ${text}\n`, { version: "1.1" });
  } catch {
    throw new Decline();
  }
  if (doc === null || typeof doc !== "object" || Object.keys(doc).join() !== "v") throw new Decline();
  const value = (doc as { v: unknown }).v;
  // A timestamp becomes a Date, a scalar with odd syntax may become anything: not the subset's to decide.
  if (value !== null && typeof value === "object") throw new Decline();
  if (resolved.size < 10_000 && text.length <= 64) resolved.set(text, value);
  return value;
}

// YAML's white space: not JavaScript's (NBSP, U+3000 …). A loop from the end: the regex / +$/ tries every
// run of spaces in the line before the last one (5 % of a no-op re-check's CPU in bench:profile).
const trimSpaces = (s: string) => {
  let end = s.length;
  while (end > 0 && s.charCodeAt(end - 1) === 32) end--;
  return end === s.length ? s : s.slice(0, end);
};

function scalar(raw: string): unknown {
  const text = trimSpaces(raw);
  if (text.startsWith('"')) {
    // JSON's escapes read the same in YAML, except \/ (YAML 1.2 only) and \u, whose surrogates the two may
    // treat differently: those decline. JSON.parse takes one string token only, so `"a" "b"` declines too.
    if (text.length < 2 || !text.endsWith('"') || text.includes("\\/") || text.includes("\\u")) throw new Decline();
    try {
      return JSON.parse(text) as string;
    } catch {
      throw new Decline();
    }
  }
  // A ":" ending the scalar would start a mapping on its line.
  const other = plainOther.test(text) && !text.startsWith("-") && !text.endsWith(":");
  if (text.length > longestWord && (plainString.test(text) || (other && stringEvidence.test(text)))) return text;
  if (other) return resolvePlain(text);
  throw new Decline();
}

/** A plain scalar in a flow collection: the plain alphabet without ":" (which could start a mapping there). */
const flowPlain = /[A-Za-z0-9_./+=~-]/;
const plainKey = /^[A-Za-z_][A-Za-z0-9_./-]*$/;

/** A plain key the full parse reads as this very string: not __proto__, nor a word YAML reads as another type (yes, null …). */
const isStringKey = (key: string) => plainKey.test(key) && key !== "__proto__" && !typedPlain.some((test) => test.test(key));

/**
 * A flow collection on one line (`[1, "a", {k: v}]`) whose own depth is `depth`: scalars as scalar()
 * takes them, keys as a block mapping's, a comma (and spaces) between entries and perhaps after the
 * last, ": " after a key. Anything else — a comment, an anchor, a key with no value, a second line — declines.
 */
function flowCollection(text: string, depth: number, maxDepth: number): unknown {
  let at = 0;
  const spaces = () => {
    while (text.charCodeAt(at) === 32) at++;
  };
  // A double-quoted scalar up to its closing quote, or a run of the plain alphabet.
  const token = (): string => {
    const start = at;
    if (text[at] === '"') {
      for (at++; at < text.length && text[at] !== '"'; at += text[at] === "\\" ? 2 : 1);
      if (at >= text.length) throw new Decline();
      at++;
    } else while (at < text.length && flowPlain.test(text[at] as string)) at++;
    if (at === start) throw new Decline();
    return text.slice(start, at);
  };
  const collection = (d: number): unknown[] | Record<string, unknown> => {
    // The full parse counts the scalars inside as one level deeper, as block() does.
    if (d >= maxDepth) throw new Decline();
    const close = text[at] === "[" ? "]" : "}";
    const seq: unknown[] = [];
    const map: Record<string, unknown> = {};
    const item = () => (text[at] === "[" || text[at] === "{" ? collection(d + 1) : scalar(token()));
    at++;
    spaces();
    for (;;) {
      // At the start, or after a comma (a trailing one YAML allows): the close, or an entry.
      if (text[at] === close) {
        at++;
        return close === "]" ? seq : map;
      }
      if (close === "]") seq.push(item());
      else {
        const key = token();
        if (!isStringKey(key) || Object.hasOwn(map, key) || text[at] !== ":" || text[at + 1] !== " ") throw new Decline();
        at += 2;
        spaces();
        map[key] = item();
      }
      spaces();
      if (text[at] === ",") {
        at++;
        spaces();
      } else if (text[at] !== close) throw new Decline();
    }
  };
  const value = collection(depth);
  if (at !== text.length) throw new Decline();
  return value;
}

const blockHeaders: Record<string, "clip" | "strip" | "keep"> = { "|": "clip", "|-": "strip", "|+": "keep" };

const leadingSpaces = (line: string) => {
  let n = 0;
  while (line.charCodeAt(n) === 32) n++;
  return n;
};

/**
 * A literal block scalar whose header is on physical line `at`, in a node indented `parent`: its value
 * and the physical line after it. Its indentation is that of its first non-empty line; lines of spaces
 * only longer than that, a less indented line still inside, or no content at all decline.
 */
function literalBlock(all: readonly string[], at: number, parent: number, chomp: "clip" | "strip" | "keep", endsWithBreak: boolean): { value: string; next: number } {
  let indent = -1;
  const body: string[] = [];
  let k = at + 1;
  for (; k < all.length; k++) {
    const raw = all[k] as string;
    const n = leadingSpaces(raw);
    if (n === raw.length) {
      if (indent >= 0 && n > indent) throw new Decline();
      body.push("");
      continue;
    }
    if (indent < 0) {
      if (n <= parent) break;
      if (body.some((_, b) => (all[at + 1 + b] as string).length > n)) throw new Decline();
      indent = n;
    }
    if (n < indent) {
      if (n > parent) throw new Decline();
      break;
    }
    body.push(raw.slice(indent));
  }
  if (indent < 0 || (k === all.length && !endsWithBreak)) throw new Decline();
  let last = body.length - 1;
  while (body[last] === "") last--;
  const content = body.slice(0, last + 1).join("\n");
  const value = chomp === "strip" ? content : chomp === "clip" ? `${content}\n` : `${content}\n${"\n".repeat(body.length - 1 - last)}`;
  return { value, next: k };
}

/** The lines that carry structure (a block scalar's lines among them, skipped by position): blank and comment lines dropped. */
function contentLines(physical: readonly string[]): Line[] {
  const lines: Line[] = [];
  let gap = 0;
  physical.forEach((line, at) => {
    const indent = leadingSpaces(line);
    const rest = line.slice(indent);
    if (rest === "" || rest.startsWith("#")) {
      // The yaml package measures an implicit key from before such a run and refuses it past 1024
      // characters (after an empty "-", say): a long run is left to it.
      gap += line.length + 1;
      if (gap > 1000) throw new Decline();
      return;
    }
    gap = 0;
    // Directives and document markers: not the subset's.
    if (indent === 0 && (rest.startsWith("%") || rest.startsWith("---") || rest.startsWith("..."))) throw new Decline();
    lines.push({ indent, text: rest, at });
  });
  return lines;
}

const isItem = (text: string) => text === "-" || text.startsWith("- ");

/**
 * The value of `text` in the subset, or undefined when it is not in the subset (or is empty). A document
 * the full parse could refuse for its depth is declined, so that parse decides.
 */
export function parseYamlSubset(text: string, limits: { maxDepth: number }): { value: unknown } | undefined {
  const { maxDepth } = limits;
  // Control characters (tabs and CR among them; parseYaml refuses most before), and the characters YAML
  // 1.1 reads as line breaks inside a quoted scalar (NEL, LS, PS).
  if (/[\x00-\x09\x0b-\x1f\x7f-\x9f\u2028\u2029]/.test(text)) return undefined;
  try {
    const physical = text.split("\n");
    const endsWithBreak = physical.at(-1) === "";
    if (endsWithBreak) physical.pop();
    const lines = contentLines(physical);
    let i = 0;

    // A scalar (or flow collection) on the line of structure i-1, which sits in a node indented `parent`; `depth`: its own.
    const scalarAt = (raw: string, parent: number, depth: number): unknown => {
      const text = trimSpaces(raw);
      if (text.startsWith("[") || text.startsWith("{")) return flowCollection(text, depth, maxDepth);
      const chomp = blockHeaders[text];
      if (!chomp) return scalar(raw);
      const block = literalBlock(physical, (lines[i - 1] as Line).at, parent, chomp, endsWithBreak);
      while (i < lines.length && (lines[i] as Line).at < block.next) i++;
      return block.value;
    };

    const block = (indent: number, depth: number): unknown => {
      // The full parse counts the scalars inside as one level deeper.
      if (depth >= maxDepth) throw new Decline();
      return isItem((lines[i] as Line).text) ? sequence(indent, depth) : mapping(indent, depth);
    };

    // After "key:" or "-" with nothing on the line: a nested block, a sequence at the key's own
    // indentation (the style Go's and many emitters write), or null.
    const nested = (indent: number, depth: number, compact: boolean): unknown => {
      const next = lines[i];
      if (next && next.indent > indent) return block(next.indent, depth + 1);
      if (compact && next && next.indent === indent && isItem(next.text)) return sequence(indent, depth + 1);
      return null;
    };

    const mapping = (indent: number, depth: number): Record<string, unknown> => {
      const map: Record<string, unknown> = {};
      const keys = new Set<string>();
      for (let line = lines[i]; line && line.indent >= indent; line = lines[i]) {
        if (line.indent > indent) throw new Decline();
        if (isItem(line.text)) break; // the compact sequence of a key is read by nested(); anything else ends here
        const m = keyPattern.exec(line.text);
        if (!m) throw new Decline();
        const key = m[1] as string;
        if (!isStringKey(key) || keys.has(key)) throw new Decline();
        keys.add(key);
        i++;
        map[key] = m[2] === undefined || trimSpaces(m[2]) === "" ? nested(indent, depth, true) : scalarAt(m[2], indent, depth + 1);
      }
      return map;
    };

    const sequence = (indent: number, depth: number): unknown[] => {
      const seq: unknown[] = [];
      for (let line = lines[i]; line && line.indent >= indent && isItem(line.text); line = lines[i]) {
        if (line.indent > indent) throw new Decline();
        const after = line.text.slice(1);
        const rest = after.replace(/^ +/, "");
        if (rest === "") {
          i++;
          seq.push(nested(indent, depth, false));
        } else if (isItem(rest)) throw new Decline();
        else if (keyPattern.test(rest)) {
          // "- key: value": a mapping whose keys stand where this one does.
          const column = indent + 1 + (after.length - rest.length);
          lines[i] = { indent: column, text: rest, at: line.at };
          seq.push(mapping(column, depth + 1));
        } else {
          i++;
          seq.push(scalarAt(rest, indent, depth + 1));
        }
      }
      if (lines[i] && (lines[i] as Line).indent > indent) throw new Decline();
      return seq;
    };

    const first = lines[0];
    if (!first || first.indent !== 0) return undefined;
    const value = block(0, 1);
    return i === lines.length ? { value } : undefined;
  } catch (err) {
    if (err instanceof Decline) return undefined;
    throw err;
  }
}
