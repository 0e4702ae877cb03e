// Valid OSCs as a newer Gardener, or a person, may put them in the Secret (issue 20): fields Gardener
// v1.150's types do not have, wherever a Gardener object is (and inside fields trellis does not read,
// where they are not fields at all), a top-level key of templates merged in with `<<`, anchors and
// aliases of shared subtrees and scalars, block and flow style, and now and then about a megabyte. Each
// case knows the OSC it stands for and the exact paths of its unknown fields; checkValid holds trellis to
// both: the OSC is accepted and read as that tree, every unknown field is reported once per place it
// lands, nothing else is, and the node's desired state carries the same report.
import { mkdirSync, rmSync } from "node:fs";
import { join } from "node:path";
import * as v from "valibot";
import { parseOscBytes } from "../../src/api/desired.ts";
import { fieldPath } from "../../src/api/issues.ts";
import { OperatingSystemConfigSchema } from "../../src/api/osc.ts";
import { oscYamlLimits } from "../../src/api/yaml.ts";
import { desiredForNode } from "../../src/apply/desired-for-node.ts";
import { createFiles } from "../../src/host/files.ts";
import type { ImageStore } from "../../src/host/registry/store.ts";
import { createLogger } from "../../src/log.ts";
import { prng } from "../harness/prng.ts";
import { caseSeed } from "./case.ts";
import type { Finding } from "./property.ts";

type Rng = ReturnType<typeof prng>;
type Value = string | number | boolean | null | Value[] | { [key: string]: Value };
type Mapping = { [key: string]: Value };

export type ValidCase = { seed: number; index: number; yaml: string; unknown: string[]; osc: Mapping };

const source = "Secret kube-system/fuzz-valid";
const hostName = "fuzz-node";
/** Keys no Gardener type has (nor the YAML 1.1 words that read as booleans). */
const unknownKeys = ["futureField", "x-annotations", "owner", "compression", "priority", "labels", "checksum", "retries", "x_meta", "nodeHints"];
const unitTexts = ["[Service]\nExecStart=/bin/true\n", "[Unit]\nDescription=fuzz valid\n[Service]\nType=oneshot\nExecStart=/bin/true\n"];
const words = ["alpha", "größe", "a b c", "line one\nline two\n", "0644", "yes", "null", "~", "# not a comment", "key: value", "- item", "*star", "&amp", "<<", ""];

const isMapping = (x: Value): x is Mapping => x !== null && typeof x === "object" && !Array.isArray(x);

/**
 * The OSC as a tree, the unknown keys put into it (by the object that holds them), and the
 * objects some other place shares (an alias there).
 */
function genTree(r: Rng, large: boolean) {
  const added = new Map<Mapping, Set<string>>();
  const candidates: Mapping[] = [];
  const known = (o: Mapping): Mapping => (candidates.push(o), o);
  const anything = (depth: number): Value => {
    const k = r.int(depth > 2 ? 3 : 5);
    if (k === 0) return r.pick(words);
    if (k === 1) return r.int(1000);
    if (k === 2) return r.chance(0.5);
    if (k === 3) return Array.from({ length: r.int(3) }, () => anything(depth + 1));
    return Object.fromEntries(Array.from({ length: r.int(3) }, () => [r.pick(["path", "content", "name", "a", "b"]), anything(depth + 1)]));
  };
  const nFiles = large ? 1800 : 1 + r.int(6);
  const files: Mapping[] = [];
  for (let i = 0; i < nFiles; i++) {
    const text = large ? `${r.pick(words)}${"x".repeat(300 + r.int(200))}` : r.pick(words);
    const b64 = r.chance(0.3);
    const inline = known({ ...(b64 ? { encoding: "b64" } : r.chance(0.3) ? { encoding: "" } : {}), data: b64 ? Buffer.from(text).toString("base64") : text });
    // Now and then the content of an earlier file, shared: an alias of it.
    const earlier = files.length > 0 && r.chance(0.15) ? (r.pick(files).content as Mapping) : undefined;
    files.push(
      known({
        path: `/etc/fuzz-valid/${i}`,
        ...(r.chance(0.5) ? { permissions: r.pick([0o644, 0o600, 0o755]) } : {}),
        content: earlier ?? known({ inline }),
        ...(r.chance(0.1) ? { hostName: r.pick([hostName, "other-node"]) } : {}),
      }),
    );
  }
  const paths = files.map((f) => f.path as string);
  const unit = (name: string): Mapping =>
    known({
      name,
      ...(r.chance(0.5) ? { command: r.pick(["start", "restart", "stop"]) } : {}),
      ...(r.chance(0.5) ? { enable: r.chance(0.7) } : {}),
      content: r.pick(unitTexts),
      ...(r.chance(0.5) ? { dropIns: Array.from({ length: 1 + r.int(2) }, (_, d) => known({ name: `${10 + d}-fuzz.conf`, content: r.pick(unitTexts) })) } : {}),
      ...(r.chance(0.4) ? { filePaths: r.subset(paths, 0.3) } : {}),
    });
  const units = Array.from({ length: r.int(4) }, (_, j) => unit(`fuzz-valid-${j}.service`));
  const spec = known({
    type: "debian",
    purpose: "reconcile",
    // Not read by trellis: keys in it are no fields, and not reported.
    providerConfig: { apiVersion: "x/v1", kind: "Y", futureField: anything(1) },
    units,
    files: files.slice(0, Math.ceil(files.length / 2)),
    ...(r.chance(0.4) ? { criConfig: known({ name: "containerd", ...(r.chance(0.5) ? { cgroupDriver: "systemd" } : {}) }) } : {}),
  });
  const status = known({
    extensionUnits: Array.from({ length: r.int(3) }, (_, j) => unit(`fuzz-status-${j}.service`)),
    extensionFiles: files.slice(Math.ceil(files.length / 2)),
    lastOperation: { type: "Reconcile", state: "Succeeded", futureField: 1 },
  });
  const osc = known({ apiVersion: "extensions.gardener.cloud/v1alpha1", kind: "OperatingSystemConfig", metadata: { name: "fuzz", namespace: "kube-system", futureField: "x" }, spec, status });
  for (let n = large ? 200 : r.int(6); n > 0; n--) {
    const o = r.pick(candidates);
    const key = r.pick(unknownKeys);
    o[key] = anything(1);
    added.set(o, new Set([...(added.get(o) ?? []), key]));
  }
  return { osc, added };
}

