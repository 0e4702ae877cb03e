// The compiled agent the e2e tests run. build/test.sh compiles it once before the suite;
// running one e2e file by hand compiles it here if it is missing.
import { existsSync } from "node:fs";
import { runOk } from "./exec.ts";

export const repoRoot = new URL("../..", import.meta.url).pathname.replace(/\/$/, "");
export const binaryPath = `${repoRoot}/dist/trellis`;

export async function trellisBinary(): Promise<string> {
  if (!existsSync(binaryPath)) await runOk(["bun", "run", "build"], { cwd: repoRoot, timeoutMs: 300_000 });
  return binaryPath;
}
