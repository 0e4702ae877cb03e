// The node's hostname changed while the agent runs. As gardener-node-agent does, the agent notices within
// its 30 s check and restarts itself once (an expected restart of its own unit only); it must then keep
// reporting on the Node it reported on (renew its Lease, apply the Secret), and not crash-loop.
import type { Scenario } from "../scenario.ts";
import { waitFor } from "../../harness/exec.ts";
import { agentUnit, applyChange, iterate, leaseRenewTime, maxFigures, oscUnits, startRig, unitRestarts, unitStates, waitAgentReady, waitLeaseRenewed } from "../lib-control-plane.ts";

export const scenario: Scenario = {
  id: "hostname-change",
  fault: "the node's hostname changed",
  async run({ long, log }) {
    const iterations = long ? 2 : 1;
    const rig = await startRig({ prefix: "cp-host" });
    const figures: Record<string, number>[] = [];
    try {
      const result = await iterate(iterations, log, async (i) => {
        const problems: string[] = [];
        const before = await unitStates(rig.node);
        const name = `${rig.agent.name}-renamed-${i}`;
        await rig.node.execOk(["hostname", name]);
        const renamedAt = performance.now();
        log(`iteration ${i}: hostname → ${name}`);
        const restarted = await waitFor("the agent restarting itself", async () => {
          const now = (await unitStates(rig.node, [agentUnit]))[agentUnit];
          return now && now.MainPID !== "0" && now.MainPID !== before[agentUnit]?.MainPID ? now : undefined;
        }, 60_000, 250);
        const restartMs = Math.round(performance.now() - renamedAt);
        const leaseBefore = await leaseRenewTime(rig);
        const lease = await waitLeaseRenewed(rig, leaseBefore, 30_000);
        const appliedMs = await applyChange(rig, `hostname-${i}`, 30_000);
        const readyMs = await waitAgentReady(rig, 30_000);
        const after = await unitStates(rig.node);
        problems.push(...unitRestarts(before, after).filter((r) => oscUnits.some((u) => r.startsWith(u))).map((r) => `unexpected restart: ${r}`));
        const restarts = Number(after[agentUnit]?.NRestarts) - Number(before[agentUnit]?.NRestarts);
        if (restarts !== 1 || after[agentUnit]?.MainPID !== restarted.MainPID) problems.push(`the agent restarted ${restarts} times (MainPID ${before[agentUnit]?.MainPID} → ${restarted.MainPID} → ${after[agentUnit]?.MainPID}); want exactly once`);
        figures.push({ restartMs, leaseRenewedMs: lease.ms, appliedMs, readyMs });
        log(`iteration ${i}: ${JSON.stringify(figures.at(-1))}`);
        return problems;
      });
      return { checked: "the agent restarted itself exactly once, then renewed its Node's Lease, applied a Secret change and was ready; no OSC unit restarted", iterations, ...result, figures: maxFigures(figures) };
    } finally {
      await rig.stop();
    }
  },
};
