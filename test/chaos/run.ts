// `bun run chaos [id…]`: every scenario under test/chaos/scenarios/ (or the ones named) at its long counts,
// one after the other against real components; prints the table docs/reliability.md carries and saves it as
// test/chaos/results/chaos-<date>.json. Exit status 1 when any iteration failed.
import { mkdirSync, readdirSync, writeFileSync } from "node:fs";
import type { Scenario, ScenarioResult } from "./scenario.ts";

const dir = new URL("./scenarios/", import.meta.url).pathname;
const wanted = new Set(process.argv.slice(2));
const files = readdirSync(dir).filter((f) => f.endsWith(".ts")).sort();
const scenarios: Scenario[] = [];
for (const f of files) {
  const mod = (await import(`${dir}${f}`)) as { scenario?: Scenario };
  if (!mod.scenario) throw new Error(`${f} exports no \`scenario\``);
  if (wanted.size === 0 || wanted.has(mod.scenario.id)) scenarios.push(mod.scenario);
}
for (const id of wanted) if (!scenarios.some((s) => s.id === id)) throw new Error(`no scenario ${id}; known: ${files.join(", ")}`);

type Row = ScenarioResult & { id: string; fault: string; seconds: number; error?: string };
const rows: Row[] = [];
for (const s of scenarios) {
  const started = performance.now();
  const log = (line: string) => console.log(`[${s.id}] ${line}`);
  log("start");
  try {
    const r = await s.run({ long: true, log });
    rows.push({ id: s.id, fault: s.fault, ...r, seconds: Math.round((performance.now() - started) / 1000) });
  } catch (err) {
    const error = err instanceof Error ? (err.stack ?? err.message) : String(err);
    rows.push({ id: s.id, fault: s.fault, checked: "(the scenario itself failed)", iterations: 0, passed: 0, failures: [error], figures: {}, seconds: Math.round((performance.now() - started) / 1000), error });
  }
  log(`done: ${rows.at(-1)?.passed}/${rows.at(-1)?.iterations}`);
}

const figures = (f: Record<string, number>) => Object.entries(f).map(([k, v]) => `${k} ${v}`).join(", ");
console.log("\n| fault | what was checked | runs | result | figures | time |\n|---|---|---|---|---|---|");
for (const r of rows) {
  console.log(`| ${r.fault} | ${r.checked} | ${r.iterations} | ${r.passed}/${r.iterations} passed | ${figures(r.figures)} | ${r.seconds} s |`);
}
for (const r of rows) for (const f of r.failures) console.log(`FAILED ${r.id}: ${f}`);

const results = new URL("./results/", import.meta.url).pathname;
mkdirSync(results, { recursive: true });
const file = `${results}chaos-${new Date().toISOString().slice(0, 10)}.json`;
writeFileSync(file, `${JSON.stringify({ ranAt: new Date().toISOString(), scenarios: rows }, null, 2)}\n`);
console.log(`saved ${file}`);
process.exit(rows.every((r) => r.passed === r.iterations && r.iterations > 0) ? 0 : 1);
