// What a node operator expects of the agent's unit (issue 15 item 5), with the compiled binary under
// real systemd: sd_notify READY after the first reconcile, journald priorities, SIGHUP re-reading the
// log level, the watchdog killing and restarting a SIGSTOPped agent, SIGTERM while it looks for its Node.
import { afterAll, beforeAll, expect, test } from "bun:test";
import { CoreV1Api } from "@kubernetes/client-node";
import { agentUnit } from "../../src/api/agent-unit.ts";
import { type AgentNode, mainPid, putOscSecret, registerNode, startAgentNode, unitProperty, waitApplied } from "../harness/agent.ts";
import { type Cluster, startCluster } from "../harness/cluster.ts";
import { waitFor } from "../harness/exec.ts";
import { oneFileOsc } from "../fixtures/one-file-osc.ts";

const secretName = "gardener-node-agent-ops";
const configPath = "/var/lib/gardener-node-agent/config.yaml";
/** Short, so that the SIGSTOP test takes seconds; the unit trellis writes says 60 s. */
const watchdogSec = 3;

const osc = (version: number) => oneFileOsc("ops", "/etc/ops/version", `${version}\n`);

let cluster: Cluster;
let agent: AgentNode;

/** The agent's journal lines (JSON, with their PRIORITY) since the node booted. */
async function journal(...args: string[]): Promise<{ priority: string; pid: number; message: string }[]> {
  const out = await agent.node.execOk(["journalctl", "-u", agentUnit, "-o", "json", "--no-pager", "--output-fields=PRIORITY,MESSAGE,_PID", ...args]);
  return out
    .split("\n")
    .filter((l) => l.startsWith("{"))
    .map((l) => JSON.parse(l) as { PRIORITY: string; MESSAGE: string | number[]; _PID?: string })
    .map((e) => ({ priority: e.PRIORITY, pid: Number(e._PID), message: typeof e.MESSAGE === "string" ? e.MESSAGE : Buffer.from(e.MESSAGE).toString() }));
}
const agentLines = async (...args: string[]) => (await journal(...args)).filter((l) => l.message.startsWith("{")).map((l) => ({ ...l, doc: JSON.parse(l.message) as { level: string; msg: string; checksum?: string } }));

async function setLogLevel(level: string): Promise<void> {
  const text = await agent.node.readFile(configPath);
  await agent.node.writeFile(configPath, `${text.replace(/^logLevel: .*\n/m, "")}logLevel: ${level}\n`, 0o600);
}

beforeAll(async () => {
  cluster = await startCluster({ controllerManager: false });
  agent = await startAgentNode(cluster, { prefix: "ops", secretName, start: false });
  await agent.node.writeFile(`/etc/systemd/system/${agentUnit}.d/watchdog.conf`, `[Service]\nWatchdogSec=${watchdogSec}s\n`, 0o644);
  await agent.node.execOk(["systemctl", "daemon-reload"]);
  // An OSC Secret without its osc.yaml: the first reconcile ends with an error the journal must rank as one.
  await cluster.admin().makeApiClient(CoreV1Api).createNamespacedSecret({ namespace: "kube-system", body: { metadata: { name: secretName }, data: {} } });
  await agent.node.execOk(["systemctl", "start", "--no-block", agentUnit]);
}, 120_000);
afterAll(async () => {
  await agent?.node.stop();
  await cluster?.stop();
});

test("Type=notify: the unit is active once the first reconcile finished (READY=1 with a status), not before", async () => {
  expect(await unitProperty(agent.node, agentUnit, "Type")).toBe("notify");
  expect(await unitProperty(agent.node, agentUnit, "NotifyAccess")).toBe("main");
  await waitFor("the agent active", async () => (await unitProperty(agent.node, agentUnit, "ActiveState")) === "active", 60_000, 100);
  expect(await unitProperty(agent.node, agentUnit, "StatusText")).toBe("the first reconcile finished");
  // Ready came after the reconcile's verdict was logged.
  const lines = await agentLines();
  expect(lines.map((l) => l.doc.msg)).toContain("the OSC is invalid; nothing was changed on the node");
}, 90_000);

test("journald priorities: `journalctl -p warning` shows the agent's errors and warnings only, info lines are priority 6", async () => {
  const all = await agentLines();
  const invalid = all.find((l) => l.doc.msg === "the OSC is invalid; nothing was changed on the node");
  expect(invalid?.priority).toBe("3");
  expect(all.find((l) => l.doc.msg === "trellis starting")?.priority).toBe("6");
  // journald took the "<N>" prefix off: the MESSAGE is the JSON line itself.
  expect(all.every((l) => l.doc.level !== undefined)).toBe(true);
  const warnings = await agentLines("-p", "warning");
  expect(warnings.map((l) => l.doc.msg)).toContain("the OSC is invalid; nothing was changed on the node");
  expect(warnings.filter((l) => l.doc.level !== "error" && l.doc.level !== "warn")).toEqual([]);
}, 30_000);

