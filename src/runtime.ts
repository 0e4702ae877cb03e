// The one module that may touch runtime-specific globals (Bun.*, Deno.*): everything else in src/
// uses node: built-ins and web APIs, so the source stays runnable under both Bun and Deno.
type RuntimeGlobals = { Bun?: { version: string }; Deno?: { version: { deno: string } } };
const g = globalThis as RuntimeGlobals;

/** "bun 1.4.5", "deno 2.9.6" or "node 22.x" — for version output and diagnostics. */
export function runtimeName(): string {
  if (g.Bun) return `bun ${g.Bun.version}`;
  if (g.Deno) return `deno ${g.Deno.version.deno}`;
  return `node ${process.versions.node}`;
}
