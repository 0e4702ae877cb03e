import { expect, test } from "bun:test";
import { createLogger, describeError } from "../../src/log.ts";

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

test("a cause already quoted in the message is not repeated", () => {
  expect(describeError(new Error("reading x: boom", { cause: new Error("boom") }))).toBe("reading x: boom");
});
