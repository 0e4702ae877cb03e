// The runtime settings baked into the compiled agent (build/compile.ts; src/runtime-env.ts) under real
// systemd: `trellis run` executes itself once, in place, with the runtime variables it was built with;
// the process systemd tracks is the one that has them; an operator's own value wins; and a variable the
// runtime refuses (an unknown BUN_JSC_* name, as after a Bun upgrade) costs one failed start, never a
// crash loop: the next start runs without the settings and says so.
import { afterAll, beforeAll, expect, test } from "bun:test";
import { agentUnit } from "../../src/api/agent-unit.ts";
import { reexecMarkerPath } from "../../src/runtime-env.ts";
import { type AgentNode, mainPid, putOscSecret, startAgentNode, unitProperty, waitApplied } from "../harness/agent.ts";
import { repoRoot, trellisBinary } from "../harness/binary.ts";
import { type Cluster, startCluster } from "../harness/cluster.ts";
import { runDir, runOk, waitFor } from "../harness/exec.ts";
import type { Node } from "../harness/node.ts";
import { oneFileOsc } from "../fixtures/one-file-osc.ts";

const osc = oneFileOsc("runtime", "/etc/runtime-env/ok", "ok\n");

let cluster: Cluster;
const nodes: Node[] = [];

beforeAll(async () => {
  cluster = await startCluster({ controllerManager: false });
}, 120_000);
afterAll(async () => {
  for (const n of nodes) await n.stop();
  await cluster?.stop();
});

/** The environment of a process in the node, as the kernel holds it. */
async function environ(node: Node, pid: number): Promise<Record<string, string>> {
  const raw = await node.execOk(["cat", `/proc/${pid}/environ`]);
  return Object.fromEntries(raw.split("\0").filter(Boolean).map((kv) => kv.split(/=(.*)/s, 2) as [string, string]));
}

type Line = { level: string; msg: string; runtime?: { execArgv: string[]; env: Record<string, string> }; reason?: string };
async function agentLines(node: Node, pid?: number): Promise<Line[]> {
  const out = await node.execOk(["journalctl", ...(pid ? [`_PID=${pid}`] : ["-u", agentUnit]), "-o", "cat", "--no-pager"]);
  return out.split("\n").filter((l) => l.startsWith("{")).map((l) => JSON.parse(l) as Line);
}

/** Starts an agent with `binary` (and a drop-in with `env`), and waits until it is ready (its first reconcile). */
async function readyAgent(prefix: string, binary: string, env: Record<string, string> = {}): Promise<AgentNode> {
  const secretName = `gardener-node-agent-${prefix}`;
  const agent = await startAgentNode(cluster, { prefix, secretName, binary, start: false });
  nodes.push(agent.node);
  if (Object.keys(env).length > 0) {
    const lines = Object.entries(env).map(([k, v]) => `Environment=${k}=${v}`);
    await agent.node.writeFile(`/etc/systemd/system/${agentUnit}.d/50-operator.conf`, `[Service]\n${lines.join("\n")}\n`);
    await agent.node.execOk(["systemctl", "daemon-reload"]);
  }
  await agent.node.execOk(["systemctl", "start", "--no-block", agentUnit]);
  await waitApplied(agent, await putOscSecret(cluster, secretName, osc), 60_000);
  await waitFor("the agent active (READY)", async () => (await unitProperty(agent.node, agentUnit, "ActiveState")) === "active", 30_000);
  return agent;
}

test("the shipped binary runs with its baked flags and variables: in the very process systemd tracks, started once", async () => {
  const binary = await trellisBinary();
  const baked = JSON.parse(await runOk([binary, "version", "--json"])) as { execArgv: string[]; runtimeEnv: Record<string, string> };
  expect(Object.keys(baked.runtimeEnv).length).toBeGreaterThan(0);
  const agent = await readyAgent("rtenv", binary);
  const pid = await mainPid(agent, agentUnit);
  const env = await environ(agent.node, pid);
  for (const [k, v] of Object.entries(baked.runtimeEnv)) expect(env[k]).toBe(v);
  expect(env.TRELLIS_RUNTIME_REEXEC).toBe(Object.keys(baked.runtimeEnv).join(","));
  expect(Number(await unitProperty(agent.node, agentUnit, "NRestarts"))).toBe(0);
  // Executed in place: the same PID, started as systemd started it.
  expect((await agent.node.execOk(["cat", `/proc/${pid}/cmdline`])).split("\0")[0]).toBe("/opt/bin/gardener-node-agent");
  const starting = (await agentLines(agent.node, pid)).filter((l) => l.msg === "trellis starting");
  expect(starting).toHaveLength(1);
  expect(starting[0]?.runtime).toEqual({ execArgv: baked.execArgv, env: baked.runtimeEnv });
  expect((await agentLines(agent.node)).filter((l) => l.level === "warn" && l.reason !== undefined)).toEqual([]);
  expect(await agent.node.exec(["test", "-e", reexecMarkerPath])).toMatchObject({ code: 1 });
}, 180_000);

