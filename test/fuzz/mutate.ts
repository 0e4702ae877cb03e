// Mutations of a generated OSC at three levels: the structure (type swaps, deleted, duplicated and
// foreign fields, paths with .., //, NUL, huge or unicode segments, bad unit and drop-in names, flipped
// encodings), the YAML (anchors and aliases, merge keys), and the bytes (flips, YAML tokens, broken
// UTF-8, duplicated, swapped and repeated lines, truncation).
import { Document, isMap, type Node, visit } from "yaml";
import type { prng } from "../harness/prng.ts";

export type Rng = ReturnType<typeof prng>;
type Slot = { parent: Record<string, unknown> | unknown[]; key: string | number; value: unknown };

function slots(root: unknown): Slot[] {
  const out: Slot[] = [];
  const walk = (node: unknown) => {
    if (Array.isArray(node)) node.forEach((value, key) => (out.push({ parent: node, key, value }), walk(value)));
    else if (node && typeof node === "object") {
      for (const [key, value] of Object.entries(node)) {
        out.push({ parent: node as Record<string, unknown>, key, value });
        walk(value);
      }
    }
  };
  walk(root);
  return out;
}

const set = (s: Slot, value: unknown) => ((s.parent as Record<string | number, unknown>)[s.key] = value);

function mutatePath(r: Rng, p: string): string {
  const slash = () => {
    const at = [...p.matchAll(/\//g)].map((m) => m.index);
    return at.length ? r.pick(at) : 0;
  };
  const at = slash();
  return r.pick([
    () => `${p}/..`,
    () => `${p.slice(0, at)}/..${p.slice(at)}`,
    () => `${p.slice(0, at)}/${p.slice(at)}`,
    () => `${p.slice(0, at)}/.${p.slice(at)}`,
    () => `${p}\0`,
    () => `${p.slice(0, at)}\0${p.slice(at)}`,
    () => `${p}/`,
    () => p.slice(1),
    () => `${p}/${"a".repeat(300)}`,
    () => `/${"d/".repeat(2100)}f`,
    () => `${p.slice(0, at)}/ü✓\u202e🚀${p.slice(at)}`,
    () => r.pick(["/proc/sys/kernel/x", "/sys/x", "/dev/sda", "/proc", "/", "", " /etc/x", "/etc/x\n", "C:\\x", "/etc/fuzz/a.conf\\x"]),
    () => r.pick(["/var/lib/gardener-node-agent/credentials/token", "/var/lib/gardener-node-agent/trellis/state.json", "/etc/systemd/system/fuzz-a.service"]),
  ])();
}

function mutateName(r: Rng, n: string): string {
  return r.pick([
    () => `${n}/x`,
    () => `../${n}`,
    () => n.replace(/\.[^.]*$/, ""),
    () => n.toUpperCase(),
    () => `${n}\0`,
    () => `ü${n}`,
    () => `${"a".repeat(300)}${n}`,
    () => "",
    () => ` ${n}`,
    () => `${n}.d`,
    () => `x.service/../${n}`,
    () => `..${n}`,
    () => `${n}\n`,
  ])();
}

const values = (v: unknown): unknown[] => [null, 0, -1, 1.5, 2 ** 53, 1e308, "", "0644", "yes", true, [], {}, [v], { v }, "x".repeat(300)];

const treeMutators: ((r: Rng, root: unknown) => void)[] = [
  // type swap
  (r, root) => {
    const s = r.pick(slots(root));
    if (s) set(s, r.pick(values(s.value)));
  },
  // delete a field or an element
  (r, root) => {
    const s = r.pick(slots(root));
    if (!s) return;
    if (Array.isArray(s.parent)) s.parent.splice(s.key as number, 1);
    else delete s.parent[s.key as string];
  },
  // duplicate an element (duplicate paths, unit names, drop-ins), now and then many times
  (r, root) => {
    const s = r.pick(slots(root).filter((x) => Array.isArray(x.parent)));
    if (!s) return;
    const list = s.parent as unknown[];
    for (let n = r.chance(0.02) ? 300 : 1; n > 0; n--) list.splice(r.int(list.length + 1), 0, structuredClone(s.value));
  },
  // paths
  (r, root) => {
    const s = r.pick(slots(root).filter((x) => typeof x.value === "string" && x.value.startsWith("/")));
    if (s) set(s, mutatePath(r, s.value as string));
  },
  // unit, drop-in, secret, upstream names
  (r, root) => {
    const s = r.pick(slots(root).filter((x) => (x.key === "name" || x.key === "upstream" || x.key === "dataKey") && typeof x.value === "string"));
    if (s) set(s, mutateName(r, s.value as string));
  },
  // encodings flipped without re-encoding, or broken base64
  (r, root) => {
    const s = r.pick(slots(root).filter((x) => x.key === "inline" && x.value && typeof x.value === "object"));
    if (!s) return;
    const inline = s.value as Record<string, unknown>;
    if (r.chance(0.5)) inline.encoding = r.pick(["", "plain", "b64", "base64", "gzip", "B64", "base64 ", null, 64]);
    else inline.data = r.pick(["aGVsbG8", "aGVsbG8=\n", "aGVs\nbG8=", "!!!!", "aGVsbG8==", "a", "===="]);
  },
  // a field the schema does not know, or one from elsewhere
  (r, root) => {
    const s = r.pick(slots(root).filter((x) => x.value && typeof x.value === "object" && !Array.isArray(x.value)));
    if (!s) return;
    const o = s.value as Record<string, unknown>;
    o[r.pick(["unknownField", "path", "content", "units", "files", "dropIns", "secretRef", "imageRef", "hostName"])] = r.pick(values("x"));
  },
  // content and data: NUL, lone surrogate, control characters, unicode, large
  (r, root) => {
    const s = r.pick(slots(root).filter((x) => (x.key === "content" || x.key === "data") && typeof x.value === "string"));
    if (!s) return;
    const v = s.value as string;
    const large = () => (r.chance(0.5) ? v.repeat(1 + r.int(2000)) : `${v}${"z".repeat(r.int(200_000))}`);
    set(s, r.chance(0.05) ? large() : r.pick([`${v}\0`, `${v}\ud800`, `${v}\u0007\u001b[31m`, `${v}\u2028\ufeff`, v.repeat(1 + r.int(20))]));
  },
  // an entry moved to another list (a unit among files, a file among units)
  (r, root) => {
    const lists = slots(root).filter((x) => Array.isArray(x.value));
    const from = r.pick(lists);
    const to = r.pick(lists);
    const moved = from && (from.value as unknown[]).shift();
    if (to && moved !== undefined) (to.value as unknown[]).push(moved);
  },
];

export function mutateTree(r: Rng, tree: unknown, n: number): Record<string, unknown> {
  const root = structuredClone(tree) as Record<string, unknown>;
  for (let i = 0; i < n; i++) r.pick(treeMutators)(r, root);
  return root;
}

/** YAML 1.1 as Go writes it; now and then an anchor with an alias (or a merge key) to it. */
export function toYaml(r: Rng, tree: unknown): string {
  const doc = new Document(tree, { version: "1.1" });
  if (r.chance(0.1)) {
    try {
      addAlias(r, doc);
    } catch {
      // The yaml package refuses some placements (an alias of a node that contains it, as a key): keep the tree.
      return new Document(tree, { version: "1.1" }).toString({ lineWidth: 0 });
    }
  }
  return doc.toString({ lineWidth: 0 });
}

function addAlias(r: Rng, doc: Document): void {
  const nodes: Node[] = [];
  visit(doc, { Node: (_, node) => void nodes.push(node) });
  if (nodes.length < 3) return;
  const i = r.int(nodes.length - 1);
  const j = i + 1 + r.int(nodes.length - i - 1);
  const anchored = nodes[i] as Parameters<Document["createAlias"]>[0];
  const target = nodes[j];
  if (r.chance(0.3) && isMap(target) && isMap(anchored)) {
    target.items.push(doc.createPair("<<", doc.createAlias(anchored, "a")));
    return;
  }
  const alias = doc.createAlias(anchored, "a");
  visit(doc, { Node: (_, node) => (node === target ? alias : undefined) });
}

const tokens = ["&a ", "*a", "!!binary ", "!!str ", "!!int ", "!!map ", "? ", "- ", ": ", "{", "}", "[", "]", "---\n", "\n...\n", "<<: *a\n", "%YAML 1.1\n", "'", '"', "|\n", ">-\n", "\t", "0o644", "0x1ff", "~", "\ufeff", "#", "@", "`"];
const bytesOf = (s: string) => new TextEncoder().encode(s);

const byteMutators: ((r: Rng, b: Uint8Array) => Uint8Array)[] = [
  (r, b) => {
    const c = b.slice();
    const i = r.int(c.length);
    if (c.length) c[i] = (c[i] as number) ^ (1 << r.int(8));
    return c;
  },
  (r, b) => splice(b, r.int(b.length + 1), 0, Uint8Array.of(r.pick([0x00, 0xff, 0xc3, 0xed, 0x09, 0x0a, 0x0d, 0x22, 0x27, 0x3a, 0x2d, 0x20, 0x7b, 0x5b, 0x26, 0x2a, 0x21, 0x23, 0x7c]))),
  (r, b) => splice(b, r.int(b.length + 1), 0, bytesOf(r.pick(tokens))),
  (r, b) => splice(b, r.int(b.length + 1), r.int(40), new Uint8Array()),
  (r, b) => lines(b, (ls) => {
    const i = r.int(ls.length);
    ls.splice(i, 0, ...Array<string>(r.chance(0.02) ? 5000 : 1).fill(ls[i] ?? ""));
  }),
  (r, b) => lines(b, (ls) => {
    const i = r.int(ls.length);
    const j = r.int(ls.length);
    [ls[i], ls[j]] = [ls[j] ?? "", ls[i] ?? ""];
  }),
  (r, b) => lines(b, (ls) => {
    const i = r.int(ls.length);
    ls[i] = r.chance(0.5) ? `  ${ls[i]}` : (ls[i] ?? "").replace(/^ {1,2}/, "");
  }),
  (r, b) => b.slice(0, r.int(b.length + 1)),
];

function splice(b: Uint8Array, at: number, remove: number, insert: Uint8Array): Uint8Array {
  const out = new Uint8Array(b.length - Math.min(remove, b.length - at) + insert.length);
  out.set(b.subarray(0, at));
  out.set(insert, at);
  out.set(b.subarray(at + remove), at + insert.length);
  return out;
}

function lines(b: Uint8Array, edit: (ls: string[]) => void): Uint8Array {
  const ls = new TextDecoder().decode(b).split("\n");
  edit(ls);
  return bytesOf(ls.join("\n"));
}

export function mutateBytes(r: Rng, bytes: Uint8Array, n: number): Uint8Array {
  let b = bytes;
  for (let i = 0; i < n; i++) b = r.pick(byteMutators)(r, b);
  return b;
}
