// Schedules in which the model finds the defects of today's code (5822692), each checked by reading its
// trace: `bun test/model/run.ts --target old --known` replays them and fails if one no longer violates
// its invariant (the harness lost its bite). All with `steps` 2000 and the default 20 min quiet time.
// Review numbers: ../shared/notes/rollout-review.md; "new" ones are not in the review.

export type Finding = { defect: string; profile: string; seed: number; invariant: "I1" | "I2" | "I3" | "I4" | "I5"; trace: string };

/** The steps with faults of every schedule below (run.ts --steps). */
export const findingSteps = 2000;

export const oldFindings: Finding[] = [
  {
    defect: "1 (dead holder)",
    profile: "holder-death",
    seed: 1,
    invariant: "I1",
    trace: "node-3 dies at 133 s in the gate of r4 (k=2); its Node stays Ready with r4 for the 40 s grace, so at 169 s node-2 takes over slot-0 (safeToReclaim) and restarts kubelet: 3 disrupted",
  },
  {
    defect: "1 (clock skew)",
    profile: "clock-skew",
    seed: 1,
    invariant: "I1",
    trace: "node-3's clock runs 126 s ahead: node-1's fresh renewTime looks expired to it, node-1 is Ready with the slot's OSC (patched before the gate), so node-3 takes slot-0 from the live holder 5 s after node-1 took it: 3 disrupted with k=2",
  },
  {
    defect: "3",
    profile: "change-in-gate",
    seed: 5,
    invariant: "I3",
    trace: "r14 touches only a file and arrives 16 s into node-1's 20 s settle of r13: node-1 applies it ungated, its r13 gate is never settled, slot-0 stays held (renewed) for the 20 min quiet time by a healthy, idle node (node-2 likewise with slot-1)",
  },
  {
    defect: "4",
    profile: "overlays",
    seed: 2,
    invariant: "I2",
    trace: "bad r9 (kubelet fails) fails its gate on node-1 and node-2 (k=2) under their effective checksums 0cacc3ab/34fc13db; both roll back and give their slots back; node-3's overlay gives it 6307f9e2 for the same base, the failure records do not match, it takes slot-0 and restarts into the same broken kubelet: 3 nodes",
  },
  {
    defect: "5 (count then claim)",
    profile: "budget-change",
    seed: 61,
    invariant: "I1",
    trace: "node-5 holds slot-2 (taken under k=3); k is 2: node-4 and node-6 each count 1 busy slot and claim slot-1 and slot-0 at the same instant: 3 holders, 3 disrupted with k=2",
  },
  {
    defect: "5 (cached pool size)",
    profile: "pool-size",
    seed: 7,
    invariant: "I1",
    trace: "max-disrupted 50%: the pool shrank, k 3→2; node-3, on its 60 s-cached pool size, takes slot-2 (which only k=3 has) while node-1 sees all 2 slots taken: 3 disrupted with k=2",
  },
  {
    defect: "5 (holder keeps going after k lowered)",
    profile: "budget-change",
    seed: 10,
    invariant: "I1",
    trace: "k lowered 2→1 while node-1 and node-5 hold slots in their gates; the next change arrives and both apply it under the slots they hold (takeSlot answers go for a slot in rollout.json without looking at k): 2 new disruptions with k=1",
  },
  {
    defect: "new: stale Node passes the gate",
    profile: "holder-death",
    seed: 3,
    invariant: "I5",
    trace: "r8's kubelet cuts node-3's network 14 s after the restart; the gate reads the agent's cached Node (Ready, heartbeat after the restart), passes at 296 s, makes r8 the last good OSC, and only the slot's release fails: rollback on, yet node-3 stays broken",
  },
  {
    defect: "new: restarted agent trusts rollout.json's slot",
    profile: "change-in-gate",
    seed: 23,
    invariant: "I1",
    trace: "node-2's agent is down >40 s (crash loop) while Ready with its slot's OSC: node-3 takes slot-0 over; node-2's agent starts again and applies r19 under the slot rollout.json still names (no look at the Lease): 2 disrupted with k=1",
  },
  {
    defect: "new: a gone node's slot above k is never reclaimed",
    profile: "pool-size",
    seed: 52,
    invariant: "I4",
    trace: "node-6 is removed from the pool while holding slot-1; the pool shrinks, k=1: acquire counts slot-1 busy but only tries takeovers below k, so the slot is never freed and node-2 and node-4 never get r8",
  },
  {
    defect: "new: wall-clock step fails a kubelet gate",
    profile: "clock-skew",
    seed: 7,
    invariant: "I3",
    trace: "node-3 restarts kubelet with its clock 17 min ahead; the clock is stepped back (NTP): kubelet's heartbeats now predate its ActiveEnterTimestamp, the good change fails its gate, and with rollback off the healthy node keeps slot-0 for good",
  },
];
