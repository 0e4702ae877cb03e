// YAML read from outside (the OSC Secret, `trellis plan --osc`, the agent's config) is parsed within
// bounds, so that a small hostile or careless document cannot keep the agent busy for minutes or take
// gigabytes: the `yaml` package's plain parse spends quadratic time on large mappings (its duplicate-key
// check), on aliases of deep structures (its alias-count check), and hundreds of bytes of memory per
// token. Measured with yaml 2.9.1: 20 000 keys 3.5 s, 70 000 flow keys 72 s, an 8 KB nest of 4000
// brackets with one alias 2 s and 550 MB, a 1 MiB flow list 2.3 s and 430 MB.
//
// So: bytes are capped and must be UTF-8 (Go's decoder, which Gardener uses, refuses anything else);
// lexical tokens are counted while parsing and parsing stops at the limit; then one pass over the
// document checks nesting depth, duplicate keys (in linear time), recursive aliases and what the
// aliases expand to; only then is it turned into plain values, with the package's own alias check off.
import { Composer, type Document, isAlias, isMap, isPair, isScalar, isSeq, Lexer, LineCounter, type Node, Parser } from "yaml";
import type { Result } from "./result.ts";
import { parseYamlSubset } from "./yaml-subset.ts";

export type YamlLimits = {
  /** UTF-8 bytes of the document. */
  maxBytes: number;
  /** Lexical tokens (a scalar, an indicator, a run of spaces, a line break: each one). */
  maxTokens: number;
  /** Nesting of mappings and sequences. */
  maxDepth: number;
  maxAliases: number;
  /** Nodes of the document with every alias expanded, as the schema check then walks it. */
  maxExpandedNodes: number;
  /** Characters of scalars with every alias expanded. */
  maxExpandedChars: number;
};

/**
 * The OSC: a Secret holds at most 1 MiB of data; a large OSC (500 files, 50 units, 1 MiB) has 26 000
 * tokens, 11 000 nodes and depth 7; Gardener never writes aliases.
 */
export const oscYamlLimits: YamlLimits = {
  maxBytes: 2 << 20,
  maxTokens: 300_000,
  maxDepth: 64,
  maxAliases: 1000,
  maxExpandedNodes: 500_000,
  maxExpandedChars: 16 << 20,
};

/** Bytes → text: within the size cap and valid UTF-8, or an error naming `source`. */
export function decodeYamlBytes(bytes: Uint8Array, source: string, limits: Pick<YamlLimits, "maxBytes"> = oscYamlLimits): Result<string> {
  if (bytes.byteLength > limits.maxBytes) return { ok: false, errors: [`${source}: is ${bytes.byteLength} bytes, more than the limit of ${limits.maxBytes}`] };
  try {
    return { ok: true, value: new TextDecoder("utf-8", { fatal: true }).decode(bytes) };
  } catch {
    return { ok: false, errors: [`${source}: is not valid UTF-8 (byte ${firstInvalidUtf8(bytes)})`] };
  }
}

class LimitExceeded extends Error {}

/**
 * Parses one YAML document as Go's yaml reads Gardener's files (YAML 1.1: 0644 is octal, yes/no are
 * booleans), within `limits`. Errors name `source`, and the line and column where YAML says where.
 */
export function parseYaml(text: string, source: string, limits: YamlLimits = oscYamlLimits): Result<unknown> {
  const fail = (msg: string): Result<unknown> => ({ ok: false, errors: [`${source}: ${msg}`] });
  // Characters are at most bytes: a text within the byte cap passes, a larger one is refused before any work.
  if (text.length > limits.maxBytes) return fail(`is more than ${limits.maxBytes} bytes`);
  const control = unprintable.exec(text);
  if (control) return fail(`not valid YAML: the control character U+${(control[0].codePointAt(0) as number).toString(16).toUpperCase().padStart(4, "0")} is not allowed${lineAndColumn(text, control.index)}`);
  const simple = parseYamlSubset(text, limits);
  return simple ? { ok: true, value: simple.value } : parseYamlFully(text, source, limits);
}

