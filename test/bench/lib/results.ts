// Where benchmark results go: JSON on stdout (so `| jq` works) and test/bench/results/<name>-<date>.json,
// so that later runs can be compared.
import { mkdirSync, writeFileSync } from "node:fs";

/** Prints `result` and writes it for the day `date` (YYYY-MM-DD); returns the file's path in the repo. */
export function saveResult(name: string, result: unknown, date: string): string {
  const json = JSON.stringify(result, null, 2);
  console.log(json);
  const dir = new URL("../results/", import.meta.url).pathname;
  mkdirSync(dir, { recursive: true });
  writeFileSync(`${dir}${name}-${date}.json`, `${json}\n`);
  return `test/bench/results/${name}-${date}.json`;
}
