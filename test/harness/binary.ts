// The compiled agent the e2e tests run. build/test.sh compiles it once before the suite;
// running one e2e file by hand compiles it here if it is missing.
import { existsSync } from "node:fs";
import { commandFor } from "../../build/arch-exec.ts";
import { run, runOk } from "./exec.ts";

export const repoRoot = new URL("../..", import.meta.url).pathname.replace(/\/$/, "");
export const binaryPath = `${repoRoot}/dist/trellis`;

export async function trellisBinary(): Promise<string> {
  if (!existsSync(binaryPath)) await runOk(["bun", "run", "build"], { cwd: repoRoot, timeoutMs: 300_000 });
  return binaryPath;
}

export const arm64BinaryPath = `${repoRoot}/dist/trellis-arm64`;

/** dist/trellis-arm64 built from the same tree as dist/trellis (build/image.ts refuses a pair that is not). */
export async function trellisArm64Binary(): Promise<string> {
  const native = await trellisBinary();
  const same =
    existsSync(arm64BinaryPath) &&
    (await run([...commandFor("arm64", arm64BinaryPath), "version", "--json"])).stdout === (await run([native, "version", "--json"])).stdout;
  if (!same) await runOk(["bun", "run", "build", "--", "--arch", "arm64"], { cwd: repoRoot, timeoutMs: 300_000 });
  return arm64BinaryPath;
}
