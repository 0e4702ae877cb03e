// etcd stopped while kube-apiserver stays up: the API server answers, but nothing can be read fresh or
// written (the agent's Lease renewals fail and it lapses). Nothing is written during the outage; once etcd
// is back the agent must renew its Lease, be ready and apply a Secret change, with no unit restarted.
import type { Scenario } from "../scenario.ts";
import type { V1Secret } from "@kubernetes/client-node";
import { waitApplied } from "../../harness/agent.ts";
import { waitFor } from "../../harness/exec.ts";
import { watchUntil } from "../../harness/watch.ts";
import { agentJournal, agentMetric, iterate, leaseRenewTime, maxFigures, renewFailuresSince, startRig, unitRestarts, unitStates, waitAgentReady, waitLeaseRenewed } from "../lib-control-plane.ts";

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
        const renewFailures = await renewFailuresSince(rig, failuresBefore, 15_000);
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
        // kube-apiserver's watch cache catches up with etcd on its own schedule after the outage (about 15 s
        // after a 20 s outage): the agent is timed against a watch of the test's own on the same Secret.
        const started = performance.now();
        const checksum = await rig.putOsc(`after-etcd-${i}`);
        const watchedMs = watchUntil(rig.cluster.admin(), "the Secret change on a watch of the API server", "/api/v1/namespaces/kube-system/secrets", rig.secretName, (o: V1Secret) => (o.metadata?.annotations?.["checksum/data-script"] === checksum ? true : undefined), { timeoutMs: 120_000 }).then(() => Math.round(performance.now() - started));
        await waitApplied(rig.agent, checksum, 120_000, 100);
        const appliedMs = Math.round(performance.now() - started);
        const watchMs = await watchedMs;
        if (appliedMs - watchMs > 5_000) {
          problems.push(`a Secret change after the outage was applied ${appliedMs - watchMs} ms after an API server watch delivered it (limit 5000)`);
          log((await agentJournal(rig.node, Date.now() - 120_000)).split("\n").filter((l) => l.includes("watch")).slice(-30).join("\n"));
        }
        const readyMs = await waitAgentReady(rig, 30_000);
        problems.push(...unitRestarts(before, await unitStates(rig.node)).map((r) => `unexpected restart: ${r}`));
        figures.push({ apiServerReadsMs, leaseRenewedMs: lease.ms, watchDeliveredMs: watchMs, appliedMs, readyMs, renewFailures });
        log(`iteration ${i}: ${JSON.stringify(figures.at(-1))}`);
        return problems;
      });
      return { checked: "no unit restarted, Lease renewed ≤ 20 s after kube-apiserver serves reads from etcd again (interval + request timeout), /readyz 200, a Secret change applied ≤ 5 s after an API server watch delivered it", iterations, ...result, figures: maxFigures(figures) };
    } finally {
      await rig.stop();
    }
  },
};
