// kube-apiserver stopped (etcd keeps running) while the agent runs. The agent must leave the node as it
// is, let its Lease lapse, reconnect when the API server is back and apply the Secret as it is then.
// Odd iterations change the Secret after the API server is back; even ones change it during the outage
// through a second kube-apiserver on the same etcd (the agent's own server is the one that is down).
import type { Scenario } from "../scenario.ts";
import { agentJournal, agentMetric, applyChange, iterate, leaseRenewTime, maxFigures, renewFailuresSince, startRig, unitRestarts, unitStates, waitAgentReady, waitLeaseRenewed, waitSecretWatch } from "../lib-control-plane.ts";
import { waitApplied } from "../../harness/agent.ts";

export const scenario: Scenario = {
  id: "apiserver-down",
  fault: "kube-apiserver down (etcd up)",
  async run({ long, log }) {
    const outageMs = long ? 5 * 60_000 : 15_000;
    const iterations = 2;
    const rig = await startRig({ prefix: "cp-api" });
    const figures: Record<string, number>[] = [];
    try {
      const result = await iterate(iterations, log, async (i) => {
        const problems: string[] = [];
        const viaSecond = i % 2 === 0;
        const before = await unitStates(rig.node);
        const failuresBefore = (await agentMetric(rig, "trellis_lease_renew_failures_total")) ?? 0;
        await rig.cluster.stopApiServer();
        log(`iteration ${i}: kube-apiserver stopped for ${outageMs / 1000} s${viaSecond ? "; the Secret changes through a second API server meanwhile" : ""}`);
        const outageStarted = performance.now();
        let checksum: string | undefined;
        if (viaSecond) {
          const second = await rig.cluster.secondApiServer();
          try {
            checksum = await rig.putOsc(`outage-${i}`, { via: second });
          } finally {
            await second.stop();
          }
        }
        await Bun.sleep(Math.max(0, outageMs - (performance.now() - outageStarted)));
        const renewFailures = await renewFailuresSince(rig, failuresBefore, 15_000);
        if (renewFailures < 1) problems.push("the agent reported no failed Lease renewal during the outage");
        const starting = Date.now();
        await rig.cluster.startApiServer();
        const back = Date.now();
        const leaseBefore = await leaseRenewTime(rig);
        // From the moment the API server answered /readyz (negative: the agent was back before that).
        const reconnectMs = (await waitSecretWatch(rig, starting, 60_000)) - back;
        if (reconnectMs > 5_000) problems.push(`the agent's Secret watch reconnected ${reconnectMs} ms after the API server was ready (limit 5000)`);
        const lease = await waitLeaseRenewed(rig, leaseBefore, 30_000);
        const applyMs = viaSecond && checksum ? await timed(() => waitApplied(rig.agent, checksum as string, 60_000, 250)) : await applyChange(rig, `after-${i}`, 30_000);
        if (applyMs > 10_000) problems.push(`the Secret change was applied ${applyMs} ms after the Lease was renewed again (limit 10000)`);
        const readyMs = await waitAgentReady(rig, 30_000);
        problems.push(...unitRestarts(before, await unitStates(rig.node)).map((r) => `unexpected restart: ${r}`));
        figures.push({ reconnectMs, leaseRenewedMs: lease.ms, appliedMs: applyMs, readyMs, renewFailures });
        log(`iteration ${i}: ${JSON.stringify(figures.at(-1))}`);
        if (problems.length > 0) log((await agentJournal(rig.node, starting - 2_000)).split("\n").slice(-40).join("\n"));
        return problems;
      });
      return { checked: "no unit restarted, Secret watch back ≤ 5 s after the API server, Lease renewed, /readyz 200, Secret change applied (also one written through a second API server during the outage)", iterations, ...result, figures: maxFigures(figures) };
    } finally {
      await rig.stop();
    }
  },
};

async function timed(f: () => Promise<unknown>): Promise<number> {
  const started = performance.now();
  await f();
  return Math.round(performance.now() - started);
}
