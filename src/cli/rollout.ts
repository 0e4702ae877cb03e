// `trellis rollout status --secret NAME`: a pool's rollout as the cluster shows it, for an operator (read
// with their kubeconfig): the OSC the Secret holds and its rollout settings, the maintenance windows, who
// holds a disruption slot since when (the record `<secret>-slots`), a revision of the Secret that failed
// and stopped the rollout, and every node of the pool: updated, holding a slot, waiting (and for what),
// failed, paused.
import { parseArgs } from "node:util";
import type { V1Lease, V1Node } from "@kubernetes/client-node";
import { decodeBase64 } from "../api/base64.ts";
import { oscChecksum } from "../api/desired.ts";
import { layeredChecksum, parseOverlays } from "../api/layers.ts";
import { oscDataKey } from "../api/paths.ts";
import { parseRolloutSettings, pausedLabel, poolLabel } from "../api/rollout.ts";
import { compareText } from "../api/text-order.ts";
import { nextOpening, openWindow } from "../api/windows.ts";
import { rolloutConditionType } from "../controllers/rollout/report.ts";
import { coordinationV1, coreV1 } from "../kube/api.ts";
import { kubeFromConnection } from "../kube/client.ts";
import { explainKubeError } from "../kube/errors.ts";
import { readTicket } from "../kube/pool-leases.ts";
import { budgetSlots, decodePool, type PoolRecord, shardOf, slotsLabel, slotsLeaseName, ticketLabel } from "../rollout/pool.ts";
import type { Result } from "../api/result.ts";
import { connectionFromFlags, connectionOptions } from "./connection-flags.ts";
import { UsageError } from "./errors.ts";

const help = `usage: trellis rollout status --secret NAME [--kubeconfig FILE | --config-dir DIR | --server URL …] [--json]

Prints a pool's rollout: the OSC in Secret kube-system/NAME and its rollout settings, the maintenance
windows, the disruption slots and who holds them since when, and each node of the pool (Nodes labelled
${poolLabel}=NAME): updated, holding a slot, waiting (and why), failed, paused.`;

export type NodeRow = { node: string; ready: string; osc: string; state: "updated" | "holding" | "waiting" | "failed" | "paused"; detail: string };

export type RolloutReport = {
  secret: string;
  checksum: string;
  settings: Record<string, string>;
  problems: string[];
  /** The Secret's revision (osc.yaml and every overlay): what the pool admits and stops. */
  revision: string;
  slots: { total?: number; held: { node: string; since: string; revision: string }[]; stoppedBy?: { node: string; revision: string; failure: string; at: string } };
  windows?: { open?: string; next?: string };
  nodes: NodeRow[];
  counts: Record<NodeRow["state"], number>;
};

export async function run(args: string[]): Promise<number> {
  const [sub, ...rest] = args;
  if (sub === "--help" || sub === "-h" || sub === undefined) {
    console.log(help);
    return sub === undefined ? 2 : 0;
  }
  if (sub !== "status") throw new UsageError(`unknown subcommand "${sub}"\n\n${help}`);
  const { values } = parseArgs({ args: rest, options: { ...connectionOptions, secret: { type: "string" }, json: { type: "boolean", default: false }, help: { type: "boolean", default: false } } });
  if (values.help) {
    console.log(help);
    return 0;
  }
  if (!values.secret) throw new UsageError(`--secret is required\n\n${help}`);
  if (!values["config-dir"] && !values.kubeconfig && !values.server && process.env.KUBECONFIG) values.kubeconfig = process.env.KUBECONFIG;
  const kube = kubeFromConnection(connectionFromFlags(values, help));
  const report = await rolloutReport(kube, values.secret, new Date());
  console.log(values.json ? JSON.stringify(report, null, 2) : renderReport(report));
  return 0;
}

