// systemd's D-Bus side pulled away at a random instant of applying a large OSC: `systemctl daemon-reexec`
// (systemd re-executes itself and comes back on the bus) and a restart of dbus.service (every bus
// connection is cut). The apply finishes or fails and is retried, the agent (the same process) connects
// to the bus again, and the node converges.
import { agentLogLines, chaosOsc, faultRounds, spread, startRig } from "../lib-node.ts";
import { waitFor } from "../../harness/exec.ts";
import type { Scenario } from "../scenario.ts";

const faults = ["systemctl daemon-reexec", "systemctl restart dbus.service"];

export const scenario: Scenario = {
  id: "dbus-restart",
  fault: "`systemctl daemon-reexec` or dbus.service restarted during an apply",
  async run({ long, log }) {
    const rounds = long ? 40 : 8;
    const rig = await startRig("dbus", chaosOsc(0));
    try {
      const connects = async () => (await agentLogLines(rig.node, '"connected to D-Bus"')).length;
      let connectsBefore = await connects();
      let reconnects = 0;
      let round = 0;
      const r = await faultRounds({
        rig,
        from: 0,
        rounds,
        seed: 27,
        log,
        exactlyOnce: false,
        fault: (i) => {
          round = i;
          return faults[i % faults.length] as string;
        },
        convergeTimeoutMs: 180_000,
        check: async (_i, before, after) => {
          const problems = before.agentPid === after.agentPid ? [] : [`the agent's process changed (${before.agentPid} → ${after.agentPid}): it should have survived the bus going away`];
          if (round % faults.length === 1) {
            // dbus-daemon's restart cut the agent's connection: the agent connects again (the apply's
            // unit steps, or its health checks, need the bus).
            const had = connectsBefore;
            const now = await waitFor("the agent to connect to the new dbus-daemon", async () => {
              const n = await connects();
              return n > had ? n : undefined;
            }, 60_000, 200).catch((err: unknown) => {
              problems.push(err instanceof Error ? err.message : String(err));
              return had;
            });
            reconnects += now - had;
          }
          connectsBefore = await connects();
          return problems;
        },
      });
      const converge = spread(r.convergeMs);
      const retried = (await agentLogLines(rig.node, '"OSC apply incomplete"')).length;
      return {
        checked:
          "the agent's process survives and connects to the bus again; every file's bytes, mode and owner, no other file, no temp file, every unit active and started with its file's current content, no unit restarted that was not owed, the Node's checksum annotation changed exactly once",
        iterations: rounds,
        passed: r.passed,
        failures: r.failures,
        figures: { faultsInterruptingAPlan: r.interrupted, faultsAfterTheApply: r.missed, reconnects, appliesFailedAndRetried: retried, restartsRedone: r.redone, convergeMsMedian: converge.median, convergeMsMax: converge.max },
      };
    } finally {
      await rig.stop();
    }
  },
};
