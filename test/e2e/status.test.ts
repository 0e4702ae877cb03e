// `trellis status`, the compiled binary inside a real node, reading the state file and a status file the
// real status board (src/status.ts) wrote: the exit code and what a person at the node reads.
import { afterAll, beforeAll, expect, test } from "bun:test";
import { mkdtempSync, readFileSync } from "node:fs";
import { statusPath, type StatusFile } from "../../src/api/status-file.ts";
import type { AgentState } from "../../src/api/state.ts";
import { statePath } from "../../src/apply/state-store.ts";
import { createFiles } from "../../src/host/files.ts";
import { createLogger } from "../../src/log.ts";
import { createStatusBoard } from "../../src/status.ts";
import { trellisBinary } from "../harness/binary.ts";
import { runDir, waitFor } from "../harness/exec.ts";
import { bootNode, type Node } from "../harness/node.ts";

let node: Node;
const status = (...args: string[]) => node.exec(["/opt/bin/trellis", "status", ...args], { timeoutMs: 30_000 });
const checksum = "6cb17c5988d9".padEnd(64, "a");

beforeAll(async () => {
  const binary = await trellisBinary();
  node = await bootNode("status");
  await node.install(binary, "/opt/bin/trellis");
}, 300_000);
afterAll(() => node?.stop(), 30_000);

/** What the agent's status board writes for these reports, as if written by the node's PID 1 (a live process there). */
async function statusFileOf(reports: Record<string, { ok: boolean; summary: string; [detail: string]: unknown }>): Promise<string> {
  const root = mkdtempSync(`${runDir("status-e2e")}/root-`);
  const board = createStatusBoard({ files: createFiles(root), log: createLogger({ write: () => {} }), minIntervalMs: 10 });
  for (const [name, report] of Object.entries(reports)) board.set(name, report);
  // Written (debounced) and not closed: a running agent's file. Polled, since a loaded machine delays the write.
  const file = await waitFor("the status board's file with every report", () => {
    const written = JSON.parse(readFileSync(root + statusPath, "utf8")) as StatusFile;
    return Object.keys(reports).every((name) => name in written.components) && written;
  });
  await board.close();
  return JSON.stringify({ ...file, pid: 1 });
}

test("a node without the agent: not running, nothing applied, exit 1", async () => {
  const r = await status();
  expect(r.code).toBe(1);
  expect(r.stdout).toContain(`agent:  not running: it has not written ${statusPath} since boot\n`);
  expect(r.stdout).toContain("OSC:    none applied yet\n");
}, 60_000);

test("a running agent with its OSC applied and every component ok: exit 0, and --json says the same", async () => {
  const state: AgentState = { version: 1, owned: { version: 1, files: {}, units: {} }, lastApplied: { checksum, at: new Date(Date.now() - 125_000).toISOString() } };
  await node.writeFile(statePath, JSON.stringify(state), 0o600);
  const lastRenew = new Date(Date.now() - 3_000).toISOString();
  await node.writeFile(statusPath, await statusFileOf({ osc: { ok: true, summary: "OSC 6cb17c5988d9 applied" }, lease: { ok: true, summary: "renewed", lastRenew, failures: 0 } }), 0o644);

  const r = await status();
  expect(r).toMatchObject({ code: 0, stderr: "" });
  const lines = r.stdout.trimEnd().split("\n");
  expect(lines[0]).toMatch(/^agent: {2}running \(pid 1, up \d+ s, status written \d+ s ago\)$/);
  expect(lines[1]).toMatch(/^OSC: {4}6cb17c5988d9 applied 2 m \d+ s ago \(.*\)$/);
  expect(lines[2]).toBe("apply:  nothing unfinished");
  expect(lines).toContain("  ok    osc    OSC 6cb17c5988d9 applied (0 s ago)");
  expect(lines.find((l) => l.includes("lease renewed"))).toMatch(/^ {15}lease renewed [34] s ago \(/);
  expect(lines.at(-1)).toBe("all ok");

  const json = await status("--json");
  expect(json.code).toBe(0);
  expect(JSON.parse(json.stdout)).toMatchObject({ ok: true, problems: [], agent: { running: true, pid: 1 }, osc: { checksum }, components: { lease: { ok: true, lastRenew } } });
}, 60_000);

test("an unfinished apply and unhealthy units: exit 1 naming both; a user without root still sees the components", async () => {
  const state: AgentState = {
    version: 1,
    owned: { version: 1, files: {}, units: {} },
    lastApplied: { checksum, at: new Date().toISOString() },
    progress: { checksum: "f580e02bbdcf".padEnd(64, "b"), plan: { checksum: "f580e02bbdcf".padEnd(64, "b"), steps: [{ kind: "daemon-reload", reason: "unit files changed" }] }, done: [] },
  };
  await node.writeFile(statePath, JSON.stringify(state), 0o600);
  await node.writeFile(
    statusPath,
    await statusFileOf({
      osc: { ok: true, summary: "OSC 6cb17c5988d9 applied" },
      units: { ok: false, summary: "1 unit unhealthy", units: [{ unit: "kubelet.service", health: "unhealthy", why: "failed" }], lastError: "kubelet.service: start request repeated too quickly" },
    }),
    0o644,
  );

  const r = await status();
  expect(r.code).toBe(1);
  expect(r.stdout).toContain("apply:  unfinished: OSC f580e02bbdcf, 0 of 1 steps done\n");
  expect(r.stdout).toContain("  FAIL  units  1 unit unhealthy (0 s ago)\n               units not healthy: kubelet.service (unhealthy: failed)\n               last error: kubelet.service: start request repeated too quickly\n");
  expect(r.stdout).toEndWith(
    "2 problem(s):\n  - the apply of OSC f580e02bbdcf is unfinished (0 of 1 steps done); the agent resumes it when it runs\n  - units: 1 unit unhealthy\n",
  );

  // The status file is world-readable; the state file (ownership records) is root's.
  const nobody = await node.exec(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "/opt/bin/trellis", "status"], { timeoutMs: 30_000 });
  expect(nobody.code).toBe(1);
  expect(nobody.stdout).toContain("  FAIL  units  1 unit unhealthy");
  expect(nobody.stdout).toContain("OSC:    unknown (the state cannot be read)\napply:  unknown\n");
  expect(nobody.stdout).toContain(`  - cannot read the agent's state: read "${statePath}": permission denied (EACCES)\n`);
}, 60_000);

test("an agent that stopped cleanly, and one whose status went stale, are not running", async () => {
  const written = JSON.parse(await statusFileOf({ osc: { ok: true, summary: "applied" } })) as StatusFile;
  await node.writeFile(statusPath, JSON.stringify({ ...written, stoppedAt: new Date(Date.now() - 61_000).toISOString() }), 0o644);
  const stopped = await status();
  expect(stopped.code).toBe(1);
  expect(stopped.stdout).toMatch(/^agent: {2}stopped 1 m [12] s ago \(/);

  await node.writeFile(statusPath, JSON.stringify({ ...written, writtenAt: new Date(Date.now() - 600_000).toISOString() }), 0o644);
  const stale = await status();
  expect(stale.code).toBe(1);
  expect(stale.stdout).toMatch(/^agent: {2}not answering: its status is 10 m 0 s old \(rewritten every 30 s\)\n/);
}, 60_000);
