// bun run bench:trace [-- --steady-minutes 5 --changes 40]
//
// What dominates the figures where trellis trails gardener-node-agent in `bun run bench`, traced
// rather than guessed. Both agents run as there (own node, same OSC, same API server, stand-in
// kubelet), but each talks to the API server through a TLS-terminating relay
// (test/harness/tls-relay.ts) that sees every request in plaintext:
//   1. first apply of the bench OSC (500 files, 50 units), one agent after the other: each request
//      with the bytes of its head and body each way and the body's encoding (JSON, protobuf, gzip);
//   2. `--changes` more OSCs applied by each (one file each, as the reaction phase of `bun run bench`
//      and its no-op re-checks: 30 + 10), so that the agents idle in the state that bench measures;
//   3. steady state, both idle at once: the same per request, the HTTP version, TLS's share of the
//      wire, and Linux perf on each agent (every thread, call graphs): CPU by thread, by binary or
//      kernel, and the hottest kernel symbols.
// Requests are named by their audit event (same user, nearest arrival time): HTTP/2 headers are
// HPACK-compressed and not decoded by the relay.
// Prints the report on stderr, the JSON on stdout, and writes test/bench/results/trace-<date>.json.
import { readFileSync } from "node:fs";
import { parseArgs } from "node:util";
import { CoreV1Api } from "@kubernetes/client-node";
import { parse } from "yaml";
import { sha256Hex } from "../../src/api/desired.ts";
import { type AgentNode, mainPid, startAgentNode, waitApplied } from "../harness/agent.ts";
import { startCluster } from "../harness/cluster.ts";
import { runDir } from "../harness/exec.ts";
import type { AuditEvent } from "../harness/rbac.ts";
import { type Exchange, startTlsRelay, type TlsRelay } from "../harness/tls-relay.ts";
import { type BenchAgent, benchAgents } from "./lib/agents.ts";
import { AuditTail, auditMs, requestKind, waitWatching } from "./lib/audit.ts";
import { oscYaml, secretBody } from "./lib/bench-osc.ts";
import { PERF_HZ, hostPid, type PerfRow, perfRecord, perfReport, threadNames } from "./lib/perf.ts";
import { cpuSeconds, initClockTicks, machineInfo } from "./lib/proc.ts";
import { saveResult } from "./lib/results.ts";
import { round } from "./lib/stats.ts";

const { values: args } = parseArgs({ options: { "steady-minutes": { type: "string", default: "5" }, changes: { type: "string", default: "40" } } });
const STEADY_SECONDS = Number(args["steady-minutes"]) * 60;
const CHANGES = Number(args.changes);
const benchStart = performance.now();
const progress = (msg: string) => console.error(`[${((performance.now() - benchStart) / 1000).toFixed(1).padStart(7)} s] ${msg}`);

type Traced = AgentNode & { agent: BenchAgent; relay: TlsRelay; secretName: string };

/** The client certificate and key of the agent's kubeconfig on its node. */
function agentCredentials(node: AgentNode["node"]): { certPem: string; keyPem: string } {
  const kubeconfig = parse(readFileSync(`${node.root}/var/lib/gardener-node-agent/credentials/kubeconfig`, "utf8")) as {
    users: { user: { "client-certificate-data": string; "client-key-data": string } }[];
  };
  const user = kubeconfig.users[0]?.user;
  if (!user) throw new Error(`no user in ${node.name}'s kubeconfig`);
  const pem = (b64: string) => Buffer.from(b64, "base64").toString("utf8");
  return { certPem: pem(user["client-certificate-data"]), keyPem: pem(user["client-key-data"]) };
}

/**
 * Names each exchange by the audit event of the same user that arrived nearest in time (each event
 * names one exchange); an HTTP/1.1 exchange only by an event of its own request URI.
 */