/** parseYaml without the subset's fast path (test/unit/yaml-subset.test.ts compares the two). */
export function parseYamlFully(text: string, source: string, limits: YamlLimits = oscYamlLimits): Result<unknown> {
  const fail = (msg: string): Result<unknown> => ({ ok: false, errors: [`${source}: ${msg}`] });
  const lines = new LineCounter();
  const docs: Document.Parsed[] = [];
  try {
    const composer = new Composer({ version: "1.1", uniqueKeys: false });
    for (const doc of composer.compose(boundedTokens(text, lines, limits), true, text.length)) docs.push(doc);
  } catch (err) {
    if (err instanceof LimitExceeded) return fail(err.message);
    throw err;
  }
  if (docs.length > 1) return fail("holds more than one YAML document");
  const doc = docs[0];
  if (!doc || doc.contents === null) return fail("is empty");
  const at = (offset: number) => {
    const pos = lines.linePos(offset);
    return ` at line ${pos.line}, column ${pos.col}`;
  };
  const error = doc.errors[0];
  if (error) return fail(`not valid YAML: ${error.message.split("\n")[0]}${at(error.pos[0])}`);
  const problem = checkStructure(doc.contents, limits, at);
  if (problem) return fail(problem);
  return { ok: true, value: doc.toJS({ maxAliasCount: -1 }) };
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
function* boundedTokens(text: string, lines: LineCounter, limits: YamlLimits) {
  const parser = new Parser(lines.addNewLine);
  lines.addNewLine(0);
  let tokens = 0;
  let flowDepth = 0;
  for (const lexeme of new Lexer().lex(text)) {
    if (++tokens > limits.maxTokens) throw new LimitExceeded(`has more than ${limits.maxTokens} YAML tokens`);
    if (lexeme === "[" || lexeme === "{") {
      if (++flowDepth > limits.maxDepth) throw new LimitExceeded(`is nested more than ${limits.maxDepth} levels deep`);
    } else if (lexeme === "]" || lexeme === "}") flowDepth--;
    yield* parser.next(lexeme);
  }
  yield* parser.end();
}

// A key becomes a property name: a mapping, a sequence, or a scalar that reads as an object (!!binary
// bytes, a YAML 1.1 timestamp) would be turned into some string of the yaml package's choosing.
const keyProblem = "has a mapping key that is not a scalar (or is a !!binary or timestamp one)";
const isPlainScalar = (node: unknown): boolean => isScalar(node) && (node.value === null || typeof node.value !== "object");

type Frame = { node: Node; depth: number; children: Node[]; next: number; nodes: number; chars: number };

/** Depth, duplicate keys, keys that are not scalars, recursive aliases and the expanded size, in one pass. */
function checkStructure(root: Node | null, limits: YamlLimits, at: (offset: number) => string): string | undefined {
  if (root === null) return undefined;
  // The last node carrying each anchor so far, as the yaml package resolves an alias; sizes once closed.
  const anchors = new Map<string, Node>();
  const sizes = new Map<Node, { nodes: number; chars: number }>();
  const open = new Set<Node>();
  // Aliases used as mapping keys: one that names anything but a plain scalar is refused like such a key.
  const aliasKeys = new Set<Node>();
  let aliases = 0;
  let total = { nodes: 0, chars: 0 };
  const stack: Frame[] = [];
  const enter = (node: Node, depth: number): string | undefined => {
    if (depth > limits.maxDepth) return `is nested more than ${limits.maxDepth} levels deep`;
    if (node.anchor) anchors.set(node.anchor, node);
    if (isAlias(node)) {
      if (++aliases > limits.maxAliases) return `has more than ${limits.maxAliases} aliases`;
      const target = anchors.get(node.source);
      if (!target) return `alias *${node.source} has no anchor before it`;
      if (open.has(target)) return `alias *${node.source} refers to a node that contains it`;
      if (aliasKeys.has(node) && !isPlainScalar(target)) return keyProblem;
      const size = sizes.get(target) as { nodes: number; chars: number };
      return add(size.nodes, size.chars);
    }
    if (isScalar(node)) {
      const chars = typeof node.source === "string" ? node.source.length : String(node.value).length;
      if (node.anchor) sizes.set(node, { nodes: 1, chars });
      return add(1, chars);
    }
    if (isMap(node)) {
      const keys = new Set<string>();
      const children: Node[] = [];
      for (const pair of node.items) {
        if (!isPair(pair)) continue;
        const key = pair.key as Node | null;
        if (key !== null && !isPlainScalar(key) && !isAlias(key)) return keyProblem;
        const id = isScalar(key) ? `${typeof key.value}:${String(key.value)}` : key === null ? "null" : undefined;
        if (id !== undefined) {
          if (keys.has(id)) return `has the mapping key ${JSON.stringify(String(isScalar(key) ? key.value : null))} twice${key?.range ? at(key.range[0]) : ""}`;
          keys.add(id);
        }
        if (isAlias(key)) aliasKeys.add(key);
        if (key !== null) children.push(key);
        if (pair.value !== null) children.push(pair.value as Node);
      }
      return push(node, depth, children);
    }
    if (isSeq(node)) return push(node, depth, node.items.filter((i): i is Node => i !== null) as Node[]);
    return undefined;
  };
  const add = (nodes: number, chars: number): string | undefined => {
    const frame = stack.at(-1);
    if (frame) {
      frame.nodes += nodes;
      frame.chars += chars;
    } else total = { nodes, chars };
    // Every frame's count ends up in the total: checking the running sum bounds the work as it happens.
    const running = stack.reduce((n, f) => n + f.nodes, 0) + total.nodes;
    if (running > limits.maxExpandedNodes) return `expands to more than ${limits.maxExpandedNodes} nodes (through aliases)`;
    if (stack.reduce((n, f) => n + f.chars, 0) + total.chars > limits.maxExpandedChars) return `expands to more than ${limits.maxExpandedChars} characters (through aliases)`;
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
    problem = add(frame.nodes, frame.chars);
  }
  return problem;
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