export async function rolloutReport(kube: ReturnType<typeof kubeFromConnection>, name: string, now: Date): Promise<RolloutReport> {
  const core = coreV1(kube);
  const [secret, nodes, record, tickets] = await Promise.all([
    core.readNamespacedSecret({ name, namespace: "kube-system" }),
    core.listNode({ labelSelector: `${poolLabel}=${name}` }),
    readRecord(kube, name),
    coordinationV1(kube).listNamespacedLease({ namespace: "kube-system", labelSelector: `${ticketLabel}=${name}` }),
  ]);
  const bytes = decodeBase64(secret.data?.[oscDataKey] ?? "");
  const checksum = bytes ? oscChecksum(bytes) : "";
  const annotations = secret.metadata?.annotations ?? {};
  const settingsText = Object.fromEntries(Object.entries(annotations).filter(([k]) => k.startsWith("rollout.trellis.dev/")).map(([k, v]) => [k.slice("rollout.trellis.dev/".length), v]));
  const parsed = parseRolloutSettings(annotations, `Secret kube-system/${name}`);
  const problems = parsed.ok ? [] : parsed.errors;
  const settings = parsed.ok ? parsed.value : undefined;
  const revision = bytes ? secretRevision(bytes, secret.data ?? {}, `Secret kube-system/${name}`, problems) : "";
  if (!record.ok) problems.push(...record.errors);
  const pool = record.ok ? record.value : { holders: [] };

  // A holder gives its slot back on its ticket (it asks for nothing); the record shows it until the leader's next pass.
  const asking = new Set(tickets.items.flatMap((l) => (readTicket(l, `Lease kube-system/${l.metadata?.name}`)?.request ? [l.spec?.holderIdentity ?? ""] : [])));
  const held = pool.holders.filter((h) => asking.has(h.node)).sort((a, b) => compareText(a.node, b.node)).map((h) => ({ node: h.node, since: h.since, revision: h.revision }));
  const failed = pool.failed?.revision === revision ? pool.failed : undefined;
  const total = settings?.budget ? budgetSlots(settings.budget, pool.poolSize ?? nodes.items.length) : undefined;

  const holding = new Set(held.map((h) => h.node));
  const rows = nodes.items.map((n): NodeRow => row(n, checksum, holding.has(n.metadata?.name ?? ""))).sort((a, b) => a.node.localeCompare(b.node));
  const counts = { updated: 0, holding: 0, waiting: 0, failed: 0, paused: 0 };
  for (const r of rows) counts[r.state]++;
  const open = settings?.windows ? openWindow(settings.windows, now) : undefined;
  const next = settings?.windows && !open ? nextOpening(settings.windows, now) : undefined;
  return {
    secret: name,
    checksum,
    revision,
    settings: settingsText,
    problems,
    slots: { ...(total !== undefined ? { total } : {}), held, ...(failed ? { stoppedBy: { node: failed.node, revision: failed.revision, failure: failed.failure, at: failed.at } } : {}) },
    ...(settings?.windows ? { windows: { ...(open ? { open: open.text } : {}), ...(next ? { next: next.toISOString() } : {}) } } : {}),
    nodes: rows,
    counts,
  };
}

/** The pool's record: shard 0 (the failure, the pool's size) with the holders of every shard (none yet: nothing held). */
async function readRecord(kube: ReturnType<typeof kubeFromConnection>, name: string): Promise<Result<PoolRecord>> {
  const leases = coordinationV1(kube);
  let shards: V1Lease[];
  try {
    shards = (await leases.listNamespacedLease({ namespace: "kube-system", labelSelector: `${slotsLabel}=${name}` })).items;
    if (!shards.some((l) => l.metadata?.name === slotsLeaseName(name))) {
      // Shard 0 written before the record had shards carries no label yet.
      shards.push(await leases.readNamespacedLease({ name: slotsLeaseName(name), namespace: "kube-system" }));
    }
  } catch (err) {
    const e = explainKubeError(err, { server: kube.server, caSource: kube.caSource, what: `reading Lease kube-system/${slotsLeaseName(name)}` });
    if (e.reason === "not-found") return { ok: true, value: { holders: [] } };
    throw e;
  }
  const decoded = shards.filter((l) => shardOf(name, l.metadata?.name ?? "") !== undefined).map((l) => ({ shard: shardOf(name, l.metadata?.name ?? "") ?? 0, r: decodePool(l.metadata?.annotations, `Lease kube-system/${l.metadata?.name}`) }));
  const errors = decoded.flatMap((d) => (d.r.ok ? [] : d.r.errors));
  if (errors.length > 0) return { ok: false, errors };
  const first = decoded.find((d) => d.shard === 0)?.r;
  const base = first?.ok ? first.value : { holders: [] };
  return { ok: true, value: { ...base, holders: decoded.flatMap((d) => (d.r.ok ? d.r.value.holders : [])) } };
}

