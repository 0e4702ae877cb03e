// Runtime settings that only the environment reaches. Bun reads its GC timer's, mimalloc's and
// JavaScriptCore's settings from environment variables before any JavaScript runs, so the agent gets
// them by executing itself once more, in place (same PID: systemd's MainPID, sd_notify and the
// watchdog stay with it), with the variables set. The decision is here, pure; src/runtime.ts acts on it.
//
// Rules: a variable the operator set (in the unit, a drop-in, the shell) wins over trellis's value;
// TRELLIS_RUNTIME_ENV=off leaves the runtime's defaults alone; a guard variable marks the process that
// was executed this way, so it never executes again. A setting the runtime refuses at start-up (Bun
// ends with "invalid JSC environment variable" for a BUN_JSC_* name it does not know) must not
// crash-loop the agent: before executing, a marker naming this binary and the variables is written to
// a directory cleared at boot, and the executed process removes it as its first act. A marker still
// there at the next start means the runtime ended before trellis ran: that start runs without the
// settings and warns, and so does every start after it until the binary or the settings change or the
// machine reboots.

declare const TRELLIS_RUNTIME_ENV: string | undefined;

/** The variables build/compile.ts baked into this executable; none when the source runs directly. */
export function bakedRuntimeEnv(): Record<string, string> {
  return typeof TRELLIS_RUNTIME_ENV === "string" ? (JSON.parse(TRELLIS_RUNTIME_ENV) as Record<string, string>) : {};
}

/** In the environment of the process trellis executed with its settings: the names of the variables it added. */
export const reexecGuard = "TRELLIS_RUNTIME_REEXEC";
/** "off": trellis sets no runtime variable (an operator's escape hatch). */
export const optOutVariable = "TRELLIS_RUNTIME_ENV";
/** Where the marker of an execution in flight is kept: a tmpfs, so a reboot tries again. */
export const reexecMarkerPath = "/run/trellis/runtime-reexec.json";

/** What the marker records: which binary executed itself with which variables. */
export type ReexecMarker = { binary: string; set: Record<string, string> };

export type RuntimeEnvDecision =
  /** Execute again with `env` (the current environment plus `set` and the guard). */
  | { action: "exec"; set: Record<string, string>; env: Record<string, string>; marker: ReexecMarker }
  /** This is the executed process: its settings took; the marker goes, and so do the guard and the
   *  added variables from the environment its own children get (`scrub`). */
  | { action: "executed"; set: Record<string, string>; scrub: string[] }
  /** Run as is; `warning` says why a wanted setting is not in effect. */
  | { action: "stay"; reason: string; warning?: string; set?: Record<string, string> };

const sameSet = (a: Record<string, string>, b: Record<string, string>) => {
  const ka = Object.keys(a).sort();
  const kb = Object.keys(b).sort();
  return ka.length === kb.length && ka.every((k, i) => k === kb[i] && a[k] === b[k]);
};

/**
 * What to do at the agent's start. `wanted`: the baked variables; `env`: this process's environment;
 * `binary`: what identifies this executable (a new build tries again after a failure); `marker`: the
 * marker found at start, if any.
 */
export function decideRuntimeEnv(opts: {
  wanted: Record<string, string>;
  env: Record<string, string | undefined>;
  binary: string;
  marker: ReexecMarker | undefined;
}): RuntimeEnvDecision {
  const { wanted, env, binary, marker } = opts;
  const guard = env[reexecGuard];
  if (guard !== undefined) {
    const added = guard.split(",").filter((k) => k !== "" && env[k] !== undefined);
    return { action: "executed", set: Object.fromEntries(added.map((k) => [k, env[k] as string])), scrub: [reexecGuard, ...added] };
  }
  if (env[optOutVariable] === "off") return { action: "stay", reason: `${optOutVariable}=off` };
  // The operator's own value wins: only what the environment lacks is added.
  const set = Object.fromEntries(Object.entries(wanted).filter(([k]) => env[k] === undefined));
  if (Object.keys(set).length === 0) return { action: "stay", reason: Object.keys(wanted).length === 0 ? "no runtime settings in this build" : "the environment sets them all" };
  if (marker && marker.binary === binary && sameSet(marker.set, set)) {
    return {
      action: "stay",
      reason: "the runtime refused these settings",
      set,
      warning: "the previous start with these runtime settings ended before trellis ran (the runtime refused one of them?); running without them",
    };
  }
  const next: Record<string, string> = {};
  for (const [k, v] of Object.entries(env)) if (v !== undefined) next[k] = v;
  return { action: "exec", set, env: { ...next, ...set, [reexecGuard]: Object.keys(set).join(",") }, marker: { binary, set } };
}

/** The marker's content as read from disk; undefined when it is not one (then it is ignored). */
export function parseReexecMarker(text: string): ReexecMarker | undefined {
  try {
    const m = JSON.parse(text) as Partial<ReexecMarker>;
    if (typeof m.binary !== "string" || typeof m.set !== "object" || m.set === null) return undefined;
    if (!Object.values(m.set).every((v) => typeof v === "string")) return undefined;
    return { binary: m.binary, set: m.set as Record<string, string> };
  } catch {
    return undefined;
  }
}
