// Crash safety of src/host/files.ts for real: a child process rewrites files in a loop
// (files-crash-writer.ts) and is SIGKILLed at random moments. After every kill each file is exactly one of
// its two complete contents with its requested mode, and cleanupTemp leaves no temp file behind. Once on
// the host's disk, once inside a real node (overlayfs over a tmpfs upper layer). Also, in the node, that
// removeTree stops at mounts (which only a node's own mount namespace can safely have). Needs root.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { readdirSync, readFileSync, statSync } from "node:fs";
import type { Subprocess } from "bun";
import { createFiles } from "../../src/host/files.ts";
import { runDir, runOk } from "../harness/exec.ts";
import { bootNode, type Node } from "../harness/node.ts";
import { victims } from "./files-crash-writer.ts";

const writer = new URL("./files-crash-writer.ts", import.meta.url).pathname;

type Victim = Subprocess<"ignore", "pipe", "pipe">;

/** Where the writer runs, and how the test reaches what it wrote. */
type Target = {
  label: string;
  /** The writer's directory as the test process sees it. */
  hostDir: string;
  /** Starts the writer's endless loop. */
  start(): Victim;
  /** The host PID of the writer itself (the spawned process may be a wrapper around it). */
  writerPid(p: Victim): number;
  /** cleanupTemp on the directory, as the writer sees it. */
  cleanup(): Promise<string[]>;
};

type Stats = { kills: number; delays: number[]; killsLeavingTemps: number; seen: Set<number>[] };

const tempsIn = (dir: string) => readdirSync(dir).filter((n) => n.includes(".trellis-tmp-")).sort();

/** Resolves once the writer says it entered its loop. */
async function untilWriting(p: Victim): Promise<void> {
  const reader = p.stdout.getReader();
  const { value } = await reader.read();
  reader.releaseLock();
  if (!value || !new TextDecoder().decode(value).startsWith("writing")) {
    throw new Error(`the writer did not start (exit ${await p.exited}): ${await new Response(p.stderr).text()}`);
  }
}

/** Checks the invariant after one kill: every file complete (one of its two contents) with its mode. */
async function checkAfterKill(t: Target, kill: number, delay: number, stats: Stats): Promise<void> {
  const left = tempsIn(t.hostDir);
  for (const [i, v] of victims.entries()) {
    const path = `${t.hostDir}/${v.name}`;
    const content = readFileSync(path);
    const which = v.contents.findIndex((c) => content.equals(c));
    if (which < 0) throw new Error(`${t.label}: after kill ${kill} (${delay.toFixed(1)} ms) ${path} is torn: ${content.length} bytes`);
    expect({ path, mode: statSync(path).mode & 0o7777 }).toEqual({ path, mode: v.mode });
    stats.seen[i]?.add(which);
  }
  if (left.length > 0) stats.killsLeavingTemps++;
  expect(await t.cleanup()).toEqual(left);
  expect(tempsIn(t.hostDir)).toEqual([]);
}

async function crashLoop(t: Target, kills: number, maxDelayMs: number): Promise<Stats> {
  const stats: Stats = { kills: 0, delays: [], killsLeavingTemps: 0, seen: victims.map(() => new Set<number>()) };
  for (let k = 1; k <= kills; k++) {
    const p = t.start();
    const delay = Math.random() * maxDelayMs;
    try {
      await untilWriting(p);
      await Bun.sleep(delay);
      process.kill(t.writerPid(p), "SIGKILL");
      await p.exited;
    } finally {
      p.kill("SIGKILL"); // only matters when something above failed: never leave a writer running
    }
    stats.kills++;
    stats.delays.push(delay);
    await checkAfterKill(t, k, delay, stats);
  }
  const big = stats.seen[0] ?? new Set();
  console.log(
    `[files-crash] ${t.label}: ${stats.kills} kills after ${Math.min(...stats.delays).toFixed(1)}-${Math.max(...stats.delays).toFixed(1)} ms, ` +
      `${stats.killsLeavingTemps} left temp files, big file found with content(s) ${[...big].sort().join("+")}`,
  );
  return stats;
}

