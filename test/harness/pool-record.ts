// A pool's rollout record as tests and benchmarks see it: every version of the Lease `<secret>-slots`
// (src/rollout/pool.ts: who holds a disruption slot, for which revision, and the revision that failed),
// from a watch that resumes where it left off, and from those versions who held a slot when.
import type { KubeConfig, V1Lease } from "@kubernetes/client-node";
import { decodePool, type PoolRecord, slotsLeaseName } from "../../src/rollout/pool.ts";
import { recordVersions } from "./watch.ts";

/** One node's holding of a slot, in wall-clock ms as the versions arrived (`to`: Infinity while it still holds). */
export type HoldPeriod = { node: string; revision: string; from: number; to: number };

export type PoolRecordWatch = {
  /** Every version seen so far, decoded, in order. */
  versions(): { at: number; record: PoolRecord }[];
  /** The record as last seen (an empty pool before the first version: nobody ever asked for a slot). */
  latest(): PoolRecord;
  /** Who held a slot between `since` and `until` (a holding that began before `since` counts from `since`). */
  holdPeriods(since: number, until?: number): HoldPeriod[];
  /** The most holders any version between `since` and `until` listed at once (the one in force at `since` included). */
  maxHolders(since: number, until?: number): number;
  stop(): void;
};

export function watchPoolRecord(kc: KubeConfig, secretName: string): PoolRecordWatch {
  const name = slotsLeaseName(secretName);
  const watch = recordVersions<V1Lease>(kc, "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases", name);
  const decoded = new Map<V1Lease, PoolRecord>();
  // A record the agents could not read either is a failure of the test, never an empty pool.
  const decode = (lease: V1Lease): PoolRecord => {
    let record = decoded.get(lease);
    if (!record) {
      const r = decodePool(lease.metadata?.annotations, `Lease kube-system/${name}`);
      if (!r.ok) throw new Error(r.errors.join("; "));
      record = r.value;
      decoded.set(lease, record);
    }
    return record;
  };
  const versions = () => watch.versions.map((v) => ({ at: v.at, record: decode(v.object) }));
  const empty: PoolRecord = { holders: [] };
  /** The version in force at `since`, then every version up to `until`. */
  const span = (since: number, until: number) => {
    const all = versions();
    const before = all.filter((v) => v.at < since).at(-1);
    return [{ at: since, record: before?.record ?? empty }, ...all.filter((v) => v.at >= since && v.at <= until)];
  };

  return {
    versions,
    latest: () => versions().at(-1)?.record ?? empty,
    holdPeriods(since, until = Number.POSITIVE_INFINITY) {
      const periods: HoldPeriod[] = [];
      const open = new Map<string, HoldPeriod>();
      for (const { at, record } of span(since, until)) {
        const now = new Map(record.holders.map((h) => [h.node, h.revision]));
        for (const [node, p] of open) {
          if (now.has(node)) continue;
          periods.push({ ...p, to: at });
          open.delete(node);
        }
        for (const [node, revision] of now) if (!open.has(node)) open.set(node, { node, revision, from: at, to: Number.POSITIVE_INFINITY });
      }
      return [...periods, ...open.values()].sort((a, b) => a.from - b.from);
    },
    maxHolders: (since, until = Number.POSITIVE_INFINITY) => Math.max(0, ...span(since, until).map((v) => v.record.holders.length)),
    stop: watch.stop,
  };
}