test("SIGHUP (systemctl reload) re-reads the log level: the same process goes quiet at error, and speaks again at info", async () => {
  const pid = await mainPid(agent, agentUnit);
  await waitApplied(agent, await putOscSecret(cluster, secretName, osc(1)));

  await setLogLevel("error");
  await agent.node.execOk(["systemctl", "reload", agentUnit]);
  await waitFor("the reload logged", async () => (await agentLines()).some((l) => l.doc.msg === "log level set from the configuration (SIGHUP)"), 15_000);
  const quiet = await putOscSecret(cluster, secretName, osc(2));
  await waitApplied(agent, quiet);
  expect(await agent.node.readFile("/etc/ops/version")).toBe("2\n");

  await setLogLevel("info");
  await agent.node.execOk(["systemctl", "reload", agentUnit]);
  const loud = await putOscSecret(cluster, secretName, osc(3));
  await waitApplied(agent, loud);
  const applied = await waitFor("the apply of version 3 logged", async () => {
    const lines = (await agentLines()).filter((l) => l.doc.msg === "OSC applied");
    return lines.some((l) => l.doc.checksum === loud) ? lines : undefined;
  }, 15_000);
  expect(applied.filter((l) => l.doc.checksum === quiet)).toEqual([]);
  expect(await mainPid(agent, agentUnit)).toBe(pid);
}, 90_000);

test("the watchdog: a SIGSTOPped agent is killed by systemd and started again, and is ready again", async () => {
  const pid = await mainPid(agent, agentUnit);
  const restarts = Number(await unitProperty(agent.node, agentUnit, "NRestarts"));
  const started = performance.now();
  await agent.node.execOk(["kill", "-STOP", String(pid)]);
  await waitFor(
    "a new agent process, ready",
    async () => (await mainPid(agent, agentUnit)) !== pid && (await unitProperty(agent.node, agentUnit, "ActiveState")) === "active",
    60_000,
    200,
  );
  const seconds = (performance.now() - started) / 1000;
  console.log(`[agent-operability] SIGSTOP to a new ready agent: ${seconds.toFixed(1)} s (WatchdogSec=${watchdogSec}s)`);
  expect(Number(await unitProperty(agent.node, agentUnit, "NRestarts"))).toBe(restarts + 1);
  const systemdSaid = await agent.node.execOk(["journalctl", "-u", agentUnit, "-o", "cat", "--no-pager"]);
  expect(systemdSaid).toContain("Watchdog timeout");
  // The new process resumed where the old one was: the applied OSC is still what the Node says.
  expect(await agent.node.readFile("/etc/ops/version")).toBe("3\n");
}, 90_000);

/** Restarts the agent without waiting for it; returns a reader of the new process's log lines. */
async function restartAgent() {
  const before = await mainPid(agent, agentUnit);
  await agent.node.execOk(["systemctl", "restart", "--no-block", agentUnit]);
  const pid = await waitFor("the new agent process", async () => {
    const now = await mainPid(agent, agentUnit);
    return now !== before && now !== 0 ? now : undefined;
  });
  return async () => (await agentLines()).filter((l) => l.pid === pid);
}

test("SIGTERM while the agent looks for its Node (kubelet has not registered it): it ends at once, cleanly, and the next start resumes", async () => {
  await agent.core.deleteNode({ name: agent.name });
  const mine = await restartAgent();
  await waitFor("the new agent looking for its Node", async () => (await mine()).some((l) => l.doc.msg === "the Node is not registered yet; watching for it"), 30_000);
  const started = performance.now();
  await agent.node.execOk(["systemctl", "stop", agentUnit]);
  const seconds = (performance.now() - started) / 1000;
  console.log(`[agent-operability] stop while looking for the Node: ${seconds.toFixed(2)} s`);
  // The process ended by itself after its graceful stop: had a watch, timer or socket been left
  // running, its event loop would have kept it alive until systemd's SIGKILL (Result=timeout).
  expect(seconds).toBeLessThan(5);
  expect(await unitProperty(agent.node, agentUnit, "Result")).toBe("success");
  expect(await unitProperty(agent.node, agentUnit, "ExecMainStatus")).toBe("0");
  // The graceful stop, not a kill (journald may still be reading the stream when the stop returns).
  await waitFor("its stop logged", async () => (await mine()).some((l) => l.doc.msg === "trellis stopping"), 10_000);

  await registerNode(agent.core, agent.name);
  await agent.node.execOk(["systemctl", "start", "--no-block", agentUnit]);
  const checksum = await putOscSecret(cluster, secretName, osc(4));
  await waitApplied(agent, checksum, 60_000);
}, 120_000);

