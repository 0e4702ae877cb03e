import { expect, test } from "bun:test";
import { closeSync, mkdtempSync, openSync, readFileSync, statSync, writeFileSync } from "node:fs";
import { createLogger, describeError } from "../../src/log.ts";
import { runDir } from "../harness/exec.ts";

test("one JSON object per line, with base fields, below-level lines dropped", () => {
  const lines: string[] = [];
  const log = createLogger({ level: "info", write: (l) => lines.push(l) }).with({ controller: "osc" });
  log.debug("hidden");
  log.info("applied", { checksum: "abc" });
  log.error("failed", { err: new Error("outer", { cause: new Error("inner") }) });
  expect(lines).toHaveLength(2);
  const [a, b] = lines.map((l) => JSON.parse(l));
  expect(a).toMatchObject({ level: "info", msg: "applied", controller: "osc", checksum: "abc" });
  expect(typeof a.ts).toBe("string");
  expect(b).toMatchObject({ level: "error", err: "outer: inner" });
});

test("logFormat text: time, level, message and the fields as JSON, tab-separated, one line each (zap's console encoder)", () => {
  const lines: string[] = [];
  const log = createLogger({ format: "text", write: (l) => lines.push(l) }).with({ controller: "osc" });
  log.warn("configuration field not acted on", { field: "logFormat" });
  createLogger({ format: "text", write: (l) => lines.push(l) }).error("two\nlines");
  const [a, b] = lines.map((l) => l.split("\t"));
  expect(a?.[0]).toMatch(/^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$/);
  expect(a?.slice(1)).toEqual(["WARN", "configuration field not acted on", '{"controller":"osc","field":"logFormat"}']);
  // No fields, no fourth column; a line break in the message stays in the one line.
  expect(b?.slice(1)).toEqual(["ERROR", "two\\nlines"]);
});

test("a cause already quoted in the message is not repeated", () => {
  expect(describeError(new Error("reading x: boom", { cause: new Error("boom") }))).toBe("reading x: boom");
});

test("setLevel changes the level of the logger and of every logger made from it with `with` (SIGHUP)", () => {
  const lines: string[] = [];
  const root = createLogger({ level: "info", write: (l) => lines.push(l) });
  const child = root.with({ controller: "osc" });
  child.debug("hidden");
  root.setLevel("debug");
  child.debug("shown");
  child.setLevel("error");
  root.info("hidden too");
  root.error("kept");
  expect(lines.map((l) => JSON.parse(l).msg)).toEqual(["shown", "kept"]);
});

test("lines carry an sd-daemon priority prefix only when stderr is the journal (JOURNAL_STREAM names stderr itself)", async () => {
  const dir = mkdtempSync(`${runDir("log-unit")}/`);
  const script = `${dir}/log.ts`;
  writeFileSync(script, `import { createLogger } from ${JSON.stringify(new URL("../../src/log.ts", import.meta.url).pathname)};\nconst l = createLogger();\nl.info("i");\nl.warn("w");\nl.error("e");\n`);
  const stderrTo = async (name: string, journalStream: (path: string) => string) => {
    const path = `${dir}/${name}`;
    writeFileSync(path, "");
    const out = openSync(path, "a");
    const p = Bun.spawn([process.execPath, script], { stderr: out, env: { ...process.env, JOURNAL_STREAM: journalStream(path) } });
    await p.exited;
    closeSync(out);
    return readFileSync(path, "utf8").split("\n").filter(Boolean).map((l) => l.slice(0, l.indexOf("{")));
  };
  const devIno = (path: string) => `${statSync(path).dev}:${statSync(path).ino}`;
  expect(await stderrTo("journal", devIno)).toEqual(["<6>", "<4>", "<3>"]);
  // A child whose stderr was redirected away from the journal inherited the variable: no prefix.
  expect(await stderrTo("elsewhere", () => devIno(script))).toEqual(["", "", ""]);
});
