// etcd stopped while kube-apiserver stays up: the API server answers, but nothing can be read fresh or
// written (the agent's Lease renewals fail and it lapses). Nothing is written during the outage; once etcd
// is back the agent must renew its Lease, be ready and apply a Secret change, with no unit restarted.
import type { Scenario } from "../scenario.ts";
import { waitFor } from "../../harness/exec.ts";
import { agentMetric, applyChange, iterate, leaseRenewTime, maxFigures, startRig, unitRestarts, unitStates, waitAgentReady, waitLeaseRenewed } from "../lib-control-plane.ts";

export const scenario: Scenario = {
  id: "etcd-down",
  fault: "etcd down (kube-apiserver up)",
  async run({ long, log }) {
    const outageMs = long ? 5 * 60_000 : 20_000;
    const iterations = 1;
    const rig = await startRig({ prefix: "cp-etcd" });
    const figures: Record<string, number>[] = [];
    try {
      const result = await iterate(iterations, log, async (i) => {
        const problems: string[] = [];
        const before = await unitStates(rig.node);
        const failuresBefore = (await agentMetric(rig, "trellis_lease_renew_failures_total")) ?? 0;
        const leaseBefore = await leaseRenewTime(rig);
        await rig.cluster.stopEtcd();
        log(`iteration ${i}: etcd stopped for ${outageMs / 1000} s`);
        await Bun.sleep(outageMs);
        const renewFailures = ((await agentMetric(rig, "trellis_lease_renew_failures_total")) ?? 0) - failuresBefore;
        if (renewFailures < 1) problems.push("the agent reported no failed Lease renewal during the outage");
        await rig.cluster.startEtcd();
        // kube-apiserver's own etcd client backs off during a long outage and answers 504 for a while after
        // etcd is healthy again: the agent is timed from when the API server serves reads again.
        const readsStarted = performance.now();
        await waitFor("kube-apiserver serving reads from etcd again", async () => (await leaseRenewTime(rig)) !== undefined, 180_000, 250);
        const apiServerReadsMs = Math.round(performance.now() - readsStarted);
        const lease = await waitLeaseRenewed(rig, leaseBefore, 60_000);
        // A renewal sent during the outage may hang until its 10 s request timeout, then the next one goes out at once.
        if (lease.ms > 20_000) problems.push(`the Lease was renewed ${lease.ms} ms after kube-apiserver served reads again (limit 20000: one interval and one request timeout)`);
        const appliedMs = await applyChange(rig, `after-etcd-${i}`, 60_000);
        if (appliedMs > 10_000) problems.push(`a Secret change after the outage was applied in ${appliedMs} ms (limit 10000)`);
        const readyMs = await waitAgentReady(rig, 30_000);
        problems.push(...unitRestarts(before, await unitStates(rig.node)).map((r) => `unexpected restart: ${r}`));
        figures.push({ apiServerReadsMs, leaseRenewedMs: lease.ms, appliedMs, readyMs, renewFailures });
        log(`iteration ${i}: ${JSON.stringify(figures.at(-1))}`);
        return problems;
      });
      return { checked: "no unit restarted, Lease renewed ≤ 20 s after kube-apiserver serves reads from etcd again (interval + request timeout), /readyz 200, a Secret change applied ≤ 10 s", iterations, ...result, figures: maxFigures(figures) };
    } finally {
      await rig.stop();
    }
  },
};
