// YAML read from outside (the OSC Secret, `trellis plan --osc`, the agent's config) is read as
// gardener-node-agent's decoder reads it (sigs.k8s.io/yaml over go-yaml v2: YAML 1.1, anchors, aliases and
// merge keys, a key given twice taking its later value) and within bounds, so that a careless document
// cannot take the agent's memory or keep it busy for minutes.
//
// The bounds: the bytes of a Secret (1 MiB, which bound the tokens too: a cap of 300 000 tokens refused
// OSCs a Secret carries) and UTF-8 (Go's decoder refuses anything else); nesting 64 deep (Go's: 10 000;
// Gardener's OSC is 7 deep); what aliases expand to (Go bounds their share of the decoded nodes); the
// first syntax error ends the parse (a megabyte of errors took 860 MB). Then one pass over the document
// checks nesting, keys and aliases, and one more turns it into plain values with Go's semantics (the
// `yaml` package's own toJS keeps the first of two keys and lets no merge replace a key given before
// it). The `yaml` package spends quadratic time on large mappings (its duplicate-key check) and on
// aliases of deep structures (its alias-count check): both are off here; bench:yaml measures what is
// left (README).
import { type Alias, Composer, type Document, isAlias, isMap, isPair, isScalar, isSeq, Lexer, LineCounter, type Node, Parser, type Scalar, type YAMLError, type YAMLMap } from "yaml";
import { fieldPath } from "./issues.ts";
import { parseYamlSubset } from "./yaml-subset.ts";

export type YamlLimits = {
  /** UTF-8 bytes of the document. */
  maxBytes: number;
  /** Nesting of mappings and sequences. */
  maxDepth: number;
  /** Nodes that aliases add to the document, each alias counting what its anchor expands to. */
  maxAliasNodes: number;
  /** Characters of scalars that aliases add. */
  maxAliasChars: number;
};

/**
 * The OSC: a Secret holds at most 1 MiB of data (kube-apiserver's MaxSecretSize). Aliases may add 500 000
 * nodes (go-yaml v2 lets aliases make 99 % of up to 400 000 decoded nodes) and 64 MiB of text: a
 * billion laughs stops there, a real OSC that anchors a large file's content for a few files does not.
 */
export const oscYamlLimits: YamlLimits = {
  maxBytes: 1 << 20,
  maxDepth: 64,
  maxAliasNodes: 500_000,
  maxAliasChars: 64 << 20,
};

/**
 * A parsed document, and the keys whose value a later one replaced (a key given twice in a mapping, or
 * before a merge key that brings it too), as Go's decoder replaces them: one line each, naming the key's
 * path and the lines.
 */
export type YamlResult = { ok: true; value: unknown; replaced: string[] } | { ok: false; errors: string[] };

/** Bytes → text: within the size cap and valid UTF-8, or an error naming `source`. */
export function decodeYamlBytes(bytes: Uint8Array, source: string, limits: Pick<YamlLimits, "maxBytes"> = oscYamlLimits): { ok: true; value: string } | { ok: false; errors: string[] } {
  if (bytes.byteLength > limits.maxBytes) return { ok: false, errors: [`${source}: is ${bytes.byteLength} bytes, more than the limit of ${limits.maxBytes}`] };
  try {
    return { ok: true, value: new TextDecoder("utf-8", { fatal: true }).decode(bytes) };
  } catch {
    return { ok: false, errors: [`${source}: is not valid UTF-8 (byte ${firstInvalidUtf8(bytes)})`] };
  }
}

class LimitExceeded extends Error {}
class FirstError extends Error {}

/**
 * Parses one YAML document as Go's yaml reads Gardener's files (YAML 1.1: 0644 is octal, yes/no are
 * booleans), within `limits`. Errors name `source`, and the line and column where YAML says where.
 */
export function parseYaml(text: string, source: string, limits: YamlLimits = oscYamlLimits): YamlResult {
  const fail = (msg: string): YamlResult => ({ ok: false, errors: [`${source}: ${msg}`] });
  // Characters are at most bytes: a text within the byte cap passes, a larger one is refused before any work.
  if (text.length > limits.maxBytes) return fail(`is more than ${limits.maxBytes} bytes`);
  const control = unprintable.exec(text);
  if (control) return fail(`not valid YAML: the control character U+${(control[0].codePointAt(0) as number).toString(16).toUpperCase().padStart(4, "0")} is not allowed${lineAndColumn(text, control.index)}`);
  const simple = parseYamlSubset(text, limits);
  return simple ? { ok: true, value: simple.value, replaced: [] } : parseYamlFully(text, source, limits);
}

