// kill -9 of the agent (the compiled binary under its systemd unit, Restart=always) at a random instant of
// applying a large OSC; systemd starts it again and it converges.
import { chaosOsc, faultRounds, spread, startRig } from "../lib-node.ts";
import type { Scenario } from "../scenario.ts";

export const scenario: Scenario = {
  id: "agent-kill9",
  fault: "`kill -9` of the agent during an apply",
  async run({ long, log }) {
    const rounds = long ? 200 : 25;
    const rig = await startRig("kill9", chaosOsc(0));
    try {
      const r = await faultRounds({ rig, from: 0, rounds, seed: 9, log, fault: () => "kill -9 $pid", exactlyOnce: false });
      const converge = spread(r.convergeMs);
      return {
        checked:
          "303–323 files (7 modes, 20 that come and go, 2 of 48 kB in base64) and 4 units: every file's bytes, mode and owner, no other file, no temp file, every unit active and started with its file's current content, no unit restarted that was not owed, the Node's checksum annotation changed exactly once",
        iterations: rounds,
        passed: r.passed,
        failures: r.failures,
        figures: { killsInterruptingAPlan: r.interrupted, killsAfterTheApply: r.missed, restartsRedone: r.redone, convergeMsMedian: converge.median, convergeMsMax: converge.max },
      };
    } finally {
      await rig.stop();
    }
  },
};
