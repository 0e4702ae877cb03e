// etcd stopped while kube-apiserver stays up: the API server answers, but nothing can be read fresh or
// written (the agent's Lease renewals fail and it lapses). Nothing is written during the outage; once etcd
// is back the agent must renew its Lease, be ready and apply a Secret change, with no unit restarted.
import type { Scenario } from "../scenario.ts";
import { CoreV1Api, PatchStrategy, setHeaderOptions, type V1Secret } from "@kubernetes/client-node";
import type { Cluster } from "../../harness/cluster.ts";
import { auditOf } from "../../harness/rbac.ts";
import { waitApplied } from "../../harness/agent.ts";
import { waitFor } from "../../harness/exec.ts";
import { recordVersions } from "../../harness/watch.ts";
import { agentJournal, agentMetric, iterate, leaseRenewTime, maxFigures, renewFailuresSince, startRig, unitRestarts, unitStates, waitAgentReady, waitLeaseRenewed } from "../lib-control-plane.ts";

export const scenario: Scenario = {
  id: "etcd-down",
  fault: "etcd down (kube-apiserver up)",
  async run({ long, log }) {
    const outageMs = long ? 5 * 60_000 : 20_000;
    const iterations = 1;
    const rig = await startRig({ prefix: "cp-etcd" });
    const figures: Record<string, number>[] = [];
    // Open for the whole run, like the agent's own watch: every version of the Secret, with when it arrived.
    const reference = recordVersions<V1Secret>(rig.cluster.admin(), "/api/v1/namespaces/kube-system/secrets", rig.secretName);
    try {
      await waitFor("the test's own watch of the Secret", () => reference.versions.length > 0, 30_000, 50);
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
        const etcdStarting = Date.now();
        await rig.cluster.startEtcd();
        // kube-apiserver's own etcd client backs off during a long outage and answers 504 for a while after
        // etcd is healthy again: the agent is timed from when the API server serves reads again.
        const readsStarted = performance.now();
        await waitFor("kube-apiserver serving reads from etcd again", async () => (await leaseRenewTime(rig)) !== undefined, 180_000, 250);
        const apiServerReadsMs = Math.round(performance.now() - readsStarted);
        const lease = await waitLeaseRenewed(rig, leaseBefore, 60_000);
        // A renewal sent during the outage may hang until its 10 s request timeout, then the next one goes out at once.
        if (lease.ms > 20_000) problems.push(`the Lease was renewed ${lease.ms} ms after kube-apiserver served reads again (limit 20000: one interval and one request timeout)`);
        // kube-apiserver's watch cache catches up with etcd on its own schedule after the outage (seconds
        // after reads work again). The agent's Secret watch stays open through the outage and gets the change
        // from that cache: it is timed against a watch of the test's own opened the same way (before the
        // outage, resumed from its last resourceVersion), so the cache's lag is not counted as the agent's.
        // The write is retried while kube-apiserver still fails writes (the test's write failing is not the agent's).
        // Each resource's storage in kube-apiserver has its own etcd client, back at its own pace: the agent
        // reports on its Node, so the API server must accept a Node write again before the agent is timed.
        await waitFor("kube-apiserver writing Nodes again", () => nodeWritten(rig.cluster, rig.agent.name, `after-etcd-${i}`), 120_000, 250);
        const started = performance.now();
        const checksum = await waitFor("the Secret written after the outage", () => rig.putOsc(`after-etcd-${i}`), 30_000, 250);
        const delivered = await waitFor("the Secret change on the test's own watch", () => reference.versions.find((v) => v.object.metadata?.annotations?.["checksum/data-script"] === checksum), 120_000, 50);
        const watchDeliveredMs = Math.round(delivered.at - (performance.timeOrigin + started));
        await waitApplied(rig.agent, checksum, 120_000, 50);
        const appliedMs = Math.round(performance.now() - started);
        const journal = (await agentJournal(rig.node, etcdStarting - outageMs - 2_000)).split("\n");
        // Whether the outage broke the agent's Secret watch (it reconnects within seconds: apiserver-down) or not.
        const watchFailures = journal.filter((l) => l.includes('"watch failed') && l.includes("secrets")).length;
        // When the agent's watch handed it the change (its log line), to tell a late delivery from a slow apply.
        const seen = journal.map((l) => (l.includes('"OSC Secret changed"') ? Date.parse((JSON.parse(l) as { ts: string }).ts) : Number.NaN)).filter((t) => t >= delivered.at - 60_000).at(-1);
        const agentSawMs = seen === undefined ? -1 : Math.round(seen - (performance.timeOrigin + started));
        if (appliedMs - watchDeliveredMs > 5_000) {
          problems.push(`a Secret change after the outage was applied ${appliedMs - watchDeliveredMs} ms after the test's own watch delivered it (limit 5000)`);
          log(journal.slice(-60).join("\n"));
          log(`the agent's Node patches (received → answered): ${nodePatches(rig.cluster, rig.agent.user, delivered.at - 60_000)}`);
        }
        const readyMs = await waitAgentReady(rig, 30_000);
        problems.push(...unitRestarts(before, await unitStates(rig.node)).map((r) => `unexpected restart: ${r}`));
        figures.push({ apiServerReadsMs, leaseRenewedMs: lease.ms, watchDeliveredMs, agentSawMs, appliedMs, readyMs, renewFailures, watchFailures });
        log(`iteration ${i}: ${JSON.stringify(figures.at(-1))}`);
        return problems;
      });
      return { checked: "no unit restarted, Lease renewed ≤ 20 s after kube-apiserver serves reads from etcd again (interval + request timeout), /readyz 200, a Secret change applied ≤ 5 s after a watch of the test's own (open since before the outage) delivered it", iterations, ...result, figures: maxFigures(figures) };
    } finally {
      reference.stop();
      await rig.stop();
    }
  },
};

/** Writes an annotation of the test's own to Node `name`; true once the API server answered within 5 s. */
async function nodeWritten(cluster: Cluster, name: string, value: string): Promise<true | undefined> {
  const core = cluster.admin().makeApiClient(CoreV1Api);
  const patch = core.patchNode({ name, body: { metadata: { annotations: { "chaos.trellis.dev/probe": value } } } }, setHeaderOptions("Content-Type", PatchStrategy.MergePatch));
  const answered = await Promise.race([patch.then(() => true as const), Bun.sleep(5_000).then(() => undefined)]);
  patch.catch(() => undefined); // a write that failed or hung is retried: only its answer in time counts
  return answered;
}

/** The agent's PATCHes of its Node since `sinceMs` (epoch ms) in the audit log: when each was received and answered, and how. */
function nodePatches(cluster: Cluster, user: string, sinceMs: number): string {
  return auditOf(cluster, user)
    .filter((e) => e.verb === "patch" && e.stage === "ResponseComplete" && e.objectRef?.resource === "nodes" && Date.parse(e.requestReceivedTimestamp) >= sinceMs)
    .map((e) => `${e.requestReceivedTimestamp} → ${e.stageTimestamp} ${e.responseStatus?.code ?? "?"}${e.objectRef?.subresource ? ` (${e.objectRef.subresource})` : ""}`)
    .join("; ");
}
