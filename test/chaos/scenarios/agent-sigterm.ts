// SIGTERM to the agent at a random instant of applying a large OSC: it finishes the apply (or persists
// the step it is in) and exits on its own well within its unit's stop timeout; systemd starts it again,
// and that start converges without redoing a restart the stopped agent already did.
import { agentUnitName, chaosOsc, faultRounds, spread, startRig } from "../lib-node.ts";
import { unitProperty } from "../../harness/agent.ts";
import type { Scenario } from "../scenario.ts";

export const scenario: Scenario = {
  id: "agent-sigterm",
  fault: "SIGTERM to the agent during an apply",
  async run({ long, log }) {
    const rounds = long ? 60 : 10;
    const rig = await startRig("sigterm", chaosOsc(0));
    try {
      const stopTimeoutMs = Number(await unitProperty(rig.node, agentUnitName, "TimeoutStopUSec").then(usOf)) / 1000;
      const stops: number[] = [];
      const r = await faultRounds({
        rig,
        from: 0,
        rounds,
        seed: 15,
        log,
        exactlyOnce: true,
        // The agent's exit as systemd would wait for it: the process gone, whatever it still had to do.
        fault: () => `kill -TERM $pid; while kill -0 $pid 2>/dev/null; do sleep 0.005; done; echo "STOP_MS $(( ($(date +%s%N) - t0) / 1000000 ))"`,
        check: async (i) => {
          const ms = Number(i.output.get("STOP_MS"));
          stops.push(ms);
          return ms < stopTimeoutMs ? [] : [`the agent took ${ms} ms to exit, beyond its unit's stop timeout of ${stopTimeoutMs} ms`];
        },
      });
      const stop = spread(stops);
      return {
        checked: `the agent exits on its own within its unit's stop timeout (${stopTimeoutMs / 1000} s); after its restart: every file's bytes, mode and owner, no other file, no temp file, each unit owed a restart started exactly once with its file's current content, no other unit restarted, the Node's checksum annotation changed exactly once`,
        iterations: rounds,
        passed: r.passed,
        failures: r.failures,
        figures: { termsInterruptingAPlan: r.interrupted, termsAfterTheApply: r.missed, exitMsMedian: stop.median, exitMsMax: stop.max },
      };
    } finally {
      await rig.stop();
    }
  },
};

/** systemd's "1min 30s" style duration (`systemctl show -P TimeoutStopUSec`) in µs. */
function usOf(text: string): number {
  const units: Record<string, number> = { us: 1, ms: 1e3, s: 1e6, min: 60e6, h: 3600e6 };
  let us = 0;
  for (const m of text.matchAll(/(\d+(?:\.\d+)?)(us|ms|s|min|h)/g)) us += Number(m[1]) * (units[m[2] as string] as number);
  if (us === 0) throw new Error(`cannot read the stop timeout "${text}"`);
  return us;
}
