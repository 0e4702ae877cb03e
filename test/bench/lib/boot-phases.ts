// Where the time from install.sh to the first OSC applied goes on one bare node, read from the node's
// journal: each mark is the first journal entry (CLOCK_REALTIME, the clock the benchmark shares with
// the node) of a line install.sh, `bootstrap` or the agent writes at that point, or systemd's own line
// for the agent's unit. Marks are returned as performance.now() milliseconds, like the benchmark's own.
import type { Node } from "../../harness/node.ts";

/** The lines that mark each point, in the order they happen. */
const marks = {
  /** install.sh running in gardener-node-init.service (after cloud-init's hand-over). */
  initRunning: (m: string) => /^trellis-install: (pulling|fetching) /.test(m),
  /** The binary is installed at /opt/bin (pulled, decompressed, verified, renamed). */
  installed: (m: string) => m.startsWith("trellis-install: installed "),
  /** The binary's `bootstrap` logged its first line (the runtime started, its config read). */
  bootstrapStarted: (m: string) => msg(m) === "bootstrap starting",
  csrCreated: (m: string) => msg(m) === "created the CertificateSigningRequest",
  kubeconfigWritten: (m: string) => msg(m) === "wrote the agent's kubeconfig",
  /** bootstrap queued the agent's start (after writing and enabling its unit). */
  agentQueued: (m: string) => msg(m) === "started the agent's unit",
  /** The agent's process logged its first line of `run`. */
  agentStarted: (m: string) => msg(m) === "trellis starting",
  oscApplied: (m: string) => msg(m) === "OSC applied",
} as const;
export type BootMark = keyof typeof marks;

function msg(line: string): string | undefined {
  if (!line.startsWith("{")) return undefined;
  try {
    return (JSON.parse(line) as { msg?: string }).msg;
  } catch {
    return undefined;
  }
}

export type BootJournal = {
  marks: Partial<Record<BootMark, number>>;
  /** The agent's own binary was extracted from its image again by the agent (ms it took), or not at all. */
  agentImageExtractedMs?: number;
};

/** Reads the marks from `node`'s journal; `imageRepo` names the agent's image ("trellis/agent"). */
export async function bootJournal(node: Node, imageRepo = "trellis/agent"): Promise<BootJournal> {
  const out = await node.execOk(["journalctl", "-o", "json", "--no-pager", "-u", "gardener-node-init.service", "-u", "gardener-node-agent.service"]);
  const found: Partial<Record<BootMark, number>> = {};
  let agentImageExtractedMs: number | undefined;
  for (const line of out.split("\n")) {
    if (line === "") continue;
    const entry = JSON.parse(line) as { MESSAGE?: unknown; __REALTIME_TIMESTAMP: string };
    if (typeof entry.MESSAGE !== "string") continue;
    const at = Number(entry.__REALTIME_TIMESTAMP) / 1000 - performance.timeOrigin;
    for (const [name, test] of Object.entries(marks) as [BootMark, (m: string) => boolean][]) {
      if (found[name] === undefined && test(entry.MESSAGE)) found[name] = at;
    }
    if (msg(entry.MESSAGE) === "extracted a file from an image") {
      const fields = JSON.parse(entry.MESSAGE) as { image?: string; ms?: number };
      if (fields.image?.includes(`/${imageRepo}:`) || fields.image?.includes(`/${imageRepo}@`)) agentImageExtractedMs ??= fields.ms ?? 0;
    }
  }
  return { marks: found, ...(agentImageExtractedMs !== undefined ? { agentImageExtractedMs } : {}) };
}