test("SIGTERM while the API server cannot be reached (watches retrying): it ends at once, cleanly, and resumes once it can", async () => {
  const kubeconfigPath = "/var/lib/gardener-node-agent/credentials/kubeconfig";
  const kubeconfig = await agent.node.readFile(kubeconfigPath);
  // Port 1 on loopback: connections refused at once, so every client of the agent keeps retrying.
  await agent.node.writeFile(kubeconfigPath, kubeconfig.replace(cluster.server, "https://127.0.0.1:1"), 0o600);
  const mine = await restartAgent();
  await waitFor("the agent failing to reach the API server", async () => (await mine()).some((l) => l.doc.level === "warn" || l.doc.level === "error"), 30_000);
  const started = performance.now();
  await agent.node.execOk(["systemctl", "stop", agentUnit]);
  const seconds = (performance.now() - started) / 1000;
  console.log(`[agent-operability] stop while the API server is unreachable: ${seconds.toFixed(2)} s`);
  expect(seconds).toBeLessThan(5);
  // Not a crash (an unhandled rejection of the Secret watch's first list ended it with status 1).
  expect(await unitProperty(agent.node, agentUnit, "Result")).toBe("success");
  expect(await unitProperty(agent.node, agentUnit, "ExecMainStatus")).toBe("0");
  await waitFor("its stop logged", async () => (await mine()).some((l) => l.doc.msg === "trellis stopping"), 10_000);

  await agent.node.writeFile(kubeconfigPath, kubeconfig, 0o600);
  await agent.node.execOk(["systemctl", "start", "--no-block", agentUnit]);
  await waitApplied(agent, await putOscSecret(cluster, secretName, osc(5)), 60_000);
}, 120_000);

test("SIGUSR2 with TRELLIS_HEAP_SNAPSHOT set writes a heap snapshot; after an apply it holds neither the OSC Secret's data nor the OSC's parse", async () => {
  const snapshot = "/var/tmp/trellis-heap.json";
  await agent.node.writeFile(`/etc/systemd/system/${agentUnit}.d/heap-snapshot.conf`, `[Service]\nEnvironment=TRELLIS_HEAP_SNAPSHOT=${snapshot}\n`, 0o644);
  await agent.node.execOk(["systemctl", "daemon-reload"]);
  const mine = await restartAgent();
  // Content no other object has: a string holding it is the parse (or the YAML) kept.
  const marker = `heap-marker-${crypto.randomUUID()}`;
  const text = osc(6).replace('"6\\n"', JSON.stringify(`${marker}\n`));
  const checksum = await putOscSecret(cluster, secretName, text);
  await waitApplied(agent, checksum, 60_000);
  // Its reconcile has ended (the Secret's data is let go of at its end): every "OSC applied" is counted
  // by the metric, which counts a reconcile once it ended, and nothing wakes the controller after it.
  const metricsUrl = `http://127.0.0.1:${agent.metricsPort}/metrics`;
  await waitFor("the apply's reconcile to end", async () => {
    const applied = (await mine()).filter((l) => l.doc.msg === "OSC applied");
    const counted = Number(/^trellis_reconcile_total\{result="applied"\} (\S+)$/m.exec(await (await fetch(metricsUrl)).text())?.[1]);
    return applied.at(-1)?.doc.checksum === checksum && counted === applied.length;
  }, 30_000);
  await agent.node.execOk(["kill", "-USR2", String(await mainPid(agent, agentUnit))]);
  await waitFor("the snapshot written", async () => (await mine()).some((l) => l.doc.msg === "heap snapshot written"), 30_000);
  const heap = JSON.parse(await Bun.file(`${agent.node.root}${snapshot}`).text()) as { snapshot: { meta: { node_fields: string[] } }; strings: string[] };
  expect(heap.snapshot.meta.node_fields).toContain("self_size");
  const base64 = Buffer.from(text).toString("base64");
  expect(heap.strings.filter((s) => s.includes(marker))).toEqual([]);
  expect(heap.strings.filter((s) => s.includes(base64.slice(100, 180)))).toEqual([]);
}, 120_000);
