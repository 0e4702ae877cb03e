// The shape every fault-injection scenario has, so one runner (`bun run chaos`, test/chaos/run.ts) and the
// bounded e2e tests of `bun run test` drive the same code: the e2e tests with `long: false` (CI counts), the
// runner with `long: true` (the counts docs/reliability.md reports).

export type ScenarioOptions = {
  /** The long run of `bun run chaos` (true) or the bounded one of the e2e suite (false). */
  long: boolean;
  /** Progress lines; the runner prints them, the e2e tests keep them for a failure message. */
  log: (line: string) => void;
};

export type ScenarioResult = {
  /** One sentence: what the scenario checked, as the docs table states it. */
  checked: string;
  /** How often the fault was injected. */
  iterations: number;
  /** Iterations after which every check held. */
  passed: number;
  /** One line per iteration where a check failed: which one and what was seen. */
  failures: string[];
  /** Measured figures worth reporting (e.g. reconnectMs), by name; plain numbers, units in the name. */
  figures: Record<string, number>;
};

export type Scenario = {
  /** Stable id, also the file name under test/chaos/scenarios/ (e.g. "apiserver-down"). */
  id: string;
  /** The fault, in a few words, as the docs table's first column. */
  fault: string;
  run(o: ScenarioOptions): Promise<ScenarioResult>;
};
