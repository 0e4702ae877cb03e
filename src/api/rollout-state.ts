// What a node remembers of a rollout across restarts: the state of src/rollout/machine.ts, in its own file,
// written only by the rollout controller (apply writes state.json); the last good OSC's bytes beside it.
// Version 1 (before the rollout state machine) is read too: its last good OSC is kept; a gate or slot it
// recorded belonged to the former slot Leases (`<secret>-slot-<i>`), which the new protocol does not use.
import * as v from "valibot";
import type { NodeRollout } from "../rollout/machine.ts";
import { baseDir } from "./paths.ts";
import { object } from "./shapes.ts";

export const rolloutStatePath = `${baseDir}/trellis/rollout.json`;
export const lastGoodOscPath = `${baseDir}/trellis/last-good-osc.yaml`;

const Reading = object({ bootId: v.string(), uptimeMs: v.number(), wallMs: v.number() });
const Good = object({ checksum: v.string(), base: v.string() });
const Probe = v.variant("kind", [v.object({ kind: v.literal("http"), url: v.string() }), v.object({ kind: v.literal("exec"), argv: v.array(v.string()) })]);
const Gate = object({ settleMs: v.number(), healthTimeoutMs: v.number(), rollback: v.boolean(), probe: v.optional(Probe), probeTimeoutMs: v.number() });

const V2 = object({
  version: v.literal(2),
  current: v.optional(
    object({
      work: object({
        kind: v.picklist(["osc", "restart", "drift", "in-place"]),
        revision: v.string(),
        checksum: v.string(),
        base: v.string(),
        disruption: object({ units: v.array(v.string()), paths: v.array(v.string()) }),
        changes: v.optional(v.array(v.string())),
        carries: v.optional(v.array(v.string())),
      }),
      phase: v.picklist(["waiting", "applying", "gating", "rolling-back", "failed"]),
      since: v.optional(Reading),
      healthySince: v.optional(Reading),
      check: v.optional(v.string()),
      rollbackTo: v.optional(Good),
      gate: v.optional(Gate),
      recordOwed: v.optional(object({ revision: v.string(), failure: v.string(), changes: v.array(v.array(v.string())) })),
      pieces: v.optional(v.array(v.array(v.string()))),
      inconclusive: v.optional(v.boolean()),
      retryable: v.optional(v.boolean()),
      retryOf: v.optional(v.string()),
    }),
  ),
  lastGood: v.optional(object({ checksum: v.string(), base: v.string(), at: v.string() })),
  blocked: v.optional(object({ revision: v.string(), checksum: v.string(), check: v.string() })),
  retry: v.optional(object({ revision: v.string() })),
  recorded: v.optional(v.string()),
  proveOwed: v.optional(object({ revision: v.string(), proven: v.optional(v.array(v.string())) })),
});

const V1 = object({
  version: v.literal(1),
  lastGood: v.optional(object({ checksum: v.string(), base: v.optional(v.string()), at: v.string() })),
});

export const NodeRolloutSchema = v.union([
  V2,
  v.pipe(
    V1,
    v.transform((old): NodeRollout => ({ version: 2, ...(old.lastGood ? { lastGood: { checksum: old.lastGood.checksum, base: old.lastGood.base ?? old.lastGood.checksum, at: old.lastGood.at } } : {}) })),
  ),
]);
