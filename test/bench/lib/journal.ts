// An agent's log lines from the node's journal: both agents log JSON with a `msg` field.
import type { Node } from "../../harness/node.ts";

/** `fields`: the whole JSON line (the agent's own `ts` among them). */
export type JournalLine = { msg: string; monoUs: number; fields: Record<string, unknown> };

/** The JSON log lines of process `pid`, with journald's receive time on CLOCK_MONOTONIC (µs). */
export async function journal(node: Node, pid: number): Promise<JournalLine[]> {
  const out = await node.execOk(["journalctl", `_PID=${pid}`, "-o", "json", "--output-fields=MESSAGE", "--no-pager"]);
  return out.split("\n").flatMap((line) => {
    if (!line) return [];
    const entry = JSON.parse(line) as { MESSAGE?: unknown; __MONOTONIC_TIMESTAMP: string };
    if (typeof entry.MESSAGE !== "string" || !entry.MESSAGE.startsWith("{")) return [];
    try {
      const fields = JSON.parse(entry.MESSAGE) as Record<string, unknown>;
      return [{ msg: String(fields.msg), monoUs: Number(entry.__MONOTONIC_TIMESTAMP), fields }];
    } catch {
      return []; // a line that merely starts with "{"
    }
  });
}
