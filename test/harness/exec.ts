// Process helpers shared by the test harness (tests may use Bun APIs; src/ may not).
import { mkdirSync } from "node:fs";
import { createServer } from "node:net";

export type RunResult = { code: number; stdout: string; stderr: string };

/** Runs a command to completion and returns its exit code and output; never throws on a non-zero exit. */
export async function run(
  cmd: string[],
  opts: { input?: string; env?: Record<string, string>; cwd?: string; timeoutMs?: number } = {},
): Promise<RunResult> {
  const proc = Bun.spawn(cmd, {
    stdin: opts.input === undefined ? "ignore" : new TextEncoder().encode(opts.input),
    stdout: "pipe",
    stderr: "pipe",
    env: opts.env ?? (process.env as Record<string, string>),
    cwd: opts.cwd,
    timeout: opts.timeoutMs ?? 120_000,
  });
  const [stdout, stderr, code] = await Promise.all([
    new Response(proc.stdout).text(),
    new Response(proc.stderr).text(),
    proc.exited,
  ]);
  return { code, stdout, stderr };
}

/** Like run(), but throws with the command's output when it fails. */
export async function runOk(cmd: string[], opts: Parameters<typeof run>[1] = {}): Promise<string> {
  const r = await run(cmd, opts);
  if (r.code !== 0) throw new Error(`${cmd.join(" ")} exited ${r.code}\nstdout: ${r.stdout}\nstderr: ${r.stderr}`);
  return r.stdout;
}

/** A TCP port on 127.0.0.1 that was free a moment ago (the kernel picks it). */
export function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const srv = createServer();
    srv.once("error", reject);
    srv.listen(0, "127.0.0.1", () => {
      const addr = srv.address();
      srv.close(() => (typeof addr === "object" && addr ? resolve(addr.port) : reject(new Error("no port"))));
    });
  });
}

/** Polls `check` until it returns a value other than undefined/false, or throws after `timeoutMs`. */
export async function waitFor<T>(
  what: string,
  check: () => Promise<T | undefined | false> | T | undefined | false,
  timeoutMs = 30_000,
  intervalMs = 100,
): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  let last: unknown;
  for (;;) {
    try {
      const v = await check();
      if (v !== undefined && v !== false) return v;
    } catch (err) {
      last = err;
    }
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}${last ? `: ${String(last)}` : ""}`);
    await Bun.sleep(intervalMs);
  }
}

/** Is this PID alive? */
export function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

// One parent directory per test process, so a run's state sits together and nothing is left empty.
const runBase = `/tmp/trellis-test/${process.pid}-${Date.now().toString(36)}`;

/** A fresh directory for this test run's state under /tmp/trellis-test. */
export function runDir(name: string): string {
  const dir = `${runBase}/${name}`;
  mkdirSync(dir, { recursive: true });
  return dir;
}

/** The error `p` rejects with, which must be an instance of `type` (the test fails otherwise). */
export async function rejection<E extends Error>(p: Promise<unknown>, type: new (...args: never[]) => E): Promise<E> {
  const err = await p.then(
    () => undefined,
    (e: unknown) => e,
  );
  if (!(err instanceof type)) throw new Error(`expected a ${type.name}, got ${String(err)}`);
  return err;
}
