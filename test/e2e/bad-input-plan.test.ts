// The bad-input corpus (test/fixtures/bad-input) through the compiled `trellis plan --root`, offline:
// a machine image holding the last good state (the web OSC's files and units), and every case refused
// with exit code 1 and an error naming the file and the field, within a time and memory bound, with
// not one byte changed under the root and no throwaway image cache left behind.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { mkdirSync, readdirSync, readFileSync, writeFileSync } from "node:fs";
import { dirname } from "node:path";
import { type DesiredFile, parseOsc, resolveDesired } from "../../src/api/desired.ts";
import { dropInPath, paths, unitFilePath } from "../../src/api/paths.ts";
import { type BadCase, type CaseVars, loadBadCases, pushBadInputImages, writeCaseFile } from "../harness/bad-input.ts";
import { trellisBinary } from "../harness/binary.ts";
import { run, runDir } from "../harness/exec.ts";
import { fingerprint } from "../harness/fingerprint.ts";
import { type Registry, startRegistry } from "../harness/registry.ts";

/** Bounds per case: the slowest case (a missing or tampered image) takes about 1.2 s, the largest (aliases of a 512 KB string) 66 MB on this 2-core machine. */
const maxSeconds = 10;
const maxRssMb = 250;

const base = runDir("bad-input-plan");
const root = `${base}/root`;
const tmp = `${base}/tmp`;
const goodOsc = readFileSync(new URL("../fixtures/web-osc.yaml", import.meta.url), "utf8");
const cases = loadBadCases().filter((c) => c.only !== "agent");
let registry: Registry;
let vars: CaseVars;
let before: string[];
const measured: { name: string; seconds: number; rssMb: number }[] = [];

/** The last good state as the agent left it: the web OSC's files, unit files and drop-ins, last-applied-osc.yaml. */
function writeLastGoodState(): void {
  const osc = parseOsc(goodOsc, "web-osc.yaml");
  if (!osc.ok) throw new Error(osc.errors.join("\n"));
  const desired = resolveDesired(osc.value, { hostName: "corpus", secrets: new Map(), images: new Map(), source: "web-osc.yaml" });
  if (!desired.ok) throw new Error(desired.errors.join("\n"));
  const put = (path: string, content: string | Uint8Array, mode: number) => {
    mkdirSync(dirname(`${root}${path}`), { recursive: true });
    writeFileSync(`${root}${path}`, content, { mode });
  };
  for (const f of desired.value.files) put(f.path, f.content as Exclude<DesiredFile["content"], { copyFrom: string }>, f.mode);
  for (const u of desired.value.units) {
    put(unitFilePath(u.name), u.content ?? "", 0o644);
    for (const d of u.dropIns) put(dropInPath(u.name, d.name), d.content, 0o644);
  }
  put(paths.lastAppliedOsc, goodOsc, 0o600);
}

async function plan(file: string) {
  const time = `${base}/time`;
  const started = performance.now();
  const r = await run(["/usr/bin/time", "-f", "%M", "-o", time, await trellisBinary(), "plan", "--root", root, "--osc", file, "--hostname", "corpus", "--labels", "kubernetes.io/hostname=corpus"], {
    env: { ...(process.env as Record<string, string>), TMPDIR: tmp },
    timeoutMs: maxSeconds * 1000,
  });
  return { ...r, seconds: (performance.now() - started) / 1000, rssMb: Number(readFileSync(time, "utf8").trim().split("\n").at(-1)) / 1024 };
}

beforeAll(async () => {
  registry = await startRegistry();
  await pushBadInputImages(registry, base);
  vars = { registry: registry.host };
  mkdirSync(tmp);
  writeLastGoodState();
  before = fingerprint(root);
}, 60_000);
afterAll(async () => {
  await registry?.stop();
  const worst = (key: "seconds" | "rssMb") => measured.reduce((a, b) => (b[key] > a[key] ? b : a), measured[0] ?? { name: "-", seconds: 0, rssMb: 0 });
  if (measured.length > 0) console.log(`bad-input plan: ${measured.length} cases, slowest ${worst("seconds").name} ${worst("seconds").seconds.toFixed(2)} s, largest ${worst("rssMb").name} ${worst("rssMb").rssMb.toFixed(0)} MB`);
});

describe("trellis plan refuses every bad input and changes nothing", () => {
  test("the corpus: at least 60 distinct classes", () => {
    const all = loadBadCases();
    expect(new Set(all.map((c) => c.class)).size).toBe(all.length);
    expect(all.length).toBeGreaterThanOrEqual(60);
  });

  test("control: the last good OSC plans on that root", async () => {
    writeFileSync(`${base}/good.yaml`, goodOsc);
    const r = await plan(`${base}/good.yaml`);
    expect(r.stderr).toBe("");
    expect([0, 3]).toContain(r.code);
    expect(fingerprint(root)).toEqual(before);
  });

  test.each(cases.map((c) => [c.name, c] as [string, BadCase]))("%s", async (_name, c) => {
    const file = `${base}/${c.name}.yaml`;
    writeCaseFile(c, vars, file);
    const r = await plan(file);
    measured.push({ name: c.name, seconds: r.seconds, rssMb: r.rssMb });
    expect({ code: r.code, stdout: r.stdout }).toEqual({ code: 1, stdout: "" });
    expect(r.stderr).toContain(`${file}: `);
    expect(r.stderr).toContain(c.field);
    if (c.error) expect(r.stderr).toMatch(c.error);
    expect(r.seconds).toBeLessThan(maxSeconds);
    expect(r.rssMb).toBeLessThan(maxRssMb);
    expect(fingerprint(root)).toEqual(before);
    expect(readdirSync(tmp)).toEqual([]);
  });
});
