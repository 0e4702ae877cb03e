// The backstop of test/harness/cleanup.ts under `bun test` itself: a hook a test file registered and never
// cleared (its teardown never ran) still runs when the test process ends.
import { expect, test } from "bun:test";
import { existsSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { repoRoot } from "../harness/binary.ts";
import { run } from "../harness/exec.ts";

test("an atExit hook left by a test file runs when bun test ends", async () => {
  const dir = mkdtempSync(`${tmpdir()}/trellis-backstop-`);
  try {
    const marker = `${dir}/hook-ran`;
    writeFileSync(
      `${dir}/leaves-a-hook.test.ts`,
      `import { test } from "bun:test";
import { writeFileSync } from "node:fs";
import { atExit } from "${repoRoot}/test/harness/cleanup.ts";
test("registers a hook and never clears it", () => { atExit(() => writeFileSync(${JSON.stringify(marker)}, "ran")); });
`,
    );
    const r = await run(["bun", "test", `${dir}/leaves-a-hook.test.ts`], { cwd: repoRoot, timeoutMs: 60_000 });
    expect(r.code).toBe(0);
    expect(existsSync(marker)).toBe(true);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
