// The compiled trellis side by side with Gardener's gardener-node-agent (test/peer/build.sh), each on its
// own real node against one real kube-apiserver and a real registry, through a bounded part of the
// differential scenario (test/parity/steps.ts: boundedIds; `bun run parity` runs every step and writes the
// report). After each step both nodes are compared; a difference that no row of test/parity/deliberate.ts
// accounts for fails, named with the step and, where it is one, the item of trellis issue 20 it belongs to.
import { afterAll, beforeAll, expect, test } from "bun:test";
import { type Report, runParity, summarise } from "../parity/run.ts";
import { boundedIds, selectSteps } from "../parity/steps.ts";
import { startTwins, type World } from "../parity/twins.ts";

let world: World;
let report: Report;

beforeAll(async () => {
  world = await startTwins();
  report = await runParity(world, selectSteps(boundedIds), (msg) => console.error(`[differential] ${msg}`));
  console.error(summarise(report));
}, 900_000);

afterAll(async () => {
  await world?.stop();
}, 60_000);

test("both agents decide every step (no step times out)", () => {
  const timedOut = report.steps.flatMap((s) => Object.entries(s.outcomes).filter(([, o]) => o.result === "timeout").map(([side, o]) => `${s.id} ${side}: ${o.evidence}`));
  expect(timedOut).toEqual([]);
});

test("the nodes differ only where test/parity/deliberate.ts says trellis differs on purpose", () => {
  const failing = report.steps.flatMap((s) =>
    s.differences.filter((d) => d.first && !d.deliberate).map((d) => `${s.id}: ${d.area} ${d.key}: gna=${d.gna ?? "absent"} trellis=${d.trellis ?? "absent"}${d.issueItem ? ` (issue 20 item ${d.issueItem})` : ""}`),
  );
  expect(failing).toEqual([]);
});