test("an operator's own value wins over the baked one, and TRELLIS_RUNTIME_ENV=off leaves the runtime's defaults", async () => {
  const binary = await trellisBinary();
  const baked = (JSON.parse(await runOk([binary, "version", "--json"])) as { runtimeEnv: Record<string, string> }).runtimeEnv;
  const [name, ...others] = Object.keys(baked) as [string, ...string[]];
  const agent = await readyAgent("rtenvop", binary, { [name]: "12345" });
  const env = await environ(agent.node, await mainPid(agent, agentUnit));
  expect(env[name]).toBe("12345");
  for (const k of others) expect(env[k]).toBe(baked[k] as string);
  const line = (await agentLines(agent.node)).find((l) => l.msg === "trellis starting");
  expect(Object.keys(line?.runtime?.env ?? {})).toEqual(others);

  await agent.node.execOk(["rm", `/etc/systemd/system/${agentUnit}.d/50-operator.conf`]);
  await agent.node.writeFile(`/etc/systemd/system/${agentUnit}.d/60-off.conf`, "[Service]\nEnvironment=TRELLIS_RUNTIME_ENV=off\n");
  await agent.node.execOk(["systemctl", "daemon-reload"]);
  await agent.node.execOk(["systemctl", "restart", agentUnit]);
  const off = await environ(agent.node, await mainPid(agent, agentUnit));
  for (const k of Object.keys(baked)) expect(off[k]).toBeUndefined();
  expect(off.TRELLIS_RUNTIME_REEXEC).toBeUndefined();
}, 180_000);

test("a variable the runtime refuses costs one failed start, not a crash loop: the agent then runs without its settings and warns", async () => {
  // A JavaScriptCore option this Bun does not know, as a baked name would be after a Bun upgrade
  // (a native build refuses to ship one; a cross build cannot check).
  const binary = `${runDir("runtime-env")}/trellis-bad-knob`;
  await runOk(["bun", "run", "build/compile.ts", "--outfile", binary, "--runtime-env=BUN_JSC_noSuchOptionInThisBun=1;BUN_IDLE_GC_SECONDS=0", "--unchecked-runtime-env"], { cwd: repoRoot, timeoutMs: 300_000 });
  const agent = await readyAgent("rtenvbad", binary);
  // The first start executed itself with the variable, and the runtime ended it before trellis ran;
  // systemd started it again (Restart=always), and that start ran without.
  expect(Number(await unitProperty(agent.node, agentUnit, "NRestarts"))).toBe(1);
  const journal = await agent.node.execOk(["journalctl", "-u", agentUnit, "-o", "cat", "--no-pager"]);
  expect(journal).toContain("invalid JSC environment variable");
  const pid = await mainPid(agent, agentUnit);
  const env = await environ(agent.node, pid);
  expect(env.BUN_JSC_noSuchOptionInThisBun).toBeUndefined();
  expect(env.BUN_IDLE_GC_SECONDS).toBeUndefined();
  const lines = await agentLines(agent.node, pid);
  const warning = lines.find((l) => l.level === "warn" && l.reason === "the runtime refused these settings");
  expect(warning?.msg).toContain("ended before trellis ran");
  expect(lines.find((l) => l.msg === "trellis starting")?.runtime?.env).toEqual({});
  // Every later start of the same binary remembers it (until the machine reboots): no more failed starts.
  // (A restart by hand sets NRestarts back to 0; it counts systemd's own restarts after a failure.)
  await agent.node.execOk(["systemctl", "restart", agentUnit]);
  const again = await mainPid(agent, agentUnit);
  expect(again).not.toBe(pid);
  expect(Number(await unitProperty(agent.node, agentUnit, "NRestarts"))).toBe(0);
  expect((await agentLines(agent.node, again)).some((l) => l.reason === "the runtime refused these settings")).toBe(true);
}, 300_000);
