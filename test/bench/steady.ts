// bun --preload ./build/shims/preload.ts test/bench/steady.ts [minutes=10]
// Steady state of one agent on a real node against a real kube-apiserver, after its OSC is applied:
// API requests it makes (counted at the API server, from the audit log, by verb and resource), and
// its CPU seconds and RSS over the window (from /proc of its MainPID inside the node).
import { mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { parse, stringify } from "yaml";
import { mainPid, putOscSecret, startAgentNode, waitApplied } from "../harness/agent.ts";
import { startCluster } from "../harness/cluster.ts";
import { auditOf } from "../harness/rbac.ts";

const minutes = Number(process.argv[2] ?? 10);
const secretName = "gardener-node-agent-steady";
// The demo's OSC, with the web service kept off the network: test nodes share the host's network,
// and a port taken by another run would make the unit fail and distort what is measured.
const fixture = parse(readFileSync(new URL("../fixtures/web-osc.yaml", import.meta.url), "utf8"), { version: "1.1" });
fixture.spec.units[0].content = "[Service]\nExecStart=/bin/sleep infinity\n[Install]\nWantedBy=multi-user.target\n";
const osc = stringify(fixture);

const cluster = await startCluster({ controllerManager: false });
try {
  const agent = await startAgentNode(cluster, { prefix: "steady", secretName });
  try {
    await waitApplied(agent, await putOscSecret(cluster, secretName, osc));
    await Bun.sleep(15_000); // settle: the first lease renewals, the unit check's first pass
    const user = `gardener.cloud:node-agent:machine:${agent.name}`;
    const pid = await mainPid(agent, "gardener-node-agent.service");
    const cpu = async () => {
      const stat = (await agent.node.readFile(`/proc/${pid}/stat`)).split(") ")[1]?.split(" ") ?? [];
      return (Number(stat[11]) + Number(stat[12])) / 100; // utime + stime, in clock ticks of 10 ms
    };
    const rss = async () => Number(/VmRSS:\s+(\d+)/.exec(await agent.node.readFile(`/proc/${pid}/status`))?.[1] ?? 0) / 1024;
    const t0 = new Date();
    const cpu0 = await cpu();
    const before = auditOf(cluster, user).length;
    const rssSamples: number[] = [];
    for (let i = 0; i < minutes * 6; i++) {
      await Bun.sleep(10_000);
      rssSamples.push(await rss());
    }
    const cpuSeconds = (await cpu()) - cpu0;
    await Bun.sleep(2_000); // the audit log is written after the response
    const during = auditOf(cluster, user)
      .slice(before)
      .filter((e) => e.stage === "ResponseComplete" && new Date(e.stageTimestamp) >= t0);
    const byKind = new Map<string, number>();
    for (const e of during) {
      const key = `${e.verb} ${e.objectRef?.resource ?? e.requestURI}`;
      byKind.set(key, (byKind.get(key) ?? 0) + 1);
    }
    const perHour = (n: number) => Math.round((n * 60) / minutes);
    const result = {
      date: new Date().toISOString(),
      minutes,
      apiRequests: during.length,
      apiRequestsPerHour: perHour(during.length),
      byVerbAndResource: Object.fromEntries([...byKind].sort().map(([k, n]) => [k, { count: n, perHour: perHour(n) }])),
      cpuSeconds: Number(cpuSeconds.toFixed(2)),
      cpuPercentOfOneCore: Number(((cpuSeconds / (minutes * 60)) * 100).toFixed(3)),
      rssMiB: { min: Math.min(...rssSamples), max: Math.max(...rssSamples), last: rssSamples.at(-1) },
    };
    console.log(JSON.stringify(result, null, 2));
    mkdirSync(new URL("./results/", import.meta.url), { recursive: true });
    writeFileSync(new URL(`./results/steady-${result.date.slice(0, 10)}.json`, import.meta.url), `${JSON.stringify(result, null, 2)}\n`);
  } finally {
    await agent.node.stop();
  }
} finally {
  await cluster.stop();
}