/** The Secret's revision as the agents compute it (src/controllers/osc/reconcile.ts): osc.yaml and every overlay. */
function secretRevision(bytes: Uint8Array, data: Record<string, string>, source: string, problems: string[]): string {
  const decoded: Record<string, Uint8Array> = {};
  for (const [key, value] of Object.entries(data)) {
    const b = key.startsWith("overlay") ? decodeBase64(value) : undefined;
    if (b) decoded[key] = b;
  }
  const overlays = parseOverlays(decoded, source);
  if (!overlays.ok) problems.push(...overlays.errors);
  return layeredChecksum(bytes, overlays.ok ? overlays.value : []);
}

function row(n: V1Node, checksum: string, holding: boolean): NodeRow {
  const name = n.metadata?.name ?? "?";
  const applied = n.metadata?.annotations?.["checksum/cloud-config-data"] ?? "";
  const ready = n.status?.conditions?.find((c) => c.type === "Ready")?.status ?? "Unknown";
  const c = n.status?.conditions?.find((x) => x.type === rolloutConditionType);
  const detail = c && c.reason !== "HealthGatePassed" && c.reason !== "Applied" ? `${c.reason}: ${c.message ?? ""}` : "";
  const base = { node: name, ready, osc: applied.slice(0, 12) };
  // Blocked: rolled back from the revision that failed here, which its OSC controller keeps holding back.
  if (c?.reason === "HealthGateFailed" || c?.reason === "RolledBack" || c?.reason === "Blocked") return { ...base, state: "failed", detail };
  if (holding) return { ...base, state: "holding", detail };
  if (applied === checksum) return { ...base, state: "updated", detail };
  if (n.metadata?.labels?.[pausedLabel] === "true") return { ...base, state: "paused", detail: `label ${pausedLabel}=true` };
  return { ...base, state: "waiting", detail };
}

export function renderReport(r: RolloutReport): string {
  const s = r.settings;
  const lines = [
    `pool ${r.secret}: OSC ${r.checksum.slice(0, 12)}; ${s["max-disrupted"] ? `max-disrupted ${s["max-disrupted"]} (${r.slots.total ?? "?"} slot(s) for ${r.nodes.length} node(s))` : "no disruption budget"}${s.rollback === "true" ? ", rollback on" : ""}${s["canary-selector"] ? `, canary ${s["canary-selector"]}` : ""}`,
    ...r.problems.map((p) => `  PROBLEM ${p}`),
    ...(r.windows ? [`  maintenance windows ${s["maintenance-windows"]}: ${r.windows.open ? `open now (${r.windows.open})` : `closed, next opens ${r.windows.next ?? "never within 8 days"}`}`] : []),
    ...(r.slots.stoppedBy ? [`  STOPPED: this revision of the Secret failed its health gate on ${r.slots.stoppedBy.node} (${r.slots.stoppedBy.failure}); a new revision goes on`] : []),
    `  nodes: ${r.counts.updated} updated, ${r.counts.holding} holding a slot, ${r.counts.waiting} waiting, ${r.counts.failed} failed, ${r.counts.paused} paused`,
    ...r.slots.held.map((h) => `  slot: ${h.node} since ${h.since} for revision ${h.revision.slice(0, 12)}`),
    "",
    `${"NODE".padEnd(24)} ${"READY".padEnd(7)} ${"OSC".padEnd(13)} ${"STATE".padEnd(8)} DETAIL`,
    ...r.nodes.map((n) => `${n.node.padEnd(24)} ${n.ready.padEnd(7)} ${(n.osc || "-").padEnd(13)} ${n.state.padEnd(8)} ${n.detail}`),
  ];
  return lines.join("\n");
}