function nameExchanges(exchanges: Exchange[], events: AuditEvent[]): { name: string; x: Exchange }[] {
  const arrivals = events.filter((e) => e.stage === "ResponseComplete" || (e.verb === "watch" && e.stage === "ResponseStarted"));
  const used = new Set<AuditEvent>();
  const distance = (e: AuditEvent, x: Exchange) => Math.abs(auditMs(e.requestReceivedTimestamp) - x.startMs);
  return exchanges.map((x) => {
    let best: AuditEvent | undefined;
    for (const e of arrivals) {
      if (used.has(e) || (x.path !== undefined && e.requestURI !== x.path)) continue;
      if (distance(e, x) < 250 && (!best || distance(e, x) < distance(best, x))) best = e;
    }
    if (best) used.add(best);
    return { name: best ? requestKind(best) : "(no audit event)", x };
  });
}

type Bytes = { reqHead: number; reqBody: number; respHead: number; respBody: number };
const bytesOf = (x: Exchange): Bytes => ({ reqHead: x.request.headBytes, reqBody: x.request.bodyBytes, respHead: x.response.headBytes, respBody: x.response.bodyBytes });

/** Everything a relay saw up to now: per exchange (a watch opened earlier goes on receiving), and totals of plaintext, HTTP/2 control frames and wire. */
function snapshot(t: Traced) {
  const sum = (f: (c: ReturnType<TlsRelay["connections"]>[number]) => number) => t.relay.connections().reduce((s, c) => s + f(c), 0);
  return {
    at: Date.now(),
    exchanges: new Map(t.relay.exchanges().map((x) => [x, bytesOf(x)])),
    plain: { sent: sum((c) => c.plain.sent), received: sum((c) => c.plain.received) },
    control: { sent: sum((c) => c.control.sent), received: sum((c) => c.control.received) },
    wire: t.relay.wire(),
  };
}
type Snapshot = ReturnType<typeof snapshot>;

type Group = Bytes & { started: number; requestEncodings: string[]; responseEncodings: string[]; requestHeaders?: string };

/** Per request kind, what moved in the window: requests started, and the bytes of each part (a watch opened before the window counts its events). */
function windowReport(t: Traced, audit: AuditTail, from: Snapshot, to: Snapshot) {
  const named = nameExchanges(t.relay.exchanges(), audit.by(t.user));
  const groups: Record<string, Group> = {};
  for (const { name, x } of named) {
    const [a, b] = [from.exchanges.get(x), to.exchanges.get(x)];
    if (!b) continue; // started after the window
    const d: Bytes = { reqHead: b.reqHead - (a?.reqHead ?? 0), reqBody: b.reqBody - (a?.reqBody ?? 0), respHead: b.respHead - (a?.respHead ?? 0), respBody: b.respBody - (a?.respBody ?? 0) };
    if (a && d.reqHead + d.reqBody + d.respHead + d.respBody === 0) continue;
    const g = (groups[name] ??= { started: 0, reqHead: 0, reqBody: 0, respHead: 0, respBody: 0, requestEncodings: [], responseEncodings: [] });
    if (!a) g.started++;
    g.reqHead += d.reqHead;
    g.reqBody += d.reqBody;
    g.respHead += d.respHead;
    g.respBody += d.respBody;
    const respEncoding = `${x.response.encoding}${x.response.kind ? ` ${x.response.kind}` : ""}`;
    if (!g.requestEncodings.includes(x.request.encoding)) g.requestEncodings.push(x.request.encoding);
    if (!g.responseEncodings.includes(respEncoding)) g.responseEncodings.push(respEncoding);
    if (x.requestHeaders) g.requestHeaders ??= x.requestHeaders.map(([h, n]) => `${h} ${n}`).join(", ");
  }
  return {
    seconds: round((to.at - from.at) / 1000, 1),
    protocols: [...new Set(t.relay.connections().map((c) => c.protocol))],
    plaintext: { sent: to.plain.sent - from.plain.sent, received: to.plain.received - from.plain.received },
    http2Control: { sent: to.control.sent - from.control.sent, received: to.control.received - from.control.received },
    wire: { sent: to.wire.sent - from.wire.sent, received: to.wire.received - from.wire.received },
    byRequest: Object.fromEntries(Object.entries(groups).sort((x, y) => x[0].localeCompare(y[0]))),
  };
}

