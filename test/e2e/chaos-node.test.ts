// Node faults of issue 12 (test/chaos/scenarios: agent-kill9, agent-sigterm, dbus-restart, disk-full) at
// their bounded counts: the compiled agent under its systemd unit on a real node, a real API server.
// `bun run chaos` runs the same scenarios at their long counts (docs table).
import { expect, test } from "bun:test";
import type { Scenario } from "../chaos/scenario.ts";
import { scenario as kill9 } from "../chaos/scenarios/agent-kill9.ts";
import { scenario as sigterm } from "../chaos/scenarios/agent-sigterm.ts";
import { scenario as dbus } from "../chaos/scenarios/dbus-restart.ts";
import { scenario as diskFull } from "../chaos/scenarios/disk-full.ts";

test.each([kill9, sigterm, dbus, diskFull].map((s): [string, Scenario] => [s.id, s]))("%s: every fault injected converges to exactly the desired state", async (_id, s) => {
  const lines: string[] = [];
  const r = await s.run({ long: false, log: (l) => lines.push(l) });
  expect({ failures: r.failures, log: r.failures.length > 0 ? lines : [] }).toEqual({ failures: [], log: [] });
  expect(r.iterations).toBeGreaterThan(0);
  expect(r.passed).toBe(r.iterations);
}, 600_000);
