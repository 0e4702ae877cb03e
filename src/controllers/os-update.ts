// The OS update of an in-place update, on the node: the OS extension's command
// (status.inPlaceUpdates.osUpdate) run as gardener-node-agent runs it, and its outcome told after the
// machine restarted. What to do next is decided in src/plan/os-update.ts; this does it.
import { type ExecFileException, execFile } from "node:child_process";
import type { InPlaceState } from "../api/in-place-state.ts";
import type { Files } from "../host/files.ts";
import type { Kube } from "../kube/client.ts";
import { patchNodeMetadata } from "../kube/node.ts";
import { describeError, type Logger } from "../log.ts";
import { osVersionOf, sameVersion } from "../plan/in-place.ts";
import { decideOsUpdate } from "../plan/os-update.ts";
import { abortableSleep, monotonicMs } from "../time.ts";
import type { NodeSource } from "./types.ts";

/** gardener-node-agent's mark of an OS update it started, and machine-controller-manager's failure reason; both cleared with a success. */
export const updatingOsVersion = "node-agent.gardener.cloud/updating-operating-system-version";
export const updateFailedReason = "node.machine.sapcloud.io/update-failed-reason";

const osRelease = "/etc/os-release";

/** The node's OS version, as kubelet reports it (undefined: os-release names none). */
export async function nodeOsVersion(files: Files): Promise<string | undefined> {
  const release = await files.read(osRelease);
  return release && osVersionOf(new TextDecoder().decode(release));
}

/** How gardener-node-agent runs the OS extension's update command: again every 30 s for up to 5 min while it reports network problems. */
export const osUpdateRetry = { intervalMs: 30_000, timeoutMs: 5 * 60_000, retriable: /network problems/i };
/** Output gardener-node-agent names a non-retriable error (it ends the update at once, as any other failure). */
const nonRetriable = /invalid arguments|system failure/i;
/** The command's output kept in the reason: the Node's annotations are bounded (256 KiB in all). */
const maxOutput = 2000;

/** How Go's os/exec names a command's failure (its ExitError or start error): gardener-node-agent's reason carries that text. */
function goExecError(err: ExecFileException, command: string): string {
  if (typeof err.code === "number") return `exit status ${err.code}`;
  if (err.signal) return `signal: ${goSignalNames[err.signal] ?? err.signal}`;
  if (err.code === "ENOENT") return `fork/exec ${command}: no such file or directory`;
  if (err.code === "EACCES") return `fork/exec ${command}: permission denied`;
  return describeError(err);
}
const goSignalNames: Record<string, string> = { SIGKILL: "killed", SIGTERM: "terminated", SIGINT: "interrupt", SIGHUP: "hangup", SIGABRT: "aborted", SIGSEGV: "segmentation fault", SIGPIPE: "broken pipe" };

/**
 * The failure as gardener-node-agent words it (machine-controller-manager shows it as the machine's
 * update-failed reason): its retry's kind of error, Go's exit text and the command's output as it was.
 * `retriesOver`: network problems still reported when the retries' time ran out.
 */
export function osUpdateFailure(error: string, output: string, retriesOver: boolean): string {
  const kept = output.length > maxOutput ? output.slice(-maxOutput) : output;
  if (retriesOver) return `failed to execute OS update command: retry failed with context deadline exceeded, last error: retriable error detected: ${error}, output: ${kept}`;
  return `failed to execute OS update command: ${nonRetriable.test(output) ? "non-retriable" : "no specific"} error detected: ${error}, output: ${kept}`;
}
/** One run of the command may take this long (gardener-node-agent's bound for an in-place reconcile). */
const osUpdateRunMs = 10 * 60_000;

export type OsUpdateRun = { ok: true } | { failed: string } | { stopped: string };

/** How long `systemctl is-system-running` may take to answer. */
const systemStateTimeoutMs = 5_000;

/**
 * Whether systemd is shutting the machine down. Asked with systemctl, which as root talks to PID 1 over
 * its private socket: the system bus may already be gone, as dbus.service is stopped alongside the agent.
 * False when systemd cannot be asked.
 */
export function machineStopping(): Promise<boolean> {
  return new Promise((resolve) => {
    execFile("systemctl", ["is-system-running"], { timeout: systemStateTimeoutMs, killSignal: "SIGKILL" }, (_err, stdout) => resolve(stdout.trim() === "stopping"));
  });
}

export type RunOsUpdateOptions = {
  retry?: typeof osUpdateRetry;
  /** Whether the machine is shutting down (default: machineStopping). */
  machineStopping?: () => Promise<boolean>;
};

/**
 * Runs the OS update command until it succeeds, fails for a reason other than network problems, or the
 * retries' time is up. `stopped`: the agent is stopping, or the machine is shutting down (the command may
 * be what restarts the machine).
 */
