// src/controllers/osc/parse.ts: osc.yaml is parsed once per content; a restarted agent reads the kept
// parse of an unchanged Secret instead of parsing YAML again, and only what JSON holds exactly is kept.
import { describe, expect, test } from "bun:test";
import { mkdtempSync, readFileSync, writeFileSync } from "node:fs";
import { oscChecksum } from "../../src/api/desired.ts";
import { createOscParser, jsonExact } from "../../src/controllers/osc/parse.ts";
import { createFiles } from "../../src/host/files.ts";
import { createLogger } from "../../src/log.ts";
import { runDir } from "../harness/exec.ts";

const base = runDir("osc-parse");
const kept = "/var/lib/trellis-test/parsed-osc.json";
const osc = readFileSync(new URL("../fixtures/web-osc.yaml", import.meta.url));
const withPlugin = (value: string) =>
  new TextEncoder().encode(`${new TextDecoder().decode(osc)}\n  criConfig:\n    name: containerd\n    containerd:\n      plugins:\n      - path: [a]\n        values: {since: ${value}}\n`);

function fresh() {
  const root = mkdtempSync(`${base}/root-`);
  const lines: string[] = [];
  const log = createLogger({ level: "warn", write: (l: string) => lines.push(l) });
  const parser = () => {
    const p = createOscParser({ files: createFiles(root), path: kept, log });
    // As the OSC controller does: parsed, then kept once applied.
    return async (bytes: Uint8Array, checksum: string, source: string) => {
      const r = await p.parse(bytes, checksum, source);
      await p.keep(checksum);
      return r;
    };
  };
  return { root, lines, parser };
}

describe("parsing osc.yaml", () => {
  test("nothing is kept until it was applied", async () => {
    const { root } = fresh();
    const p = createOscParser({ files: createFiles(root), path: kept, log: createLogger({ level: "error" }) });
    expect((await p.parse(osc, oscChecksum(osc), "s")).ok).toBe(true);
    expect(Bun.file(`${root}${kept}`).size).toBe(0);
    await p.keep("another checksum");
    expect(Bun.file(`${root}${kept}`).size).toBe(0);
    await p.keep(oscChecksum(osc));
    expect(Bun.file(`${root}${kept}`).size).toBeGreaterThan(0);
  });

  test("the same bytes twice before they are kept: one parse, the same result", async () => {
    const { root } = fresh();
    const p = createOscParser({ files: createFiles(root), path: kept, log: createLogger({ level: "error" }) });
    const first = await p.parse(osc, oscChecksum(osc), "s");
    expect(first.ok).toBe(true);
    expect(await p.parse(osc, oscChecksum(osc), "s")).toBe(first);
  });

  test("once kept, the parse is not held: the same checksum is read from the kept file, with or without the bytes", async () => {
    const { root } = fresh();
    const p = createOscParser({ files: createFiles(root), path: kept, log: createLogger({ level: "error" }) });
    expect(p.kept()).toBeUndefined();
    await p.parse(osc, oscChecksum(osc), "s");
    await p.keep(oscChecksum(osc));
    expect(p.kept()).toBe(oscChecksum(osc));
    const doc = JSON.parse(readFileSync(`${root}${kept}`, "utf8"));
    doc.osc.spec.files[0].path = "/etc/from-the-kept-parse";
    writeFileSync(`${root}${kept}`, JSON.stringify(doc));
    for (const bytes of [osc, undefined]) {
      const again = await p.parse(bytes, oscChecksum(osc), "s");
      expect(again?.ok && again.value.spec.files?.[0]?.path).toBe("/etc/from-the-kept-parse");
    }
    // Without the bytes, another checksum (or a kept file that is gone) has no parse: the caller reads the Secret again.
    expect(await p.parse(undefined, "another checksum", "s")).toBeUndefined();
    writeFileSync(`${root}${kept}`, "{");
    expect(await p.parse(undefined, oscChecksum(osc), "s")).toBeUndefined();
    expect(p.kept()).toBeUndefined();
  });

  test("a restarted agent takes the kept parse of the same checksum (validated again), and parses anything else", async () => {
    const { root, parser } = fresh();
    await parser()(osc, oscChecksum(osc), "s");
    expect(readFileSync(`${root}${kept}`).length).toBeGreaterThan(0);
    // Mark the kept parse: a result carrying the mark was read from it, not parsed from the YAML.
    const doc = JSON.parse(readFileSync(`${root}${kept}`, "utf8"));
    doc.osc.spec.files[0].path = "/etc/from-the-kept-parse";
    writeFileSync(`${root}${kept}`, JSON.stringify(doc));
    const again = await parser()(osc, oscChecksum(osc), "s");
    expect(again.ok && again.value.spec.files?.[0]?.path).toBe("/etc/from-the-kept-parse");
    const other = withPlugin('"x"');
    const parsed = await parser()(other, oscChecksum(other), "s");
    expect(parsed.ok && parsed.value.spec.files?.[0]?.path).not.toBe("/etc/from-the-kept-parse");
    expect(JSON.parse(readFileSync(`${root}${kept}`, "utf8")).checksum).toBe(oscChecksum(other)); // kept in its turn, a string in the plugin's values
  });

  test("what the parse did not read is kept with it: a restarted agent reports it again", async () => {
    const { root, parser } = fresh();
    const unknown = new TextEncoder().encode(`${new TextDecoder().decode(osc)}\nfutureField: 1\n`);
    const first = await parser()(unknown, oscChecksum(unknown), "s");
    expect(first.ok && first.ignored).toEqual([expect.stringContaining("s: futureField: not a field of Gardener")]);
    expect(JSON.parse(readFileSync(`${root}${kept}`, "utf8")).ignored).toEqual(first.ok ? first.ignored : []);
    const again = await parser()(unknown, oscChecksum(unknown), "s");
    expect(again.ok && again.ignored).toEqual(first.ok ? first.ignored : []);
  });

  test.each([["not JSON", "{"], ["an OSC the schema refuses", JSON.stringify({ version: 1, checksum: "c", osc: { kind: "nope" } })]])("a kept parse that is %s is ignored with a warning", async (_, content) => {
    const { root, lines, parser } = fresh();
    await parser()(osc, oscChecksum(osc), "s");
    writeFileSync(`${root}${kept}`, content.replace('"c"', JSON.stringify(oscChecksum(osc))));
    expect((await parser()(osc, oscChecksum(osc), "s")).ok).toBe(true);
    expect(lines.join("\n")).toContain("ignoring the kept parse of the OSC");
  });

  test("an OSC JSON would change (YAML 1.1's infinity in a plugin's values) is not kept", async () => {
    const { root, parser } = fresh();
    const dated = withPlugin(".inf");
    const r = await parser()(dated, oscChecksum(dated), "s");
    expect(r.ok).toBe(true);
    expect(Bun.file(`${root}${kept}`).size).toBe(0);
  });

  test("invalid OSCs are not kept, and say what is wrong each time", async () => {
    const { root, parser } = fresh();
    const bad = new TextEncoder().encode("kind: [");
    const r = await parser()(bad, oscChecksum(bad), "s");
    expect(r.ok).toBe(false);
    expect(Bun.file(`${root}${kept}`).size).toBe(0);
  });
});

test("jsonExact", () => {
  for (const ok of [null, "s", 1, 0, true, [], {}, { a: [1, { b: null }] }]) expect(jsonExact(ok)).toBe(true);
  for (const no of [new Date(), -0, Number.NaN, Number.POSITIVE_INFINITY, { a: undefined }, [undefined], new Uint8Array(1), new Map(), 1n, Object.create(null)]) expect(jsonExact(no)).toBe(false);
});
