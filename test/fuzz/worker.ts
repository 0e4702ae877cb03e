// Runs a range of fuzz cases off the main thread, so that the runner can stop a case that hangs or
// grows without bound and carry on with the next one.
import { createEnv, disposeEnv, runCase } from "./property.ts";
import { generateCase } from "./generate.ts";

export type Job = { seed: number; from: number; to: number };
export type Report =
  | { type: "env"; dir: string }
  | { type: "start"; index: number }
  | { type: "done"; index: number; outcome: string; ms: number; findings: { property: string; detail: string }[] }
  | { type: "end" };

declare const self: Worker;

self.onmessage = async (event: MessageEvent<Job>) => {
  const { seed, from, to } = event.data;
  const env = createEnv();
  self.postMessage({ type: "env", dir: env.dir } satisfies Report);
  try {
    for (let index = from; index < to; index++) {
      self.postMessage({ type: "start", index } satisfies Report);
      const result = await runCase(generateCase(seed, index), env);
      self.postMessage({ type: "done", index, outcome: result.outcome, ms: result.ms, findings: result.findings } satisfies Report);
    }
  } finally {
    disposeEnv(env);
  }
  self.postMessage({ type: "end" } satisfies Report);
};
