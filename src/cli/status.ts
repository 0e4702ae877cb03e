// `trellis status`: how this node's agent is doing, for a person at the node — which OSC is applied and
// when, whether an apply is unfinished (state.json), what each controller last reported and whether the
// agent runs at all (the status file it keeps fresh on /run). Reads files only: it works while the
// agent is down, and needs no credentials.
import { parseArgs } from "node:util";
import * as v from "valibot";
import { formatIssues } from "../api/issues.ts";
import { statusPath, type StatusFile, StatusFileSchema } from "../api/status-file.ts";
import { createStateStore, statePath } from "../apply/state-store.ts";
import type { ComponentStatus } from "../controllers/types.ts";
import { createFiles, type Files } from "../host/files.ts";
import { UsageError } from "./errors.ts";

const help = `usage: trellis status [--json]

Shows the applied OSC and when it was applied, an unfinished apply, each part of the agent (ok or
not, with units that are not healthy, the lease's age and the last errors; all details of a part
that is not ok) and whether the agent is running.
Read from ${statePath} and ${statusPath}.
Exit code 0: all is well; 1: anything is not.`;

export type StatusReport = {
  ok: boolean;
  /** One line each; empty when ok. */
  problems: string[];
  /** running: the agent has a fresh status file and its process exists. */
  agent: { running: boolean; summary: string; pid?: number; startedAt?: string; writtenAt?: string; stoppedAt?: string };
  osc: { checksum?: string; appliedAt?: string; unfinished?: { checksum: string; steps: number; done: number }; error?: string };
  components: Record<string, ComponentStatus>;
};

export type StatusDeps = { files: Files; now: () => number; alive: (pid: number) => boolean };

export async function collectStatus(deps: StatusDeps): Promise<StatusReport> {
  const problems: string[] = [];
  let file: StatusFile | undefined;
  let agent: StatusReport["agent"];
  try {
    file = await readStatusFile(deps.files);
    agent = file ? agentOf(file, deps) : { running: false, summary: `not running: it has not written ${statusPath} since boot` };
  } catch (err) {
    agent = { running: false, summary: `unknown: ${err instanceof Error ? err.message : String(err)}` };
  }
  if (!agent.running) problems.push(`agent: ${agent.summary}`);
  const osc: StatusReport["osc"] = {};
  try {
    const state = await createStateStore(deps.files).read();
    if (state.lastApplied) Object.assign(osc, { checksum: state.lastApplied.checksum, appliedAt: state.lastApplied.at });
    else problems.push("no OSC has been applied on this node yet");
    if (state.progress) {
      const p = state.progress;
      osc.unfinished = { checksum: p.checksum, steps: p.plan.steps.length, done: p.done.length };
      problems.push(`the apply of OSC ${short(p.checksum)} is unfinished (${p.done.length} of ${p.plan.steps.length} steps done); the agent resumes it when it runs`);
    }
  } catch (err) {
    // These errors (FileError, the store's) name the file and the reason; their causes would repeat them.
    osc.error = err instanceof Error ? err.message : String(err);
    problems.push(`cannot read the agent's state: ${osc.error}`);
  }
  for (const [name, s] of Object.entries(file?.components ?? {})) if (!s.ok) problems.push(`${name}: ${s.summary}`);
  return { ok: problems.length === 0, problems, agent, osc, components: file?.components ?? {} };
}

function agentOf(file: StatusFile, deps: StatusDeps): StatusReport["agent"] {
  const at = { pid: file.pid, startedAt: file.startedAt, writtenAt: file.writtenAt, ...(file.stoppedAt ? { stoppedAt: file.stoppedAt } : {}) };
  // Timestamps another process wrote: only the wall clock compares with them.
  const ageMs = deps.now() - Date.parse(file.writtenAt);
  // Rewritten every heartbeat: twice that, and a few seconds for a busy node, means it stopped or hangs.
  const staleMs = (2 * file.heartbeatSeconds + 5) * 1000;
  if (file.stoppedAt) return { running: false, summary: `stopped ${ago(deps.now() - Date.parse(file.stoppedAt))} ago (${file.stoppedAt})`, ...at };
  if (!deps.alive(file.pid)) return { running: false, summary: `not running (pid ${file.pid} is gone)`, ...at };
  if (!(ageMs <= staleMs)) return { running: false, summary: `not answering: its status is ${ago(ageMs)} old (rewritten every ${file.heartbeatSeconds} s)`, ...at };
  return { running: true, summary: `running (pid ${file.pid}, up ${ago(deps.now() - Date.parse(file.startedAt))}, status written ${ago(ageMs)} ago)`, ...at };
}

async function readStatusFile(files: Files): Promise<StatusFile | undefined> {
  const raw = await files.read(statusPath);
  if (!raw) return undefined;
  let doc: unknown;
  try {
    doc = JSON.parse(new TextDecoder().decode(raw));
  } catch (err) {
    throw new Error(`${statusPath}: not valid JSON (${err instanceof Error ? err.message : String(err)})`);
  }
  const r = v.safeParse(StatusFileSchema, doc);
  if (!r.success) throw new Error(`${statusPath}: ${formatIssues(r.issues).join("; ")}`);
  return r.output;
}