/** parseYaml without the subset's fast path (test/unit/yaml-subset.test.ts compares the two). */
export function parseYamlFully(text: string, source: string, limits: YamlLimits = oscYamlLimits): YamlResult {
  const fail = (msg: string): YamlResult => ({ ok: false, errors: [`${source}: ${msg}`] });
  const lines = new LineCounter();
  const at = (offset: number) => {
    const pos = lines.linePos(offset);
    return ` at line ${pos.line}, column ${pos.col}`;
  };
  const syntaxError = (error: YAMLError) => fail(`not valid YAML: ${error.message.split("\n")[0]}${at(error.pos[0])}`);
  const docs: Document.Parsed[] = [];
  const composer = new Composer({ version: "1.1", uniqueKeys: false });
  // The composer's error hook (a plain property, private in the package's types): the first error ends
  // the parse, where the composer would go on to collect every one (a megabyte of commas: a million).
  const hook = composer as unknown as { onError: (...args: unknown[]) => void; errors: YAMLError[] };
  const record = hook.onError;
  hook.onError = (...args) => {
    record(...args);
    if (hook.errors.length > 0) throw new FirstError();
  };
  try {
    for (const doc of composer.compose(depthBoundedTokens(text, lines, limits), true, text.length)) docs.push(doc);
  } catch (err) {
    if (err instanceof LimitExceeded) return fail(err.message);
    const error = hook.errors[0];
    if (err instanceof FirstError && error) return syntaxError(error);
    throw err;
  }
  if (docs.length > 1) return fail("holds more than one YAML document");
  const doc = docs[0];
  if (!doc || doc.contents === null) return fail("is empty");
  // Errors of the parser's own (an unexpected token) reach the document without the hook.
  const error = doc.errors[0];
  if (error) return syntaxError(error);
  const checked = checkStructure(doc.contents, limits);
  if (typeof checked === "string") return fail(checked);
  const built = toValues(doc.contents, checked, (offset) => lines.linePos(offset).line);
  return typeof built === "string" ? fail(built) : { ok: true, ...built };
}

// YAML 1.1's printable characters, as Go's reader (which Gardener's OSC goes through) checks them: any
// other control character (a raw NUL, ESC, DEL …) is refused, wherever it is, before it reaches a file.
const unprintable = /[^\t\n\r\x20-\x7e\x85\xa0-\ud7ff\ue000-\ufffd\u{10000}-\u{10ffff}]/u;

const lineAndColumn = (text: string, offset: number): string => {
  const before = text.slice(0, offset);
  return ` at line ${before.split("\n").length}, column ${offset - before.lastIndexOf("\n")}`;
};

// Flow brackets are lexemes of their own (inside a quoted or plain scalar they are part of the scalar's
// lexeme), so their nesting is known while lexing: a deep nest is refused before it is built.
function* depthBoundedTokens(text: string, lines: LineCounter, limits: YamlLimits) {
  const parser = new Parser(lines.addNewLine);
  lines.addNewLine(0);
  let flowDepth = 0;
  for (const lexeme of new Lexer().lex(text)) {
    if (lexeme === "[" || lexeme === "{") {
      if (++flowDepth > limits.maxDepth) throw new LimitExceeded(`is nested more than ${limits.maxDepth} levels deep`);
    } else if (lexeme === "]" || lexeme === "}") flowDepth--;
    yield* parser.next(lexeme);
  }
  yield* parser.end();
}

// A key becomes a property name: a mapping, a sequence, or a scalar that reads as an object (!!binary
// bytes) would be turned into some string of the yaml package's choosing.
const keyProblem = "has a mapping key that is not a scalar (or is a !!binary one)";
const isPlainScalar = (node: unknown): boolean => isScalar(node) && (node.value === null || typeof node.value !== "object" || node.value instanceof Date);
// A YAML 1.1 timestamp stays the text it was written as: Go's yaml.v2, decoding into interface{} as
// Gardener's decoder does (YAML → JSON first), keeps it a string "for backward compatibility", so
// `lastInitiationTime: 2026-11-27T10:00:00Z` unquoted is the string a metav1.Time then parses.
const scalarValue = (node: Scalar): unknown => (node.value instanceof Date ? (node.source ?? String(node.value)) : node.value);
// The yaml package reads a plain `<<` key of YAML 1.1 as this symbol (a quoted "<<" is a string, as in Go).
const isMergeKey = (node: unknown): boolean => isScalar(node) && typeof node.value === "symbol";

