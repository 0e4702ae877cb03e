// One trellis at a time (src/host/state-lock.ts), with two real processes: a holder
// (state-lock-holder.ts, as `trellis run` takes the lock) and this test process as the second comer.
import { afterEach, expect, test } from "bun:test";
import type { Subprocess } from "bun";
import { existsSync, readdirSync, writeFileSync } from "node:fs";
import { createFiles } from "../../src/host/files.ts";
import { lockStateDir, StateLockedError } from "../../src/host/state-lock.ts";
import { rejection, runDir } from "../harness/exec.ts";

const holderScript = new URL("./state-lock-holder.ts", import.meta.url).pathname;
let holder: Subprocess<"ignore", "pipe", "pipe"> | undefined;
afterEach(async () => {
  holder?.kill("SIGKILL");
  await holder?.exited;
  holder = undefined;
});

/** Starts the holder and resolves with what it says once it holds the lock. */
async function startHolder(lockPath: string, dir: string): Promise<{ pid: number; temp: string }> {
  holder = Bun.spawn([process.execPath, holderScript, lockPath, dir], { stdin: "ignore", stdout: "pipe", stderr: "pipe" });
  const reader = holder.stdout.getReader();
  const { value } = await reader.read();
  reader.releaseLock();
  if (!value) throw new Error(`the holder did not start (exit ${await holder.exited}): ${await new Response(holder.stderr).text()}`);
  const said = JSON.parse(new TextDecoder().decode(value)) as { temp: string };
  return { pid: holder.pid, temp: said.temp };
}

test("a second trellis is refused with the holder's PID; once the holder is killed (-9) the lock is free, nothing stale", async () => {
  const root = runDir("state-lock");
  const lockPath = `${root}/var/lib/gardener-node-agent/trellis/lock`;
  const { pid } = await startHolder(lockPath, root);

  const refused = await rejection(lockStateDir(lockPath, "apply"), StateLockedError);
  expect(refused.holder).toMatchObject({ pid, command: "run" });
  expect(refused.message).toContain(`another trellis is running on this machine: PID ${pid} (trellis run, since `);
  expect(refused.message).toContain(lockPath);
  // Refused again: a refusal takes nothing with it.
  await rejection(lockStateDir(lockPath, "bootstrap"), StateLockedError);

  holder?.kill("SIGKILL");
  await holder?.exited;
  const mine = await lockStateDir(lockPath, "apply");
  try {
    await rejection(lockStateDir(lockPath, "run"), StateLockedError); // held per open file, also within one process
  } finally {
    mine.release();
  }
  (await lockStateDir(lockPath, "run")).release();
}, 30_000);

test("temp-file cleanup keeps a live process's temp file and removes it once that process is gone", async () => {
  const root = runDir("state-lock-temp");
  const files = createFiles(root);
  await files.writeAtomic("/data/state.json", "{}\n", 0o600);
  const { temp } = await startHolder(`${root}/lock`, `${root}/data`);
  const dead = Bun.spawnSync(["true"]).pid;
  const stale = `.state.json.trellis-tmp-${dead}-0123456789ab`;
  writeFileSync(`${root}/data/${stale}`, "a killed writer's");
  const live = temp.slice(`${root}/data/`.length);

  expect(await files.cleanupTemp("/data")).toEqual([stale]);
  expect(existsSync(temp)).toBe(true);

  holder?.kill("SIGKILL");
  await holder?.exited;
  expect(await files.cleanupTemp("/data")).toEqual([live]);
  expect(readdirSync(`${root}/data`)).toEqual(["state.json"]);
}, 30_000);
