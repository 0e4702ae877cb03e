// What holds a process's memory, from a heap snapshot in V8's format (Bun.generateHeapSnapshot("v8"),
// written by the agent on SIGUSR2 when TRELLIS_HEAP_SNAPSHOT names a file): every object's retained size
// (what would be freed with it: the dominator tree, Cooper–Harvey–Kennedy's iterative algorithm) and, for
// the largest, the chain of objects that hold it (its dominators, named by the edge each is reached by).
type Snapshot = {
  snapshot: { meta: { node_fields: string[]; node_types: [string[]]; edge_fields: string[]; edge_types: [string[]] }; node_count: number };
  nodes: number[];
  edges: number[];
  strings: string[];
};

/** `tree`: one line per object of minBytes or more, indented under what holds it: "retained KiB, edge, object". */
export type HeapSummary = { totalBytes: number; objects: number; tree: string[] };

const kib = (bytes: number) => `${(bytes / 1024).toFixed(0).padStart(6)} KiB`;

export function analyzeHeapSnapshot(json: string, minBytes = 64 << 10, maxLines = 80): HeapSummary {
  const s = JSON.parse(json) as Snapshot;
  const nf = s.snapshot.meta.node_fields;
  const ef = s.snapshot.meta.edge_fields;
  const nodeTypes = s.snapshot.meta.node_types[0];
  const edgeTypes = s.snapshot.meta.edge_types[0];
  const [NT, NN, NS, NE] = ["type", "name", "self_size", "edge_count"].map((f) => nf.indexOf(f)) as [number, number, number, number];
  const [ET, EN, ETO] = ["type", "name_or_index", "to_node"].map((f) => ef.indexOf(f)) as [number, number, number];
  const nw = nf.length;
  const ew = ef.length;
  const n = s.nodes.length / nw;
  const firstEdge = new Uint32Array(n + 1);
  for (let i = 0; i < n; i++) firstEdge[i + 1] = (firstEdge[i] as number) + (s.nodes[i * nw + NE] as number);
  const weak = edgeTypes.indexOf("weak");
  const outgoing = (i: number, visit: (to: number, e: number) => void) => {
    for (let e = firstEdge[i] as number; e < (firstEdge[i + 1] as number); e++) {
      if (s.edges[e * ew + ET] === weak) continue;
      visit((s.edges[e * ew + ETO] as number) / nw, e);
    }
  };
  // Bun's snapshot has no edges for the entries of a Map or Set (nor some native holders): what nothing
  // references is held from the root through them, edge -1.
  const referenced = new Uint8Array(n);
  for (let i = 0; i < n; i++) outgoing(i, (to) => (referenced[to] = 1));
  const unreferenced: number[] = [];
  for (let i = 1; i < n; i++) if (!referenced[i]) unreferenced.push(i);
  const targets = (i: number, visit: (to: number, e: number) => void) => {
    outgoing(i, visit);
    if (i === 0) for (const to of unreferenced) visit(to, -1);
  };
  // Reverse post-order from the root (node 0), iteratively.
  const order = new Int32Array(n).fill(-1);
  const post: number[] = [];
  const stack: number[] = [0];
  const next = new Uint32Array(n);
  const seen = new Uint8Array(n);
  seen[0] = 1;
  const cache = new Map<number, number[]>();
  const edgesOf = (v: number) => {
    let out = cache.get(v);
    if (!out) {
      const list: number[] = [];
      targets(v, (to) => list.push(to));
      cache.set(v, (out = list));
    }
    return out;
  };
  while (stack.length) {
    const v = stack[stack.length - 1] as number;
    let pushed = false;
    const out = edgesOf(v);
    while ((next[v] as number) < out.length) {
      const k = next[v] as number;
      next[v] = k + 1;
      const to = out[k] as number;
      if (!seen[to]) {
        seen[to] = 1;
        stack.push(to);
        pushed = true;
        break;
      }
    }
    if (!pushed) {
      stack.pop();
      cache.delete(v);
      order[v] = post.length;
      post.push(v);
    }
  }
  const preds: number[][] = Array.from({ length: n }, () => []);
  for (const v of post) targets(v, (to) => seen[to] && (preds[to] as number[]).push(v));
  const idom = new Int32Array(n).fill(-1);
  idom[0] = 0;
  const intersect = (a: number, b: number) => {
    while (a !== b) {
      while ((order[a] as number) < (order[b] as number)) a = idom[a] as number;
      while ((order[b] as number) < (order[a] as number)) b = idom[b] as number;
    }
    return a;
  };
  for (let changed = true; changed; ) {
    changed = false;
    for (let k = post.length - 2; k >= 0; k--) {
      const v = post[k] as number;
      let d = -1;
      for (const p of preds[v] as number[]) if (idom[p] !== -1) d = d === -1 ? p : intersect(p, d);
      if (d !== -1 && idom[v] !== d) {
        idom[v] = d;
        changed = true;
      }
    }
  }
  const retained = new Float64Array(n);
  for (const v of post) retained[v] = (retained[v] as number) + (s.nodes[v * nw + NS] as number);
  for (const v of post) if (v !== 0) retained[idom[v] as number] = (retained[idom[v] as number] as number) + (retained[v] as number);
  const label = (i: number) => {
    const name = s.strings[s.nodes[i * nw + NN] as number] ?? "";
    return `${nodeTypes[s.nodes[i * nw + NT] as number]} ${JSON.stringify(name.length > 40 ? `${name.slice(0, 40)}…` : name)}`;
  };
  const edgeName = (from: number, to: number) => {
    let found = "";
    targets(from, (t, e) => {
      if (t !== to || found) return;
      if (e === -1) {
        found = "(unreferenced: a Map's or Set's entry, or native)";
        return;
      }
      const type = edgeTypes[s.edges[e * ew + ET] as number];
      const name = s.edges[e * ew + EN] as number;
      found = type === "element" || type === "hidden" ? `[${name}]` : `.${s.strings[name]}`;
    });
    return found || "(via others)";
  };
  const children: number[][] = Array.from({ length: n }, () => []);
  for (const v of post) if (v !== 0 && (retained[v] as number) >= minBytes) (children[idom[v] as number] as number[]).push(v);
  // The dominator tree from the root down, objects of minBytes or more only, largest first; a chain of
  // holders that each retain little more than their one large part is printed as one line (a path).
  const lines: string[] = [];
  const walk = (v: number, depth: number) => {
    const path = [`${edgeName(idom[v] as number, v)} ${label(v)}`];
    let end = v;
    for (;;) {
      const kids = (children[end] as number[]).sort((a, b) => (retained[b] as number) - (retained[a] as number));
      const only = kids[0];
      if (only === undefined || (retained[only] as number) < 0.9 * (retained[end] as number)) break;
      path.push(`${edgeName(end, only)} ${label(only)}`);
      end = only;
    }
    lines.push(`${"  ".repeat(depth)}${kib(retained[v] as number)} ${path.join(" → ")}`);
    if (lines.length >= maxLines) return;
    for (const c of children[end] as number[]) if (lines.length < maxLines) walk(c, depth + 1);
  };
  for (const c of (children[0] as number[]).sort((a, b) => (retained[b] as number) - (retained[a] as number))) walk(c, 0);
  return { totalBytes: retained[0] as number, objects: post.length, tree: lines };
}
