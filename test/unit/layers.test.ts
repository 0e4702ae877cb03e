// Layered configuration (src/api/layers.ts): overlays in the OSC Secret, picked by node labels, merged by
// unit name and file path by rank (fallback < default = osc.yaml < group < node < force), with provenance.
import { describe, expect, test } from "bun:test";
import { sha256Hex } from "../../src/api/desired.ts";
import { fileEntry, layeredChecksum, layerOsc, type Overlay, parseOverlays, unitEntry } from "../../src/api/layers.ts";
import type { OperatingSystemConfig } from "../../src/api/osc.ts";
import { prng } from "../harness/prng.ts";

const src = "Secret kube-system/pool";
const enc = (s: string) => new TextEncoder().encode(s);
const file = (path: string, data: string) => ({ path, permissions: 0o644, content: { inline: { encoding: "", data } } });
const unit = (name: string, content = `[Service]\nExecStart=/bin/true # ${name}\n`) => ({ name, content });
const base: OperatingSystemConfig = {
  apiVersion: "extensions.gardener.cloud/v1alpha1",
  kind: "OperatingSystemConfig",
  spec: { units: [unit("kubelet.service"), unit("web.service")], files: [file("/etc/a", "base a"), file("/etc/b", "base b")] },
  status: { extensionFiles: [file("/etc/ext", "base ext")] },
};
const overlays = (docs: Record<string, string>): Overlay[] => {
  const r = parseOverlays(Object.fromEntries(Object.entries(docs).map(([k, v]) => [k, enc(v)])), src);
  if (!r.ok) throw new Error(r.errors.join("\n"));
  return r.value;
};
const filesOf = (o: OperatingSystemConfig) => Object.fromEntries([...(o.spec.files ?? []), ...(o.status?.extensionFiles ?? [])].map((f) => [f.path, f.content.inline?.data]));

describe("overlays in the Secret", () => {
  test.each([
    [{ "overlay-GPU.yaml": "rank: group\nselector: a=b\n" }, `${src}: data["overlay-GPU.yaml"]: an overlay's key is overlay-<name>.yaml`],
    [{ "overlay-gpu.yaml": "rank: group\nselector: a=b\nunits: {}\n" }, `${src}: data["overlay-gpu.yaml"]: units`],
    [{ "overlay-gpu.yaml": "rank: default\nselector: a=b\n" }, 'data["overlay-gpu.yaml"]: rank'],
    [{ "overlay-gpu.yaml": "rank: group\n" }, 'data["overlay-gpu.yaml"]: selector'],
    [{ "overlay-gpu.yaml": "rank: group\nselector: 'a in (b'\n" }, 'data["overlay-gpu.yaml"]: selector: "a in (b": unbalanced parentheses'],
    [{ "overlay-gpu.yaml": "rank: group\nselector: a=b\nextra: 1\n" }, 'data["overlay-gpu.yaml"]'],
    [{ "overlay-gpu.yaml": "rank: [group\n" }, 'data["overlay-gpu.yaml"]'],
  ])("refused: %j", (docs, message) => {
    const r = parseOverlays(Object.fromEntries(Object.entries(docs).map(([k, v]) => [k, enc(v)])), src);
    expect(r.ok).toBe(false);
    if (!r.ok) expect(r.errors.join("\n")).toContain(message);
  });

  test("other data keys are not overlays", () => {
    expect(overlays({ "osc.yaml": "x", other: "y" })).toEqual([]);
  });
});

