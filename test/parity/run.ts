// Drives both twin nodes through the steps, waits after each until both agents have decided, compares
// them and classifies every difference: deliberate (a row of deliberate.ts: allowed), a known item of
// trellis issue 20 (known.ts: still a failure, named), or unexplained (a failure, and news).
import type { Difference, Outcome } from "./diff.ts";
import { differences, sameDifference } from "./diff.ts";
import { deliberate } from "./deliberate.ts";
import { knownItems } from "./known.ts";
import { matches } from "./match.ts";
import { type Osc, render, unitNames } from "./osc.ts";
import { doneWhen, oscOutcome } from "./settle.ts";
import { type Snapshot, snapshot } from "./snapshot.ts";
import { startOsc, type Step, steps as scenario } from "./steps.ts";
import { foreignUnit, putBoth, type Side, sides, type World } from "./twins.ts";

export type Classified = Difference & {
  /** false: the same difference was there after the step before (it carried over). */
  first: boolean;
  deliberate?: string;
  /** The item of trellis issue 20 it belongs to (known.ts), when it is not deliberate. */
  issueItem?: string;
};
export type StepReport = { id: string; class: string; what: string; kind: Step["kind"]; checksum?: string; seconds: number; outcomes: Record<Side, Outcome>; differences: Classified[] };
export type Report = {
  steps: StepReport[];
  /** Deliberate rows that matched no difference in this run. */
  unmatchedDeliberate: string[];
  /** Differences that fail the run: not deliberate (known issue items included). */
  failing: number;
};

const scenarioOrder = scenario.map((s) => s.id);
const alwaysWatched = [foreignUnit, "containerd.service", "gardener-node-agent.service", "kubelet.service"];

export async function runParity(w: World, steps: Step[], progress: (msg: string) => void = () => {}): Promise<Report> {
  let model: Osc = startOsc();
  const units = new Set(alwaysWatched);
  const snap = async () => Object.fromEntries(await Promise.all(sides.map(async (s) => [s, await snapshot(w, w.twins[s], [...units])] as const))) as Record<Side, Snapshot>;
  let before = await snap();
  let previous: Difference[] = [];
  /** The checksum both OSC Secrets carry now (a one-off step's too): what an event's outcome may wait for. */
  let current: string | undefined;
  const reports: StepReport[] = [];
  const used = new Set<string>();
  for (const [i, step] of steps.entries()) {
    const t0 = performance.now();
    let outcomes: Record<Side, Outcome>;
    let checksum: string | undefined;
    if (step.kind === "osc") {
      const next = step.next(model, w.env);
      for (const u of unitNames(next)) units.add(u);
      await step.before?.(w);
      const since = Date.now();
      checksum = await putBoth(w, step.render?.(next, w.env) ?? render(next), step.secretAnnotations);
      const sum = checksum;
      current = sum;
      outcomes = await bothDecide((s) => oscOutcome(w.twins[s], sum, since, { ...(step.timeoutMs ? { timeoutMs: step.timeoutMs } : {}), ...(step.gnaHold ? { gnaHold: step.gnaHold } : {}) }));
      if (!step.oneOff) model = next;
    } else {
      const since = Date.now();
      await step.act(w);
      const sum = current;
      outcomes = await bothDecide((s) => step.outcome(w, w.twins[s], since, sum));
    }
    await step.after?.(w);
    if (step.settled) {
      const settled = doneWhen(step.settled.what, step.settled.check);
      const after = await bothDecide((s) => settled(w, w.twins[s]));
      // Not settled is a difference of its own: the outcome says which agent never got there.
      for (const s of sides) if (after[s].result === "timeout") outcomes[s] = { result: "timeout", evidence: `decided (${outcomes[s].result}), then ${after[s].evidence}` };
    }
    const after = await snap();
    const found = differences(before, after, outcomes);
    const classified = found.map((d): Classified => {
      const row = deliberate.find((r) => r.match.some((m) => matches(m, step.id, d, scenarioOrder)));
      if (row) used.add(row.id);
      const item = row ? undefined : knownItems.find((k) => k.match.some((m) => matches(m, step.id, d, scenarioOrder)));
      return { ...d, first: !previous.some((p) => sameDifference(p, d)), ...(row ? { deliberate: row.id } : {}), ...(item ? { issueItem: item.item } : {}) };
    });
    const seconds = Math.round((performance.now() - t0) / 100) / 10;
    reports.push({ id: step.id, class: step.class, what: step.what, kind: step.kind, ...(checksum ? { checksum } : {}), seconds, outcomes, differences: classified });
    const failing = classified.filter((d) => !d.deliberate);
    progress(`step ${i + 1}/${steps.length} ${step.id}: gna ${outcomes.gna.result}, trellis ${outcomes.trellis.result}, ${seconds} s; ${classified.length} difference(s), ${failing.filter((d) => d.first).length} new failing`);
    for (const d of failing.filter((x) => x.first)) progress(`    ${d.area} ${d.key}: gna=${d.gna ?? "absent"} trellis=${d.trellis ?? "absent"}`);
    before = after;
    previous = found;
  }
  return {
    steps: reports,
    unmatchedDeliberate: deliberate.filter((r) => r.match.length > 0).map((r) => r.id).filter((id) => !used.has(id)),
    failing: reports.reduce((n, r) => n + r.differences.filter((d) => !d.deliberate).length, 0),
  };
}

async function bothDecide(decide: (s: Side) => Promise<Outcome>): Promise<Record<Side, Outcome>> {
  const [gna, trellis] = await Promise.all(sides.map(decide));
  return { gna: gna as Outcome, trellis: trellis as Outcome };
}

/** The readable summary: per step the outcomes, and every difference the first time it appears, classified. */
export function summarise(r: Report): string {
  const lines: string[] = [];
  const label = (d: Classified) => (d.deliberate ? `deliberate: ${d.deliberate}` : d.issueItem ? `issue 20 item ${d.issueItem}` : "NEW: not in issue 20");
  for (const s of r.steps) {
    const fresh = s.differences.filter((d) => d.first);
    const carried = s.differences.length - fresh.length;
    lines.push(`${s.id} [${s.class}] gna=${s.outcomes.gna.result} trellis=${s.outcomes.trellis.result} (${s.seconds} s)${carried ? `, ${carried} carried over` : ""}`);
    for (const d of fresh) lines.push(`  ${d.area} ${d.key}: gna=${d.gna ?? "absent"} trellis=${d.trellis ?? "absent"}  [${label(d)}]`);
  }
  const all = r.steps.flatMap((s) => s.differences.filter((d) => d.first));
  const count = (f: (d: Classified) => boolean) => all.filter(f).length;
  lines.push(
    "",
    `${r.steps.length} steps; ${all.length} distinct differences: ${count((d) => !!d.deliberate)} deliberate, ${count((d) => !d.deliberate && !!d.issueItem)} known issue-20 items, ${count((d) => !d.deliberate && !d.issueItem)} new`,
    `deliberate rows that matched nothing: ${r.unmatchedDeliberate.join(", ") || "none"}`,
  );
  return lines.join("\n");
}