/** Every path of the tree where a key put in by genTree lands (an object shared by two places: both). */
function unknownPaths(osc: Mapping, added: Map<Mapping, Set<string>>): string[] {
  const out: string[] = [];
  const walk = (x: Value, path: string) => {
    if (Array.isArray(x)) x.forEach((e, i) => walk(e, fieldPath(path, i)));
    else if (isMapping(x)) {
      for (const [k, e] of Object.entries(x)) {
        if (added.get(x)?.has(k)) out.push(fieldPath(path, k));
        else walk(e, fieldPath(path, k));
      }
    }
  };
  walk(osc, "");
  return out;
}

/**
 * YAML for the tree: block style with now and then a flow mapping, strings double-quoted or as literal
 * blocks, objects shared by two places anchored and aliased, scalars now and then too, and keys of a
 * mapping now and then moved into a template under the top-level key x-templates, merged back with `<<`
 * (the template holding a decoy of a key the mapping then sets itself, after the merge; or followed by a
 * template of decoys in a sequence of merged mappings).
 */
function toYaml(r: Rng, osc: Mapping): { yaml: string; templates: boolean } {
  const seen = new Map<object, number>();
  const count = (x: Value) => {
    if (x === null || typeof x !== "object") return;
    seen.set(x, (seen.get(x) ?? 0) + 1);
    if (seen.get(x) === 1) for (const e of Object.values(x)) count(e);
  };
  count(osc);
  const anchors = new Map<object, string>();
  const scalarAnchors = new Map<string, string>();
  let next = 0;
  const templates: string[] = [];
  const scalar = (x: string | number | boolean | null): string => {
    const text = typeof x === "string" ? JSON.stringify(x) : x === null ? "null" : typeof x === "number" && r.chance(0.3) ? `0${x.toString(8)}` : String(x);
    const id = `${typeof x}:${String(x)}`;
    const alias = scalarAnchors.get(id);
    if (alias && r.chance(0.5)) return `*${alias}`;
    if (alias || !r.chance(0.05)) return text;
    const name = `s${next++}`;
    scalarAnchors.set(id, name);
    return `&${name} ${text}`;
  };
  const flow = (x: Value): string => {
    if (Array.isArray(x)) return `[${x.map(flow).join(", ")}]`;
    if (isMapping(x)) return `{${Object.entries(x).map(([k, e]) => `${k}: ${flow(e)}`).join(", ")}}`;
    return typeof x === "string" ? JSON.stringify(x) : String(x);
  };
  // The text after "key:" or "-" for x, and the lines below it, indented `indent`.
  const node = (x: Value, indent: number): string => {
    if (x === null || typeof x !== "object") {
      // A literal block keeps lines that start with no space and end with one line break, as they are.
      if (typeof x === "string" && /^(?:[^\s][^\n]*\n)+$/.test(x) && !/ \n/.test(x) && r.chance(0.5)) return ` |\n${x.slice(0, -1).split("\n").map((l) => `${" ".repeat(indent)}${l}\n`).join("")}`;
      return ` ${scalar(x)}\n`;
    }
    const anchor = anchors.get(x);
    if (anchor) return ` *${anchor}\n`;
    let head = "";
    if ((seen.get(x) ?? 0) > 1) {
      const name = `a${next++}`;
      anchors.set(x, name);
      head = ` &${name}`;
    }
    const pad = " ".repeat(indent);
    if (Array.isArray(x)) return x.length === 0 ? `${head} []\n` : `${head}\n${x.map((e) => `${pad}-${node(e, indent + 2)}`).join("")}`;
    const entries = Object.entries(x);
    if (entries.length === 0) return `${head} {}\n`;
    // Only a mapping with no shared object inside may be written in flow style: an anchor there would be lost.
    const flat = entries.every(([, e]) => e === null || typeof e !== "object" || (isMapping(e) && Object.values(e).every((s) => s === null || typeof s !== "object")));
    if (flat && !head && r.chance(0.15)) return ` ${flow(x)}\n`;
    let lines = "";
    const scalars = entries.filter(([, e]) => e === null || typeof e !== "object");
    if (x !== osc && scalars.length > 0 && r.chance(0.2)) {
      const moved = r.subset(scalars, 0.6);
      const decoy = entries.find(([k]) => !moved.some(([m]) => m === k));
      const name = `t${templates.length}`;
      const body = [...moved, ...(decoy && r.chance(0.5) ? [[decoy[0], "decoy"] as const] : [])];
      templates.push(`  ${name}: &${name} {${body.map(([k, e]) => `${k}: ${flow(e)}`).join(", ")}}\n`);
      if (moved.length > 0 && r.chance(0.4)) {
        // Of a sequence of mappings the earlier one wins: a later one of decoys loses.
        const decoys = `t${templates.length}`;
        templates.push(`  ${decoys}: &${decoys} {${moved.map(([k]) => `${k}: "decoy"`).join(", ")}}\n`);
        lines += `${pad}<<: [*${name}, *${decoys}]\n`;
      } else lines += `${pad}<<: *${name}\n`;
      for (const [k, e] of entries) if (!moved.some(([m]) => m === k)) lines += `${pad}${k}:${node(e, indent + 2)}`;
    } else for (const [k, e] of entries) lines += `${pad}${k}:${node(e, indent + 2)}`;
    return `${head}\n${lines}`;
  };
  const body = Object.entries(osc).map(([k, e]) => `${k}:${node(e, 2)}`).join("");
  return { yaml: templates.length > 0 ? `x-templates:\n${templates.join("")}${body}` : body, templates: templates.length > 0 };
}

