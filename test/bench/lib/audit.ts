// The API server's audit log read incrementally: the run's requests, counted where they arrive.
import { Buffer } from "node:buffer";
import { closeSync, fstatSync, openSync, readSync } from "node:fs";
import { waitFor } from "../../harness/exec.ts";
import type { AuditEvent } from "../../harness/rbac.ts";

/** Audit timestamps carry microseconds; Date.parse keeps milliseconds only. */
export function auditMs(ts: string): number {
  const m = /^(.*?)(?:\.(\d+))?Z$/.exec(ts);
  if (!m) return Date.parse(ts);
  return Date.parse(`${m[1]}Z`) + (m[2] ? Number(`0.${m[2]}`) * 1000 : 0);
}

/** Reads the audit log incrementally (it grows by every request of the run). */
export class AuditTail {
  private offset = 0;
  private rest = "";
  readonly events: AuditEvent[] = [];
  constructor(private readonly path: string) {}
  poll(): AuditEvent[] {
    const fd = openSync(this.path, "r");
    try {
      const size = fstatSync(fd).size;
      if (size > this.offset) {
        const buf = Buffer.alloc(size - this.offset);
        readSync(fd, buf, 0, buf.length, this.offset);
        this.offset = size;
        const text = this.rest + buf.toString("utf8");
        const lines = text.split("\n");
        this.rest = lines.pop() ?? "";
        for (const line of lines) if (line) this.events.push(JSON.parse(line) as AuditEvent);
      }
    } finally {
      closeSync(fd);
    }
    return this.events;
  }
  by(user: string, fromMs = 0, toMs = Number.POSITIVE_INFINITY): AuditEvent[] {
    return this.poll().filter((e) => e.user.username === user && auditMs(e.stageTimestamp) >= fromMs && auditMs(e.stageTimestamp) <= toMs);
  }
}

/** Until `user` has its Secret watch open (the audit log's record of the WATCH), so that it sees a creation as an event. */
export async function waitWatching(audit: AuditTail, user: string): Promise<void> {
  await waitFor(`${user} to watch its Secret`, () => audit.by(user).some((e) => e.verb === "watch" && e.objectRef?.resource === "secrets"), 60_000, 20);
}

/** "verb resource[/subresource]", e.g. "patch nodes/status": how the benchmarks group requests. */
export function requestKind(e: AuditEvent): string {
  const r = e.objectRef;
  return `${e.verb} ${r?.resource ? `${r.resource}${r.subresource ? `/${r.subresource}` : ""}` : e.requestURI}`;
}

/** How many requests of each kind, sorted by kind. */
export function countByKind(events: AuditEvent[]): [string, number][] {
  const m = new Map<string, number>();
  for (const e of events) m.set(requestKind(e), (m.get(requestKind(e)) ?? 0) + 1);
  return [...m].sort((a, b) => a[0].localeCompare(b[0]));
}