export async function runOsUpdate(command: string, args: string[], signal: AbortSignal, opts: RunOsUpdateOptions = {}): Promise<OsUpdateRun> {
  const { retry = osUpdateRetry, machineStopping: stopping = machineStopping } = opts;
  const agentStops = { stopped: "the agent stopped while the OS update command ran" };
  const deadline = monotonicMs() + retry.timeoutMs;
  for (;;) {
    const outcome = await new Promise<{ error?: string; output: string }>((resolve) => {
      execFile(command, args, { timeout: osUpdateRunMs, killSignal: "SIGKILL", maxBuffer: 1 << 20, signal }, (err, stdout, stderr) => {
        const output = `${stdout}${stderr}`;
        resolve(err ? { error: goExecError(err, command), output } : { output });
      });
    });
    if (signal.aborted) return agentStops;
    if (outcome.error === undefined) return { ok: true };
    // The shutdown a reboot starts ends the command with the agent's unit, and the agent may see that exit
    // before its own SIGTERM. systemd says "stopping" from the moment it queued the shutdown, before it
    // stops any unit: such an exit is no failure of the update, and the next boot judges it by os-release.
    if (await stopping()) return { stopped: "the machine is shutting down while the OS update command ran" };
    const retriable = retry.retriable.test(outcome.output);
    if (!retriable || monotonicMs() + retry.intervalMs > deadline) return { failed: osUpdateFailure(outcome.error, outcome.output, retriable) };
    await abortableSleep(retry.intervalMs, signal);
    if (signal.aborted) return agentStops;
  }
}

export type OsUpdate = { command: string; args?: string[] | null };

/**
 * What is left of the OS update: failed (`told`: the Node says so already; `tried: false`: nothing was
 * run, so machine-controller-manager is told nothing, as gardener-node-agent only returns an error),
 * waiting for the machine to restart, cut short because the agent stops or the machine shuts down
 * (nothing is told: the next start judges the attempt), or done (undefined).
 */
export type OsUpdateOutcome = { failed: string; final: boolean; told?: boolean; tried?: false } | { waiting: string } | { stopped: string } | undefined;

export type OsUpdaterDeps = {
  kube: Kube;
  files: Files;
  node: NodeSource;
  log: Logger;
  signal: AbortSignal;
  /** The in-place state file, where the attempt is recorded. */
  store: { read(): Promise<InPlaceState>; write(state: InPlaceState): Promise<void> };
  /** This boot of the machine (src/host/boot-clock.ts, machineBoot). */
  boot: () => string;
  retry?: typeof osUpdateRetry;
};

export function createOsUpdater(deps: OsUpdaterDeps) {
  const recordAttempt = async (attempt: InPlaceState["osUpdate"]) => deps.store.write({ ...(await deps.store.read()), osUpdate: attempt });

  /** Brings the node to OS version `want` with the OS extension's command `osUpdate`, or says why not yet, or why never. */
  async function update(want: string, osUpdate: OsUpdate | null | undefined): Promise<OsUpdateOutcome> {
    const have = await nodeOsVersion(deps.files);
    const attempt = (await deps.store.read()).osUpdate;
    const annotations = deps.node.current()?.metadata?.annotations ?? {};
    const boot = deps.boot();
    const decision = decideOsUpdate({ want, have, attempt, boot, node: { updating: annotations[updatingOsVersion], failedReason: annotations[updateFailedReason] } });
    switch (decision.next) {
      case "done":
        return undefined;
      case "wait":
        return { waiting: decision.why };
      case "fail":
        // Remembered on the node too: the Node may be patched back by someone, the attempt stays failed.
        if (attempt?.failed !== decision.why) await recordAttempt({ version: want, boot: attempt?.boot ?? boot, finished: attempt?.finished ?? false, failed: decision.why });
        return { failed: decision.why, final: true, told: decision.told };
    }
    // The OS extension provides the command in the OSC's status; without it, nothing was tried: retried.
    if (!osUpdate?.command) return { failed: "status.inPlaceUpdates.osUpdate.command: the OSC names no OS update command (the OS extension provides it)", final: false, tried: false };
    // Recorded before it runs (the command usually restarts the machine, and never returns), then the
    // Node marked as gardener-node-agent marks it.
    await recordAttempt({ version: want, boot, finished: false });
    const name = deps.node.current()?.metadata?.name;
    if (name) await patchNodeMetadata(deps.kube, name, { annotations: { [updatingOsVersion]: want } });
    deps.log.info("running the OS update command", { command: osUpdate.command, args: osUpdate.args ?? [], version: want, ...(decision.again ? { again: decision.again } : {}) });
    const run = await runOsUpdate(osUpdate.command, osUpdate.args ?? [], deps.signal, deps.retry ? { retry: deps.retry } : {});
    if ("stopped" in run) return run;
    if ("failed" in run) {
      await recordAttempt({ version: want, boot, finished: false, failed: run.failed });
      return { failed: run.failed, final: true };
    }
    await recordAttempt({ version: want, boot, finished: true });
    const now = await nodeOsVersion(deps.files);
    if (now !== undefined && sameVersion(now, want)) return undefined;
    return { waiting: `the OS update to ${want} ran; the machine has not restarted into it yet` };
  }

  return { update };
}
