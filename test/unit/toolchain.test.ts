// Type checking and Deno compatibility are part of the test suite, so `bun run test` fails on either.
import { expect, test } from "bun:test";
import { repoRoot } from "../harness/binary.ts";
import { run } from "../harness/exec.ts";

const deno = `${repoRoot}/node_modules/.bin/deno`;

test("the whole tree type-checks under strict TypeScript (bun check)", async () => {
  const r = await run(["bun", "check"], { cwd: repoRoot });
  expect(r.stdout + r.stderr).toContain("No type errors");
  expect(r.code).toBe(0);
}, 120_000);

test("src/ type-checks under Deno (deno check)", async () => {
  const r = await run([deno, "check", "src/"], { cwd: repoRoot, env: { ...process.env, NO_COLOR: "1" } as Record<string, string> });
  expect(r.stderr).not.toContain("ERROR");
  expect(r.code).toBe(0);
}, 120_000);

test("`deno run src/main.ts version` prints the version under Deno", async () => {
  const r = await run([deno, "run", "-A", "src/main.ts", "version", "--json"], { cwd: repoRoot });
  expect(r.code).toBe(0);
  expect(JSON.parse(r.stdout)).toMatchObject({ version: expect.any(String), runtime: expect.stringMatching(/^deno /) });
}, 60_000);

test("Bun.* and Deno.* appear in src/ only in src/runtime.ts", async () => {
  const r = await run(["grep", "-rlE", "\\b(Bun|Deno)\\.", "src/"], { cwd: repoRoot });
  expect(r.stdout.trim().split("\n").filter(Boolean)).toEqual(["src/runtime.ts"]);
});

// ICU's collator and time-zone data are pages of the executable that stay resident once touched (about
// 2 and 4 MiB in a compiled Bun binary): the agent orders names by code units (src/api/text-order.ts);
// only maintenance windows need time zones, and only CLI output sorts for people.
test("localeCompare and Intl appear in src/ only where people read the order or windows need time zones", async () => {
  const r = await run(["grep", "-rlE", "localeCompare|\\bIntl\\.", "src/"], { cwd: repoRoot });
  expect(r.stdout.trim().split("\n").filter(Boolean).sort()).toEqual(["src/api/text-order.ts", "src/api/windows.ts", "src/cli/osc-file.ts", "src/cli/rollout.ts"]);
});
