// bun run parity [-- --steps id,id,...]
// The differential test of trellis against gardener-node-agent, every step (test/parity/steps.ts), on twin
// nodes (test/parity/twins.ts); writes test/parity/results/parity-<date>.json (every step, outcome and
// classified difference) and parity-<date>.txt (the readable summary, also printed on stderr).
// Exits 1 when a difference is not deliberate.
import { mkdirSync, writeFileSync } from "node:fs";
import { parseArgs } from "node:util";
import { runParity, summarise } from "./run.ts";
import { selectSteps, steps } from "./steps.ts";
import { startTwins } from "./twins.ts";

const { values: args } = parseArgs({ options: { steps: { type: "string" } } });
const chosen = args.steps ? selectSteps(args.steps.split(",")) : steps;
const t0 = performance.now();
const progress = (msg: string) => console.error(`[${((performance.now() - t0) / 1000).toFixed(1).padStart(7)} s] ${msg}`);

progress(`starting the twin nodes (${chosen.length} steps to run)`);
const world = await startTwins();
let report;
try {
  report = await runParity(world, chosen, progress);
} finally {
  await world.stop();
}
const date = new Date().toISOString().slice(0, 10);
const dir = new URL("./results/", import.meta.url).pathname;
mkdirSync(dir, { recursive: true });
const versions = Object.fromEntries(Object.values(world.twins).map((t) => [t.side, t.agent.version]));
writeFileSync(`${dir}parity-${date}.json`, `${JSON.stringify({ date, versions, seconds: Math.round((performance.now() - t0) / 1000), ...report }, null, 2)}\n`);
const summary = summarise(report);
writeFileSync(`${dir}parity-${date}.txt`, `${summary}\n`);
console.error(`${summary}\nwritten to test/parity/results/parity-${date}.json and .txt`);
process.exit(report.failing > 0 ? 1 : 0);