type Frame = { node: Node; depth: number; children: Node[]; next: number; nodes: number; chars: number };
/** Each alias and the node it names (the last one before it carrying its anchor, as Go resolves it). */
type AliasTargets = Map<Alias, Node>;

/** Depth, keys that are not scalars, recursive aliases and what aliases add, in one pass: a problem, or the aliases' targets. */
function checkStructure(root: Node, limits: YamlLimits): AliasTargets | string {
  const anchors = new Map<string, Node>();
  const targets: AliasTargets = new Map();
  // What each anchored node expands to, once closed.
  const sizes = new Map<Node, { nodes: number; chars: number }>();
  const open = new Set<Node>();
  // Aliases used as mapping keys: one that names anything but a plain scalar is refused like such a key.
  const aliasKeys = new Set<Node>();
  const added = { nodes: 0, chars: 0 };
  const stack: Frame[] = [];
  const count = (nodes: number, chars: number) => {
    const frame = stack.at(-1);
    if (frame) {
      frame.nodes += nodes;
      frame.chars += chars;
    }
  };
  const enter = (node: Node, depth: number): string | undefined => {
    if (depth > limits.maxDepth) return `is nested more than ${limits.maxDepth} levels deep`;
    if (node.anchor) anchors.set(node.anchor, node);
    if (isAlias(node)) {
      const target = anchors.get(node.source);
      if (!target) return `alias *${node.source} has no anchor before it`;
      if (open.has(target)) return `alias *${node.source} refers to a node that contains it`;
      if (aliasKeys.has(node) && !isPlainScalar(target)) return keyProblem;
      targets.set(node, target);
      const size = sizes.get(target) as { nodes: number; chars: number };
      added.nodes += size.nodes;
      added.chars += size.chars;
      if (added.nodes > limits.maxAliasNodes) return `expands to more than ${limits.maxAliasNodes} nodes more through aliases`;
      if (added.chars > limits.maxAliasChars) return `expands to more than ${limits.maxAliasChars} characters more through aliases`;
      count(size.nodes, size.chars);
      return undefined;
    }
    if (isScalar(node)) {
      const chars = typeof node.source === "string" ? node.source.length : String(node.value).length;
      if (node.anchor) sizes.set(node, { nodes: 1, chars });
      count(1, chars);
      return undefined;
    }
    if (isMap(node)) {
      const children: Node[] = [];
      for (const pair of node.items) {
        if (!isPair(pair)) continue;
        const key = pair.key as Node | null;
        if (key !== null && !isPlainScalar(key) && !isAlias(key)) return keyProblem;
        if (isAlias(key)) aliasKeys.add(key);
        if (key !== null) children.push(key);
        if (pair.value !== null) children.push(pair.value as Node);
      }
      return push(node, depth, children);
    }
    if (isSeq(node)) return push(node, depth, node.items.filter((i): i is Node => i !== null) as Node[]);
    return undefined;
  };
  const push = (node: Node, depth: number, children: Node[]): undefined => {
    open.add(node);
    stack.push({ node, depth, children, next: 0, nodes: 1, chars: 0 });
    return undefined;
  };
  let problem = enter(root, 1);
  while (!problem && stack.length > 0) {
    const frame = stack[stack.length - 1] as Frame;
    const child = frame.children[frame.next++];
    if (child !== undefined) {
      problem = enter(child, frame.depth + 1);
      continue;
    }
    stack.pop();
    open.delete(frame.node);
    if (frame.node.anchor) sizes.set(frame.node, { nodes: frame.nodes, chars: frame.chars });
    count(frame.nodes, frame.chars);
  }
  return problem ?? targets;
}

class MergeProblem extends Error {}

/**
 * The document as plain values, as go-yaml v2 decodes it into Go maps and slices: a mapping's entries in
 * order, each setting its key (a later one replaces an earlier one); a merge key (`<<`) setting every key
 * of its mapping, or of its sequence of mappings (the earlier one winning), where it stands. An anchored
 * node is turned into values once: its aliases share them (checkStructure bounded what they add).
 */