/** Case `index` of `seed`; `large`: about a megabyte (a Secret holds at most 1 MiB). */
export function generateValidCase(seed: number, index: number, large = false): ValidCase {
  const r = prng(caseSeed(seed, index) ^ 0x5eed);
  const { osc, added } = genTree(r, large);
  const { yaml, templates } = toYaml(r, osc);
  const unknown = [...(templates ? ["x-templates"] : []), ...unknownPaths(osc, added)];
  return { seed, index, yaml, unknown, osc };
}

const unknownLine = /^Secret kube-system\/fuzz-valid: (.*): not a field of Gardener v1\.150's OperatingSystemConfig; ignored, as gardener-node-agent ignores it$/;
const noImages: ImageStore = {
  extract: async () => {
    throw new Error("a valid fuzz case has no imageRef");
  },
  prune: async () => {},
};

/** The properties of a valid case (findings: what broke), its node resolved under a scratch root in `dir`. */
export async function checkValid(c: ValidCase, dir: string): Promise<Finding[]> {
  const findings: Finding[] = [];
  const fail = (property: string, detail: string) => findings.push({ property, detail });
  const bytes = new TextEncoder().encode(c.yaml);
  if (bytes.byteLength > oscYamlLimits.maxBytes) fail("within a Secret", `${bytes.byteLength} bytes`);
  const parsed = parseOscBytes(bytes, source);
  if (!parsed.ok) {
    fail("a valid OSC is accepted", parsed.errors.slice(0, 3).join("\n"));
    return findings;
  }
  const reported = parsed.ignored.map((line) => unknownLine.exec(line)?.[1] ?? `not an unknown field: ${line}`);
  const missing = c.unknown.filter((p) => !reported.includes(p));
  const extra = reported.filter((p) => !c.unknown.includes(p));
  if (missing.length > 0 || extra.length > 0 || reported.length !== c.unknown.length) {
    fail("every unknown field is reported, once, and nothing else", `missing ${JSON.stringify(missing.slice(0, 5))}, extra ${JSON.stringify(extra.slice(0, 5))} (${reported.length} reported, ${c.unknown.length} expected)`);
  }
  if (!Bun.deepEquals(parsed.value, v.parse(OperatingSystemConfigSchema, c.osc), true)) fail("the OSC is read as written (anchors, aliases, merge keys)", "the parsed OSC differs from the tree");
  const root = join(dir, `valid-${c.index}`);
  mkdirSync(root, { recursive: true });
  try {
    const log = createLogger({ level: "error", write: () => {} });
    const resolved = await desiredForNode(parsed.value, source, { files: createFiles(root), hostName, images: noImages, log, ignored: parsed.ignored });
    if (!resolved.ok) fail("a valid OSC is accepted", resolved.errors.slice(0, 3).join("\n"));
    else if (!Bun.deepEquals(resolved.value.unsupported, parsed.ignored)) fail("the node's desired state reports it", JSON.stringify(resolved.value.unsupported.slice(0, 3)));
  } finally {
    rmSync(root, { recursive: true, force: true });
  }
  return findings;
}
