// bun run build [-- --arch x64|arm64] [--outfile PATH] [--version V] [--readable] [--exec-argv ARGS] [--jit-policy N] [--runtime-env "K=V;K=V" [--unchecked-runtime-env]]
// Compiles src/main.ts into one self-contained executable (dist/trellis, or dist/trellis-arm64).
// Flags and why (README "How the binary is built"): no .env/bunfig autoload (a node agent must not read ./.env from its
// working directory), x11 external (dbus-next's optional X11 address module), bytecode + ESM for
// start-up time, minify with kept names (class names appear in errors), and code splitting, so that
// a module the agent imports dynamically (what only some nodes run) is loaded only when it is imported
// and costs no memory otherwise (without splitting Bun evaluates it at start). --readable keeps identifiers and line breaks (and
// changes nothing else), so that a CPU profile of the binary names trellis's own functions
// (test/bench/profile.ts). --exec-argv (space-separated runtime flags, e.g. "--smol"), --jit-policy and
// --runtime-env (the variables `trellis run` executes itself with, src/runtime-env.ts; "" for none)
// replace what is baked into the executable (runtimeExecArgv and runtimeEnv below; the benchmark
// test/bench/runtime-knobs.ts and the e2e tests build their variants this way).
import { execFileSync } from "node:child_process";
import { rmSync } from "node:fs";
import { resolve } from "node:path";
import { parseArgs } from "node:util";
import pkg from "../package.json" with { type: "json" };

const { values } = parseArgs({
  options: {
    arch: { type: "string", default: process.arch === "arm64" ? "arm64" : "x64" },
    outfile: { type: "string" },
    // A release pipeline stamps the version it tags; package.json's otherwise.
    version: { type: "string", default: pkg.version },
    readable: { type: "boolean", default: false },
    "exec-argv": { type: "string" },
    "jit-policy": { type: "string", default: "1" },
    "runtime-env": { type: "string" },
    // Only for the test that proves a refused variable does not crash-loop the agent.
    "unchecked-runtime-env": { type: "boolean", default: false },
  },
});
// The runtime flags every start of the executable gets (process.execArgv). docs/benchmarks.md
// ("Bun's runtime knobs") has the figures that chose them.
const runtimeExecArgv: string[] = ["--smol"];
const execArgv = values["exec-argv"] === undefined ? runtimeExecArgv : values["exec-argv"].split(" ").filter(Boolean);
// The variables `trellis run` executes itself with (src/runtime-env.ts), chosen the same way.
const runtimeEnv: Record<string, string> = { MIMALLOC_PURGE_HOLES_MIN_INTERVAL: "10000", BUN_JSC_useFTLJIT: "false" };
const env = values["runtime-env"] === undefined ? runtimeEnv : parseRuntimeEnv(values["runtime-env"]);
function parseRuntimeEnv(spec: string): Record<string, string> {
  const out: Record<string, string> = {};
  for (const part of spec.split(";").filter(Boolean)) {
    const m = /^([A-Za-z_][A-Za-z0-9_]*)=(.*)$/s.exec(part);
    if (!m) throw new Error(`--runtime-env: ${JSON.stringify(part)} is not NAME=value`);
    out[m[1] as string] = m[2] as string;
  }
  return out;
}
const jitPolicy = Number(values["jit-policy"]);
if (!(jitPolicy >= 1 && Number.isFinite(jitPolicy))) throw new Error(`--jit-policy must be a number >= 1, not ${values["jit-policy"]}`);
const version = values.version;
if (!/^\d+\.\d+\.\d+(-[0-9A-Za-z.-]+)?$/.test(version)) throw new Error(`--version must be a semantic version like 1.2.3, not ${version}`);
const arch = values.arch;
if (arch !== "x64" && arch !== "arm64") throw new Error(`--arch must be x64 or arm64, not ${arch}`);
const native = arch === (process.arch === "arm64" ? "arm64" : "x64");
const outfile = values.outfile ?? (native && arch === "x64" ? "dist/trellis" : `dist/trellis-${arch}`);

const root = new URL("..", import.meta.url).pathname;
function git(...args: string[]): string {
  try {
    return execFileSync("git", args, { cwd: root, encoding: "utf8", stdio: ["ignore", "pipe", "ignore"] }).trim();
  } catch {
    return "";
  }
}
const head = git("rev-parse", "HEAD");
const dirty = head !== "" && git("status", "--porcelain", "--untracked-files=no") !== "";
const commit = head === "" ? "unknown" : `${head}${dirty ? "-dirty" : ""}`;

const t0 = performance.now();
const result = await Bun.build({
  entrypoints: [`${root}src/main.ts`],
  compile: { target: `bun-linux-${arch}`, outfile: resolve(root, outfile), autoloadDotenv: false, autoloadBunfig: false, execArgv, jitPolicy },
  format: "esm",
  splitting: true,
  bytecode: true,
  minify: values.readable ? { syntax: true, keepNames: true } : { whitespace: true, syntax: true, identifiers: true, keepNames: true },
  external: ["x11"],
  define: { TRELLIS_COMMIT: JSON.stringify(commit), TRELLIS_VERSION: JSON.stringify(version), TRELLIS_RUNTIME_ENV: JSON.stringify(JSON.stringify(env)) },
});
for (const log of result.logs) console.error(String(log));
if (!result.success) {
  console.error("build failed");
  process.exit(1);
}
// The runtime refuses a JavaScriptCore option it does not know (exit 1 before any JavaScript runs):
// a native build starts itself once with its variables, so a Bun upgrade that dropped a name fails here
// and not on the nodes (where the agent would fall back to running without them, src/runtime-env.ts).
if (native && Object.keys(env).length > 0 && !values["unchecked-runtime-env"]) {
  const check = Bun.spawnSync([resolve(root, outfile), "version"], { env: { ...process.env, ...env }, stdout: "ignore", stderr: "pipe" });
  if (check.exitCode !== 0) {
    console.error(`build failed: ${outfile} refuses its runtime variables (exit ${check.exitCode}): ${check.stderr.toString().trim().split("\n")[0]}`);
    rmSync(resolve(root, outfile), { force: true });
    process.exit(1);
  }
}
console.log(
  `built ${outfile} (trellis ${version}, commit ${commit}, linux-${arch}${execArgv.length > 0 ? `, runtime flags ${execArgv.join(" ")}` : ""}${jitPolicy !== 1 ? `, JIT policy ${jitPolicy}` : ""}${Object.keys(env).length > 0 ? `, runtime env ${Object.entries(env).map(([k, v]) => `${k}=${v}`).join(" ")}` : ""}) in ${Math.round(performance.now() - t0)} ms`,
);
