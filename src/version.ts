import pkg from "../package.json" with { type: "json" };

// Set by build/compile.ts; absent when the source runs directly (bun run, deno run).
declare const TRELLIS_COMMIT: string | undefined;
declare const TRELLIS_VERSION: string | undefined;

export const version: string = typeof TRELLIS_VERSION === "string" ? TRELLIS_VERSION : pkg.version;
export const commit: string = typeof TRELLIS_COMMIT === "string" ? TRELLIS_COMMIT : "unknown (not a release build)";