describe("writeAtomic survives SIGKILL at any instant", () => {
  test("on the host's disk: 60 kills", async () => {
    const root = runDir("files-crash"); // kept for post-mortems, like every run directory
    await runOk([process.execPath, writer, "init", root, "/data"]);
    const stats = await crashLoop(
      {
        label: "host",
        hostDir: `${root}/data`,
        start: () => Bun.spawn([process.execPath, writer, "write", root, "/data"], { stdin: "ignore", stdout: "pipe", stderr: "pipe" }),
        writerPid: (p) => p.pid,
        cleanup: () => createFiles(root).cleanupTemp("/data"),
      },
      60,
      40,
    );
    // Not vacuous: kills landed mid-write, and the files did change between kills.
    expect(stats.killsLeavingTemps).toBeGreaterThan(0);
    expect(stats.seen[0]?.size).toBe(2);
  }, 60_000);

  describe("inside a node", () => {
    let node: Node;
    const dir = "/var/lib/trellis-crash";
    const inNode = (...args: string[]) => ["nsenter", "-t", String(node.pid), "-a", "env", "-i", "PATH=/usr/bin:/bin", "HOME=/root", ...args];

    // The node has a /tmp of its own, so a checkout under /tmp is not visible inside it: the writer
    // goes in as one bundled file, the way the agent's binary does.
    const nodeWriter = "/root/files-crash-writer.js";

    beforeAll(async () => {
      node = await bootNode("files", { net: "private" });
      const bundle = `${runDir("files-crash")}/writer.js`;
      await runOk([process.execPath, "build", writer, "--target=bun", `--outfile=${bundle}`]);
      await node.install(bundle, nodeWriter, 0o644);
    }, 60_000);
    afterAll(() => node?.stop(), 30_000);

    test("on the node's overlay filesystem: 10 kills", async () => {
      await node.execOk(["bun", nodeWriter, "init", "/", dir]);
      expect((await node.execOk(["stat", "-f", "-c", "%T", dir])).trim()).toBe("overlayfs");
      await crashLoop(
        {
          label: `node ${node.name}`,
          hostDir: `${node.root}${dir}`,
          start: () => Bun.spawn(inNode("bun", nodeWriter, "write", "/", dir), { stdin: "ignore", stdout: "pipe", stderr: "pipe" }),
          // nsenter forks to enter the PID namespace; its one child is the writer (env execs bun).
          writerPid: (p) => {
            const children = readFileSync(`/proc/${p.pid}/task/${p.pid}/children`, "utf8").trim().split(" ");
            if (children.length !== 1 || !children[0]) throw new Error(`nsenter ${p.pid} has children "${children.join(" ")}", want one`);
            return Number(children[0]);
          },
          cleanup: async () => JSON.parse(await node.execOk(["bun", nodeWriter, "cleanup", "/", dir])) as string[],
        },
        10,
        40,
      );
    }, 60_000);

    test("removeTree does not enter another mount in the tree: a tmpfs, nor a bind mount of the same file system", async () => {
      const tree = "/var/lib/trellis-tree";
      const other = "/var/lib/trellis-bound";
      await node.execOk(["sh", "-c", `mkdir -p ${tree}/m1 ${tree}/m2 ${other} && touch ${tree}/a ${other}/precious && mount -t tmpfs -o mode=0755 tmpfs ${tree}/m1 && touch ${tree}/m1/on-tmpfs && mount --bind ${other} ${tree}/m2`]);
      const files = createFiles(node.root);
      try {
        await expect(files.removeTree(tree)).rejects.toThrow(`${tree}/m1 is a mount point`);
        expect((await node.exec(["test", "-e", `${tree}/m1/on-tmpfs`])).code).toBe(0);
        await node.execOk(["umount", `${tree}/m1`]);
        await expect(files.removeTree(tree)).rejects.toThrow(`${tree}/m2 is a mount point`);
        expect((await node.exec(["test", "-e", `${other}/precious`])).code).toBe(0);
      } finally {
        await node.exec(["sh", "-c", `umount ${tree}/m1 2>/dev/null; umount ${tree}/m2 2>/dev/null; true`]);
      }
      expect(await files.removeTree(tree)).toBe(true);
      expect((await node.exec(["test", "-e", tree])).code).toBe(1);
      expect((await node.exec(["test", "-e", `${other}/precious`])).code).toBe(0);
    }, 60_000);
  });
});
