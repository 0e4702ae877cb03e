// The differences between the twin nodes after one step: every key of every compared area whose
// normalised value is not the same on both. Pure: the runner and the unit tests call it.
import type { FileEntry, Snapshot } from "./snapshot.ts";
import type { Side } from "./twins.ts";

export type Area = "outcome" | "file" | "unit" | "restarted" | "label" | "annotation" | "condition" | "event" | "lease";
/** A value is undefined where that node has no such key (no file, no label, no event of that reason). */
export type Difference = { area: Area; key: string; gna: string | undefined; trellis: string | undefined; detail?: Partial<Record<Side, string>> };

export type Outcome = { result: "applied" | "error" | "held" | "done" | "timeout"; evidence: string };

const fileValue = (f: FileEntry | undefined) => (f ? `${f.type} ${f.mode}${f.sha256 ? ` sha256:${f.sha256.slice(0, 12)}` : ""}` : undefined);

function mapDiff<V>(area: Area, a: Record<string, V>, b: Record<string, V>, value: (v: V | undefined) => string | undefined): Difference[] {
  const keys = [...new Set([...Object.keys(a), ...Object.keys(b)])].sort();
  return keys.flatMap((key) => {
    const [gna, trellis] = [value(a[key]), value(b[key])];
    return gna === trellis ? [] : [{ area, key, gna, trellis }];
  });
}

/** Units whose invocation changed since `before`: the step started them (again). */
export function restarted(before: Snapshot, after: Snapshot): Record<string, string> {
  return Object.fromEntries(
    Object.entries(after.units).map(([name, u]) => [name, u.invocation !== "" && u.invocation !== before.units[name]?.invocation ? "restarted" : "not restarted"]),
  );
}

export function differences(before: Record<Side, Snapshot>, after: Record<Side, Snapshot>, outcomes: Record<Side, Outcome>): Difference[] {
  const [g, t] = [after.gna, after.trellis];
  const asSet = (xs: string[]) => Object.fromEntries(xs.map((x) => [x, "present"]));
  const out: Difference[] = [];
  if (outcomes.gna.result !== outcomes.trellis.result) {
    out.push({ area: "outcome", key: "result", gna: outcomes.gna.result, trellis: outcomes.trellis.result, detail: { gna: outcomes.gna.evidence, trellis: outcomes.trellis.evidence } });
  }
  for (const d of mapDiff("file", g.files, t.files, fileValue)) {
    const text = (f: FileEntry | undefined) => f?.text;
    const [gt, tt] = [text(g.files[d.key]), text(t.files[d.key])];
    out.push(gt !== undefined || tt !== undefined ? { ...d, detail: { ...(gt !== undefined ? { gna: gt } : {}), ...(tt !== undefined ? { trellis: tt } : {}) } } : d);
  }
  out.push(
    ...mapDiff("unit", g.units, t.units, (u) => (u ? `${u.load} ${u.active}/${u.sub} ${u.enabled}` : undefined)),
    ...mapDiff("restarted", restarted(before.gna, g), restarted(before.trellis, t), (v) => v),
    ...mapDiff("label", g.labels, t.labels, (v) => v),
    ...mapDiff("annotation", g.annotations, t.annotations, (v) => v),
    ...mapDiff("condition", g.conditions, t.conditions, (v) => v),
    ...mapDiff("event", asSet(g.events), asSet(t.events), (v) => v),
    ...mapDiff("lease", g.leases, t.leases, (v) => v),
  );
  return out;
}

/** The same difference (area, key and both values) as one already seen: it carried over from an earlier step. */
export const sameDifference = (a: Difference, b: Difference) => a.area === b.area && a.key === b.key && a.gna === b.gna && a.trellis === b.trellis;
