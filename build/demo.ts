// bun run demo — trellis bringing a real node up on a local cluster, end to end:
// a real kube-apiserver + etcd, a real systemd node (namespaces, its own D-Bus), the compiled agent
// installed as gardener-node-agent.service, an OSC Secret with a web service, its page and a drop-in;
// then only the page changes, and exactly one unit restarts. Everything is stopped at the end.
import { readFileSync } from "node:fs";
import { parse, stringify } from "yaml";
import { mainPid, nodeEvents, putOscSecret, startAgentNode, waitApplied } from "../test/harness/agent.ts";
import { startCluster } from "../test/harness/cluster.ts";

const secretName = "gardener-node-agent-demo";
const fixture = parse(readFileSync(new URL("../test/fixtures/web-osc.yaml", import.meta.url), "utf8"), { version: "1.1" });
const oscWithPage = (page: string) => {
  const o = structuredClone(fixture);
  o.spec.files[0].content.inline.data = page;
  return stringify(o);
};
const t0 = performance.now();
const since = (t: number) => `${((performance.now() - t) / 1000).toFixed(2)} s`;
const say = (msg: string) => console.log(`[${since(t0).padStart(8)}] ${msg}`);

let t = performance.now();
const cluster = await startCluster({ controllerManager: false });
say(`control plane up (etcd + kube-apiserver ${cluster.server}) in ${since(t)}`);
try {
  t = performance.now();
  const agent = await startAgentNode(cluster, { prefix: "demo", secretName });
  say(`node ${agent.name} booted (systemd as PID 1), trellis installed as gardener-node-agent.service in ${since(t)}`);
  const page = (await agent.node.exec(["curl", "-s", "http://127.0.0.1:8089/"])).stdout;
  say(`web service before the OSC: ${page ? page.trim() : "not running"}`);

  t = performance.now();
  const first = await putOscSecret(cluster, secretName, oscWithPage("<h1>hello from trellis, version 1</h1>\n"));
  await waitApplied(agent, first);
  say(`OSC ${first.slice(0, 12)} (2 units, 2 files, 1 drop-in) applied in ${since(t)} after the Secret was written`);
  const web = await mainPid(agent, "web.service");
  const ticker = await mainPid(agent, "ticker.service");
  const self = await mainPid(agent, "gardener-node-agent.service");
  const served = await agent.node.exec(["curl", "-s", "--retry", "20", "--retry-connrefused", "--retry-delay", "0", "http://127.0.0.1:8089/"]);
  say(`web service says: ${served.stdout.trim()}`);

  t = performance.now();
  const second = await putOscSecret(cluster, secretName, oscWithPage("<h1>hello from trellis, version 2</h1>\n"));
  await waitApplied(agent, second);
  say(`changed only /etc/web/index.html: OSC ${second.slice(0, 12)} applied in ${since(t)}`);
  const after = { web: await mainPid(agent, "web.service"), ticker: await mainPid(agent, "ticker.service"), self: await mainPid(agent, "gardener-node-agent.service") };
  const line = (unit: string, before: number, now: number) => `  ${unit.padEnd(28)} MainPID ${before} → ${now}  ${before === now ? "untouched" : "RESTARTED"}`;
  console.log(line("web.service", web, after.web));
  console.log(line("ticker.service", ticker, after.ticker));
  console.log(line("gardener-node-agent.service", self, after.self));
  const restarted = [web !== after.web, ticker !== after.ticker, self !== after.self].filter(Boolean).length;
  const now = await agent.node.exec(["curl", "-s", "--retry", "20", "--retry-connrefused", "--retry-delay", "0", "http://127.0.0.1:8089/"]);
  say(`web service says: ${now.stdout.trim()}`);
  for (const e of (await nodeEvents(agent)).sort((a, b) => String(a.lastTimestamp).localeCompare(String(b.lastTimestamp)))) {
    console.log(`  event ${e.type} ${e.reason}: ${e.message}`);
  }
  say(restarted === 1 && web !== after.web ? "exactly one unit restarted: the one whose file changed" : `unexpected: ${restarted} units restarted`);
  await agent.node.stop();
  if (restarted !== 1 || web === after.web) process.exitCode = 1;
} finally {
  await cluster.stop();
  say("everything stopped");
}