describe("merging by rank", () => {
  const all = overlays({
    "overlay-fallback.yaml": `rank: fallback\nselector: pool=x\nfiles:\n  - {path: /etc/a, content: {inline: {data: fallback a}}}\n  - {path: /etc/only-fallback, content: {inline: {data: fallback only}}}\n`,
    "overlay-gpu.yaml": `rank: group\nselector: gpu=true\nfiles:\n  - {path: /etc/a, content: {inline: {data: group a}}}\n  - {path: /etc/ext, content: {inline: {data: group ext}}}\nunits:\n  - {name: kubelet.service, content: "[Service]\\nExecStart=/bin/kubelet --gpu\\n"}\n`,
    "overlay-n1.yaml": `rank: node\nselector: kubernetes.io/hostname=n1\nfiles:\n  - {path: /etc/a, content: {inline: {data: node a}}}\n`,
    "overlay-freeze.yaml": `rank: force\nselector: freeze\nfiles:\n  - {path: /etc/b, content: {inline: {data: forced b}}}\n`,
  });
  const layered = (labels: Record<string, string>) => {
    const r = layerOsc(base, all, labels, src);
    if (!r.ok) throw new Error(r.errors.join("\n"));
    return r.value;
  };

  test("no overlay matches: the base as it is, every entry from osc.yaml", () => {
    const l = layered({});
    expect(l.osc).toBe(base);
    expect(l.matched).toEqual([]);
    expect(new Set(l.provenance.values())).toEqual(new Set(["osc.yaml"]));
  });

  test("fallback fills only what no other layer defines", () => {
    const l = layered({ pool: "x" });
    expect(filesOf(l.osc)).toMatchObject({ "/etc/a": "base a", "/etc/only-fallback": "fallback only" });
    expect(l.provenance.get(fileEntry("/etc/only-fallback"))).toBe("overlay-fallback.yaml (fallback)");
    expect(l.provenance.get(fileEntry("/etc/a"))).toBe("osc.yaml");
  });

  test("group over the base (spec and status entries alike), node over group, force over all", () => {
    const g = layered({ pool: "x", gpu: "true" });
    expect(filesOf(g.osc)).toMatchObject({ "/etc/a": "group a", "/etc/ext": "group ext", "/etc/b": "base b" });
    expect(g.osc.spec.units?.find((u) => u.name === "kubelet.service")?.content).toContain("--gpu");
    expect(g.provenance.get(unitEntry("kubelet.service"))).toBe("overlay-gpu.yaml (group)");
    expect(g.osc.status?.extensionFiles).toEqual([]); // moved to spec with the overlay's content
    const n = layered({ gpu: "true", "kubernetes.io/hostname": "n1", freeze: "" });
    expect(filesOf(n.osc)).toMatchObject({ "/etc/a": "node a", "/etc/b": "forced b" });
    expect(n.provenance.get(fileEntry("/etc/a"))).toBe("overlay-n1.yaml (node)");
    expect(n.provenance.get(fileEntry("/etc/b"))).toBe("overlay-freeze.yaml (force)");
    expect(n.matched.map((o) => o.key)).toEqual(["overlay-freeze.yaml", "overlay-gpu.yaml", "overlay-n1.yaml"]);
  });

  test("two overlays of the same rank: identical entries are fine, differing ones are a conflict naming both", () => {
    const same = overlays({
      "overlay-a.yaml": "rank: group\nselector: sel-x\nfiles:\n  - {path: /etc/a, content: {inline: {data: same}}}\n",
      "overlay-b.yaml": "rank: group\nselector: sel-y\nfiles:\n  - {path: /etc/a, content: {inline: {data: same}}}\n",
    });
    expect(layerOsc(base, same, { "sel-x": "", "sel-y": "" }, src).ok).toBe(true);
    const differing = overlays({
      "overlay-a.yaml": "rank: group\nselector: sel-x\nfiles:\n  - {path: /etc/a, content: {inline: {data: one}}}\n",
      "overlay-b.yaml": "rank: group\nselector: sel-y\nfiles:\n  - {path: /etc/a, content: {inline: {data: two}}}\n",
    });
    expect(layerOsc(base, differing, { "sel-x": "" }, src).ok).toBe(true); // only one matches
    expect(layerOsc(base, differing, { "sel-x": "", "sel-y": "" }, src)).toEqual({
      ok: false,
      errors: [`${src}: file /etc/a is defined differently by overlay-a.yaml (group) and overlay-b.yaml (group), all of rank group: conflicting overlays`],
    });
  });

  test("the checksum is Gardener's without a matching overlay, and changes with each matching one", () => {
    const bytes = enc("osc bytes");
    expect(layeredChecksum(bytes, [])).toBe(sha256Hex(bytes));
    const g = layered({ gpu: "true" }).matched;
    const gn = layered({ gpu: "true", "kubernetes.io/hostname": "n1" }).matched;
    expect(new Set([layeredChecksum(bytes, []), layeredChecksum(bytes, g), layeredChecksum(bytes, gn)]).size).toBe(3);
    expect(layeredChecksum(bytes, g)).toBe(layeredChecksum(bytes, layered({ gpu: "true" }).matched));
  });

  test("property: every entry once, from the highest-ranked matching layer that defines it, and provenance says which", () => {
    const rand = prng(11);
    const ranks = ["fallback", "group", "node", "force"] as const;
    const order = ["fallback", "osc.yaml", "group", "node", "force"];
    for (let round = 0; round < 300; round++) {
      const docs: Record<string, string> = {};
      for (let i = 0; i < 1 + rand.int(5); i++) {
        const rank = rand.pick(ranks);
        const paths = rand.subset(["/etc/a", "/etc/b", "/etc/c", "/etc/d"]);
        docs[`overlay-l${i}.yaml`] = `rank: ${rank}\nselector: l${i}\nfiles:\n${paths.map((p) => `  - {path: ${p}, content: {inline: {data: "${rank} ${i}"}}}`).join("\n")}\n`;
      }
      const parsed = overlays(docs);
      const labels = Object.fromEntries(parsed.filter(() => rand.chance(0.6)).map((o) => [o.selector.text, ""]));
      const r = layerOsc(base, parsed, labels, src);
      if (!r.ok) {
        expect(r.errors.join()).toContain("conflicting overlays");
        continue;
      }
      const result = [...(r.value.osc.spec.files ?? []), ...(r.value.osc.status?.extensionFiles ?? [])];
      expect(new Set(result.map((f) => f.path)).size).toBe(result.length);
      for (const f of result) {
        const from = r.value.provenance.get(fileEntry(f.path)) as string;
        const rankOf = (layer: string) => order.indexOf(layer === "osc.yaml" ? "osc.yaml" : (/\((\w+)\)$/.exec(layer)?.[1] as string));
        const candidates = [
          ...(base.spec.files ?? []).concat(base.status?.extensionFiles ?? []).filter((b) => b.path === f.path).map(() => "osc.yaml"),
          ...r.value.matched.filter((o) => o.files.some((x) => x.path === f.path)).map((o) => `${o.key} (${o.rank})`),
        ];
        expect(rankOf(from)).toBe(Math.max(...candidates.map(rankOf)));
      }
    }
  });
});
