// When an agent has reached its decision about a step, from what it reports itself (never a sleep):
// the Node's checksum annotation for an applied OSC; otherwise each agent's own account of a failure or
// a hold — trellis's Node condition names the OSC's checksum, gardener-node-agent logs a reconcile error
// (twice: controller-runtime retries at once, so a second error of the same text is a decision, not a
// hiccup such as a conflict on the Node) or the hold it is in.
import type { V1Node } from "@kubernetes/client-node";
import { waitFor } from "../harness/exec.ts";
import type { Outcome } from "./diff.ts";
import type { Twin, World } from "./twins.ts";

const appliedAnnotation = "checksum/cloud-config-data";
const trellisCondition = "OperatingSystemConfigApplied";
export const settleTimeoutMs = 90_000;

export type LogLine = { msg: string; at: number; fields: Record<string, unknown> };

/** The agent's JSON log lines since `sinceMs` (wall clock; the nodes share the host's clock). */
export async function agentLog(t: Twin, sinceMs: number): Promise<LogLine[]> {
  const out = await t.node.execOk(["journalctl", "-u", "gardener-node-agent.service", "--since", `@${Math.floor(sinceMs / 1000)}`, "-o", "json", "--output-fields=MESSAGE", "--no-pager"]);
  return out.split("\n").flatMap((line) => {
    if (!line) return [];
    const entry = JSON.parse(line) as { MESSAGE?: unknown; __REALTIME_TIMESTAMP: string };
    const at = Number(entry.__REALTIME_TIMESTAMP) / 1000;
    if (at < sinceMs || typeof entry.MESSAGE !== "string" || !entry.MESSAGE.startsWith("{")) return [];
    try {
      const fields = JSON.parse(entry.MESSAGE) as Record<string, unknown>;
      return [{ msg: String(fields.msg), at, fields }];
    } catch {
      return [];
    }
  });
}

/** Waits for `decide` to name an outcome; a timeout is an outcome too (the comparison reports it). */
export async function settle(t: Twin, what: string, decide: () => Promise<Outcome | undefined>, timeoutMs = settleTimeoutMs): Promise<Outcome> {
  const since = Date.now();
  try {
    return await waitFor(`${t.label} ${what}`, decide, timeoutMs, 250);
  } catch {
    const last = (await agentLog(t, since).catch(() => [])).slice(-6).map((l) => l.msg);
    return { result: "timeout", evidence: `nothing said ${what} within ${timeoutMs / 1000} s; its last log lines: ${JSON.stringify(last)}` };
  }
}

/** Waits until `check` of each node's own view holds: an event handled, or what an agent finishes after its decision. */
export const doneWhen = (what: string, check: (w: World, t: Twin) => Promise<boolean>) => (w: World, t: Twin) =>
  settle(t, what, async () => ((await check(w, t)) ? { result: "done" as const, evidence: what } : undefined));

/**
 * The outcome of an OSC `checksum` put into the agent's Secret at `sinceMs`. `gnaHold`: a log line that is
 * gardener-node-agent's decision to wait in this step (beside its in-place and static-pod holds).
 * `pastHold`: the step ends a hold the agents were in (a drain, a mirror pod Ready), so a hold is no
 * decision yet: only applied or an error is (or the timeout).
 */
export function oscOutcome(t: Twin, checksum: string, sinceMs: number, opts: { timeoutMs?: number; gnaHold?: string; pastHold?: boolean } = {}): Promise<Outcome> {
  const short = checksum.slice(0, 12);
  return settle(t, `decided on OSC ${short}${opts.pastHold ? " past its hold" : ""}`, async () => {
    const node = await t.core.readNode({ name: t.name });
    const decision = t.side === "trellis" ? trellisDecision(node, checksum) : await gnaDecision(t, node, checksum, sinceMs, opts.gnaHold);
    return opts.pastHold && decision?.result === "held" ? undefined : decision;
  }, opts.timeoutMs);
}

function trellisDecision(node: V1Node, checksum: string): Outcome | undefined {
  // The condition follows the annotation and the event in the same report: it is the last word.
  const c = node.status?.conditions?.find((x) => x.type === trellisCondition);
  if (!c?.message?.includes(`OSC ${checksum.slice(0, 12)}`)) return undefined;
  if (c.status === "True") return node.metadata?.annotations?.[appliedAnnotation] === checksum ? { result: "applied", evidence: c.message } : undefined;
  return { result: ["InPlaceUpdatePending", "WaitingForRegistries", "WaitingForStaticPods"].includes(c.reason ?? "") ? "held" : "error", evidence: `${c.reason}: ${c.message}` };
}

const gnaHolds = ["Node is not ready for in-place update", "Not all static pods have been rolled out", "Static pod is not"];

async function gnaDecision(t: Twin, node: V1Node, checksum: string, sinceMs: number, stepHold: string | undefined): Promise<Outcome | undefined> {
  // Its last act of an apply is the annotation (after its event).
  if (node.metadata?.annotations?.[appliedAnnotation] === checksum) return { result: "applied", evidence: `checksum/cloud-config-data=${checksum.slice(0, 12)}` };
  const lines = await agentLog(t, sinceMs);
  const errors = lines.filter((l) => l.msg === "Reconciler error" && l.fields.controller === "operatingsystemconfig").map((l) => String(l.fields.error));
  // A terminal error (controller-runtime's reconcile.TerminalError) is not retried: a decision at once.
  const decided = errors.find((e, i) => errors.indexOf(e) !== i) ?? errors.find((e) => e.startsWith("terminal error: "));
  if (decided !== undefined) return { result: "error", evidence: decided };
  const hold = lines.find((l) => [...gnaHolds, ...(stepHold ? [stepHold] : [])].some((h) => l.msg.startsWith(h)));
  return hold ? { result: "held", evidence: hold.msg } : undefined;
}