function toValues(root: Node, targets: AliasTargets, lineOf: (offset: number) => number): { value: unknown; replaced: string[] } | string {
  const replaced: string[] = [];
  const shared = new Map<Node, unknown>();
  const value = (node: Node | null, path: string): unknown => {
    if (node === null) return null;
    const target = isAlias(node) ? (targets.get(node) as Node) : node;
    if (shared.has(target)) return shared.get(target);
    const out = isMap(target) ? mapping(target, path) : isSeq(target) ? target.items.map((item, i) => value(item as Node | null, fieldPath(path, i))) : isScalar(target) ? scalarValue(target) : null;
    if (target.anchor) shared.set(target, out);
    return out;
  };
  const mapping = (node: YAMLMap, path: string): Record<string, unknown> => {
    const out: Record<string, unknown> = {};
    // The keys set by an entry of this mapping itself (not by a merge), with the line of that entry.
    const given = new Map<string, number>();
    const replace = (key: string, line: number, by: string) => {
      const earlier = given.get(key);
      if (earlier !== undefined) replaced.push(`${fieldPath(path, key)}: the value at line ${earlier} is replaced by ${by} at line ${line}`);
    };
    for (const pair of node.items) {
      const keyNode = pair.key as Node | null;
      const line = lineOf(keyNode?.range?.[0] ?? node.range?.[0] ?? 0);
      if (isMergeKey(keyNode)) {
        for (const [key, v] of Object.entries(merged(pair.value as Node | null, path, line))) {
          replace(key, line, "the merge key (<<)");
          given.delete(key);
          setKey(out, key, v);
        }
        continue;
      }
      const keyValue = isAlias(keyNode) ? (targets.get(keyNode) as Node) : keyNode;
      const raw = isScalar(keyValue) ? scalarValue(keyValue) : null;
      // An alias of a merge key is the key "<<", as in Go.
      const key = typeof raw === "symbol" ? (raw.description ?? "") : String(raw ?? "");
      replace(key, line, "the key given again");
      given.set(key, line);
      setKey(out, key, value(pair.value as Node | null, fieldPath(path, key)));
    }
    return out;
  };
  // A merge key's value: a mapping, or a sequence of mappings whose earlier entries win (aliases of mappings alike).
  const merged = (node: Node | null, path: string, line: number): Record<string, unknown> => {
    const mappingOf = (n: Node | null): Record<string, unknown> => {
      const target = n !== null && isAlias(n) ? (targets.get(n) as Node) : n;
      if (!isMap(target)) throw new MergeProblem(`${path === "" ? "the document" : path}: the merge key (<<) at line ${line} needs a mapping or a sequence of mappings, as gardener-node-agent's decoder does`);
      return value(n, path) as Record<string, unknown>;
    };
    if (node === null || !isSeq(node)) return mappingOf(node);
    const out: Record<string, unknown> = {};
    for (const item of [...node.items].reverse()) for (const [key, v] of Object.entries(mappingOf(item as Node | null))) setKey(out, key, v);
    return out;
  };
  try {
    return { value: value(root, ""), replaced };
  } catch (err) {
    if (err instanceof MergeProblem) return err.message;
    throw err;
  }
}

/** Sets an own property, "__proto__" included (an assignment would set the object's prototype). */
function setKey(o: Record<string, unknown>, key: string, v: unknown): void {
  if (key === "__proto__") Object.defineProperty(o, key, { value: v, writable: true, enumerable: true, configurable: true });
  else o[key] = v;
}

function firstInvalidUtf8(bytes: Uint8Array): number {
  const decoder = new TextDecoder("utf-8", { fatal: true });
  for (let i = 0; i < bytes.length; ) {
    const b = bytes[i] as number;
    const len = b < 0x80 ? 1 : b >= 0xc2 && b < 0xe0 ? 2 : b >= 0xe0 && b < 0xf0 ? 3 : b >= 0xf0 && b < 0xf5 ? 4 : 0;
    if (len === 0) return i;
    try {
      decoder.decode(bytes.subarray(i, i + len));
    } catch {
      return i;
    }
    i += len;
  }
  return bytes.length;
}
