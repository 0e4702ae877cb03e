// The control-plane and environment fault scenarios of test/chaos/scenarios (lib-control-plane.ts) at their
// bounded counts: each injects its fault against the compiled agent on a real node and a real control plane.
// `bun run chaos <id>` runs the same code at the long counts docs/reliability.md reports.
import { expect, test } from "bun:test";
import type { Scenario } from "../chaos/scenario.ts";
import { scenario as apiserverDown } from "../chaos/scenarios/apiserver-down.ts";
import { scenario as clockJump } from "../chaos/scenarios/clock-jump.ts";
import { scenario as etcdDown } from "../chaos/scenarios/etcd-down.ts";
import { scenario as hostnameChange } from "../chaos/scenarios/hostname-change.ts";
import { scenario as registryDown } from "../chaos/scenarios/registry-down.ts";

async function runBounded(s: Scenario): Promise<void> {
  const lines: string[] = [];
  const r = await s.run({ long: false, log: (l) => lines.push(l) });
  if (r.passed !== r.iterations) console.log(`${s.id}:\n${lines.join("\n")}\n${r.failures.join("\n")}`);
  console.log(`${s.id}: ${r.passed}/${r.iterations} ${JSON.stringify(r.figures)}`);
  expect(r.failures).toEqual([]);
  expect(r.passed).toBe(r.iterations);
}

test("kube-apiserver down and back (the Secret changed after, and through a second API server during the outage)", () => runBounded(apiserverDown), 180_000);
test("etcd down and back", () => runBounded(etcdDown), 180_000);
test("the registry down and back with an imageRef pending", () => runBounded(registryDown), 180_000);
test("the agent's clock jumping an hour forward and back", () => runBounded(clockJump), 180_000);
test("the node's hostname changed", () => runBounded(hostnameChange), 180_000);