await initClockTicks();
const machine = await machineInfo();
progress("building/copying the agents");
const agents = await benchAgents();
const cluster = await startCluster({ controllerManager: false });
const core = cluster.admin().makeApiClient(CoreV1Api);
const audit = new AuditTail(cluster.auditLog);
const traced: Traced[] = [];
let kubelet: ReturnType<typeof Bun.serve> | undefined;
const result: Record<string, unknown> = { machine };
const oscText = oscYaml(0);

try {
  kubelet = Bun.serve({ hostname: "127.0.0.1", port: 10248, fetch: () => new Response("ok") });
  for (const agent of agents) {
    const holder: { node?: AgentNode["node"] } = {};
    const relay = await startTlsRelay({
      target: cluster.server,
      caPem: cluster.caPem,
      servingCertPem: readFileSync(cluster.serving.certFile, "utf8"),
      servingKeyPem: readFileSync(cluster.serving.keyFile, "utf8"),
      clientCredentials: () => agentCredentials(holder.node as AgentNode["node"]),
    });
    const secretName = `osc-${agent.id}`;
    const a = await startAgentNode(cluster, {
      prefix: `trace-${agent.id}`,
      secretName,
      binary: agent.binary,
      configName: agent.configName,
      unit: agent.unit,
      rules: agent.rules([secretName]),
      server: relay.server,
      containerd: true,
      start: false,
    });
    holder.node = a.node;
    traced.push({ ...a, agent, relay, secretName });
    await a.node.execOk(["systemctl", "enable", "--now", "gardener-node-agent.service"]);
    await waitWatching(audit, a.user);
  }

  // ------------------------------------------------ 1. first apply, one agent after the other
  const firstApply: Record<string, unknown> = {};
  for (const t of traced) {
    await Bun.sleep(2_000);
    const from = snapshot(t);
    await core.createNamespacedSecret({ namespace: "kube-system", body: secretBody(t.secretName, oscText) });
    const checksum = sha256Hex(oscText);
    await waitApplied(t, checksum, 180_000);
    await Bun.sleep(3_000); // the event and the conditions that follow the annotation
    firstApply[t.agent.id] = windowReport(t, audit, from, snapshot(t));
    progress(`first apply traced: ${t.agent.label}`);
  }
  result.firstApply = firstApply;

  // ------------------------------------------------ 2. the work `bun run bench` does before its steady state
  progress(`${CHANGES} more OSCs applied by each agent`);
  for (let i = 1; i <= CHANGES; i++) {
    const text = oscYaml(i);
    for (const t of traced) {
      await core.replaceNamespacedSecret({ name: t.secretName, namespace: "kube-system", body: secretBody(t.secretName, text) });
      await waitApplied(t, sha256Hex(text), 60_000);
    }
  }
  result.changesBeforeSteady = CHANGES;

  // ------------------------------------------------ 3. steady state, both at once, under perf
  progress(`steady state: ${STEADY_SECONDS / 60} min with perf on both agents (after 30 s to settle)`);
  await Bun.sleep(30_000);
  const dir = runDir("trace-perf");
  const pids = await Promise.all(
    traced.map(async (t) => {
      const pid = await mainPid(t, "gardener-node-agent.service");
      return { t, pid, host: hostPid(t.node, pid) };
    }),
  );
  const starts = await Promise.all(pids.map(async ({ t, pid }) => ({ snap: snapshot(t), cpu: await cpuSeconds(t.node, pid) })));
  await Promise.all(pids.map(({ t, host }) => perfRecord(host, STEADY_SECONDS, `${dir}/${t.agent.id}.data`)));
  await Bun.sleep(2_000); // the audit log is written after the response
  const steady: Record<string, unknown> = {};
  for (const [i, { t, pid, host }] of pids.entries()) {
    const start = starts[i] as (typeof starts)[number];
    const file = `${dir}/${t.agent.id}.data`;
    const byThread = await perfReport(file, "comm");
    steady[t.agent.id] = {
      ...windowReport(t, audit, start.snap, snapshot(t)),
      cpuSeconds: round((await cpuSeconds(t.node, pid)) - start.cpu, 2),
      perf: {
        hz: PERF_HZ,
        sampledCpuSeconds: round(byThread.reduce((s, r) => s + r.samples, 0) / PERF_HZ, 2),
        threads: threadNames(host),
        byThread,
        byBinary: await perfReport(file, "dso"),
        kernelSymbols: await perfReport(file, "sym", 15, ["--dsos", "[kernel.kallsyms]"]),
      },
    };
  }
  result.steady = steady;
} finally {
  for (const t of traced) {
    await t.node.stop().catch((err: unknown) => console.error(`stopping ${t.name}: ${String(err)}`));
    await t.relay.close();
  }
  await kubelet?.stop(true);
  await cluster.stop();
}

