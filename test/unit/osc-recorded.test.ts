// When a restarted agent's first reconcile may say its OSC is applied from the Node and its own record,
// leaving the node's check to the next reconcile (src/controllers/osc/recorded.ts): only when everything
// says this OSC was applied completely and reported, nothing is in progress and no rollback is pending.
import { expect, test } from "bun:test";
import type { V1Node, V1Secret } from "@kubernetes/client-node";
import { effectiveChecksumAnnotation } from "../../src/api/layers.ts";
import { type AgentState, emptyState } from "../../src/api/state.ts";
import { appliedAsRecorded } from "../../src/controllers/osc/recorded.ts";
import { annotations, conditionType } from "../../src/controllers/osc/report.ts";

const checksum = "a".repeat(64);
const node = (o: { annotation?: string; effective?: string; status?: string; reason?: string; message?: string } = {}): V1Node => ({
  metadata: {
    name: "n",
    annotations: {
      [annotations.appliedChecksum]: o.annotation ?? checksum,
      ...(o.effective ? { [effectiveChecksumAnnotation]: o.effective } : {}),
    },
  },
  status: { conditions: [{ type: conditionType, status: o.status ?? "True", reason: o.reason ?? "Applied", message: o.message ?? `OSC ${checksum.slice(0, 12)} is applied` }] },
});
const state = (o: Partial<AgentState> = {}): AgentState => ({ ...emptyState(), lastApplied: { checksum, at: "2026-11-27T00:00:00Z" }, ...o });
const secret: V1Secret = { data: { "osc.yaml": "" } };
const base = { checksum, secret, node: node(), state: state(), rollingBack: false };

test("the Node and the record both say this OSC is applied: recognized", () => {
  expect(appliedAsRecorded(base)).toBe(true);
  // The condition's message may go on (parts not acted on).
  expect(appliedAsRecorded({ ...base, node: node({ message: `OSC ${checksum.slice(0, 12)} is applied; 1 part(s) not acted on as written: x` }) })).toBe(true);
});

test("anything else runs the full reconcile", () => {
  const cases: Record<string, Parameters<typeof appliedAsRecorded>[0]> = {
    "no Node yet": { ...base, node: undefined },
    "the Node names another OSC": { ...base, node: node({ annotation: "b".repeat(64) }) },
    "the Node carries an overlaid checksum": { ...base, node: node({ effective: "c".repeat(64) }) },
    "the condition is not True": { ...base, node: node({ status: "False", reason: "ApplyFailed" }) },
    "the condition names another OSC": { ...base, node: node({ message: `OSC ${"b".repeat(12)} is applied` }) },
    "the Node has no condition": { ...base, node: { ...node(), status: {} } },
    "the record names another OSC": { ...base, state: state({ lastApplied: { checksum: "b".repeat(64), at: "x" } }) },
    "nothing recorded as applied": { ...base, state: emptyState() },
    "an apply in progress": { ...base, state: state({ progress: { checksum, plan: { checksum, steps: [] }, done: [] } }) },
    "a rollback pending": { ...base, rollingBack: true },
    "the Secret has overlays": { ...base, secret: { data: { "osc.yaml": "", "overlay-a": "" } } },
  };
  for (const [name, input] of Object.entries(cases)) expect({ name, recognized: appliedAsRecorded(input) }).toEqual({ name, recognized: false });
});