export function renderStatus(r: StatusReport, now: number): string {
  const since = (iso: string) => `${ago(now - Date.parse(iso))} ago`;
  const lines: string[] = [];
  lines.push(`agent:  ${r.agent.summary}`);
  const u = r.osc.unfinished;
  if (r.osc.error) lines.push("OSC:    unknown (the state cannot be read)", "apply:  unknown");
  else {
    lines.push(`OSC:    ${r.osc.checksum ? `${short(r.osc.checksum)} applied ${since(r.osc.appliedAt as string)} (${r.osc.appliedAt})` : "none applied yet"}`);
    lines.push(`apply:  ${u ? `unfinished: OSC ${short(u.checksum)}, ${u.done} of ${u.steps} steps done` : "nothing unfinished"}`);
  }
  const names = Object.keys(r.components).sort();
  if (names.length > 0) {
    lines.push("", "components:");
    const width = Math.max(...names.map((n) => n.length));
    for (const name of names) {
      const c = r.components[name] as ComponentStatus;
      lines.push(`  ${c.ok ? "ok  " : "FAIL"}  ${name.padEnd(width)}  ${c.summary} (${since(c.at)})`);
      const indent = " ".repeat(10 + width);
      for (const detail of details(c, since)) lines.push(`${indent}${detail}`);
    }
  }
  lines.push("", r.ok ? "all ok" : `${r.problems.length} problem(s):`, ...r.problems.map((p) => `  - ${p}`));
  return lines.join("\n");
}

/**
 * A component's details beyond ok/summary: the well-known ones in words (status-file.ts), and for a
 * component that is not ok, the others as they are.
 */
function details(c: ComponentStatus, since: (iso: string) => string): string[] {
  const { ok, summary: _summary, at: _at, ...rest } = c;
  const out: string[] = [];
  const inWords = (key: string, applies: (val: unknown) => boolean, line: (val: unknown) => string) => {
    if (!applies(rest[key])) return;
    out.push(line(rest[key]));
    delete rest[key];
  };
  const unitList = (u: unknown) => Array.isArray(u) && u.length > 0 && u.every((x) => typeof x?.unit === "string");
  inWords("units", unitList, (u) => `units not healthy: ${(u as UnitVerdict[]).map((x) => `${x.unit} (${[x.health, x.why].filter(Boolean).join(": ")})`).join(", ")}`);
  inWords("lastRenew", (t) => typeof t === "string" && !Number.isNaN(Date.parse(t)), (t) => `lease renewed ${since(t as string)} (${t})`);
  inWords("lastRenew", (t) => t === null, () => "lease not renewed yet");
  inWords("lastError", (e) => typeof e === "string" && e !== "", (e) => `last error: ${e}`);
  if (ok) return out;
  for (const [k, val] of Object.entries(rest)) {
    if (val !== undefined && val !== null && val !== "" && !(Array.isArray(val) && val.length === 0)) out.push(`${k}: ${text(val)}`);
  }
  return out;
}
type UnitVerdict = { unit: string; health?: string; why?: string };

/** Strings as they are, lists joined, objects as key=value pairs: one line for a person. */
function text(val: unknown): string {
  if (typeof val === "string") return val;
  if (Array.isArray(val)) return val.map(text).join(", ");
  if (val && typeof val === "object") return Object.entries(val).map(([k, v]) => `${k}=${typeof v === "object" && v !== null ? JSON.stringify(v) : String(v)}`).join(", ");
  return String(val);
}

/** "4 s", "3 m 20 s", "2 h 5 m", "3 d 4 h": how long ago, for a person. */
function ago(ms: number): string {
  const s = Math.max(0, Math.round(ms / 1000));
  if (s < 60) return `${s} s`;
  if (s < 3600) return `${Math.floor(s / 60)} m ${s % 60} s`;
  if (s < 86_400) return `${Math.floor(s / 3600)} h ${Math.floor((s % 3600) / 60)} m`;
  return `${Math.floor(s / 86_400)} d ${Math.floor((s % 86_400) / 3600)} h`;
}

const short = (checksum: string) => checksum.slice(0, 12);

/** Does a process with this PID exist? EPERM: it does, and belongs to another user. */
function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    return (err as { code?: unknown }).code === "EPERM";
  }
}

export async function run(args: string[]): Promise<number> {
  let values;
  try {
    ({ values } = parseArgs({ args, options: { json: { type: "boolean", default: false }, help: { type: "boolean", default: false } } }));
  } catch (err) {
    throw new UsageError(`${err instanceof Error ? err.message : String(err)}\n\n${help}`);
  }
  if (values.help) {
    console.log(help);
    return 0;
  }
  const now = Date.now();
  const report = await collectStatus({ files: createFiles("/"), now: () => now, alive });
  console.log(values.json ? JSON.stringify(report, null, 2) : renderStatus(report, now));
  return report.ok ? 0 : 1;
}