// ---------------------------------------------------------------- output

const date = new Date().toISOString().slice(0, 10);
const saved = saveResult("trace", { date, ...result }, date);
type Window = ReturnType<typeof windowReport>;
type Perf = { sampledCpuSeconds: number; threads: Record<string, number>; byThread: PerfRow[]; byBinary: PerfRow[]; kernelSymbols: PerfRow[] };
const kib = (b: number) => `${round(b / 1024, 1)} KiB`;
const lines: string[] = [];
const describe = (title: string, w: Window) => {
  lines.push(`${title}: ${w.seconds} s, ${w.protocols.join("+")}; plaintext sent ${kib(w.plaintext.sent)} received ${kib(w.plaintext.received)}; wire sent ${kib(w.wire.sent)} received ${kib(w.wire.received)}; HTTP/2 control sent ${w.http2Control.sent} B received ${w.http2Control.received} B`);
  lines.push(`  bytes in the window, per request started (a watch opened before counts what it received): ${"started".padStart(7)} ${"req head".padStart(8)} ${"req body".padStart(9)} ${"resp head".padStart(9)} ${"resp body".padStart(10)}`);
  for (const [k, g] of Object.entries(w.byRequest)) {
    const per = (n: number) => String(round(n / Math.max(1, g.started), 0));
    lines.push(`  ${k.padEnd(26)} ${String(g.started).padStart(7)} ${per(g.reqHead).padStart(8)} ${per(g.reqBody).padStart(9)} ${per(g.respHead).padStart(9)} ${per(g.respBody).padStart(10)}  ${g.requestEncodings.join(",")} → ${g.responseEncodings.join(",")}`);
    if (g.requestHeaders) lines.push(`    request headers (bytes): ${g.requestHeaders}`);
  }
};
for (const a of agents) {
  lines.push("", `== ${a.label}`);
  describe("first apply", (result.firstApply as Record<string, Window>)[a.id] as Window);
  const s = (result.steady as Record<string, Window & { cpuSeconds: number; perf: Perf }>)[a.id];
  if (!s) continue;
  describe("steady", s);
  lines.push(`  CPU ${s.cpuSeconds} s (/proc), perf sampled ${s.perf.sampledCpuSeconds} s; threads ${JSON.stringify(s.perf.threads)}`);
  lines.push(`  by thread: ${s.perf.byThread.map((r) => `${r.key} ${r.percent}%`).join(", ")}`);
  lines.push(`  by binary: ${s.perf.byBinary.map((r) => `${r.key} ${r.percent}%`).join(", ")}`);
  lines.push("  in the kernel (share of all samples):", ...s.perf.kernelSymbols.map((r) => `    ${String(r.percent).padStart(5)}%  ${r.key}`));
}
lines.push(`written to ${saved}`);
console.error(lines.join("\n"));
