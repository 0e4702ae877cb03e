// `trellis rollout status --secret NAME`: a pool's rollout as the cluster shows it, for an operator (read
// with their kubeconfig): the OSC the Secret holds and its rollout settings, the maintenance windows, who
// holds which disruption slot since when, a change that failed and stopped the rollout, and every node of
// the pool: updated, holding a slot, waiting (and for what), failed, paused.
import { parseArgs } from "node:util";
import { CoordinationV1Api, CoreV1Api, type V1Node } from "@kubernetes/client-node";
import { decodeBase64 } from "../api/base64.ts";
import { oscChecksum } from "../api/desired.ts";
import { oscDataKey } from "../api/paths.ts";
import { parseRolloutSettings, pausedLabel, poolLabel, slotCount } from "../api/rollout.ts";
import { nextOpening, openWindow } from "../api/windows.ts";
import { rolloutConditionType } from "../controllers/rollout.ts";
import { apiClient, kubeFromConnection } from "../kube/client.ts";
import { slotFailedChecksumAnnotation, slotFailureAnnotation, slotHolder, slotPoolLabel } from "../kube/slots.ts";
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
  slots: { total?: number; held: { slot: string; node: string; since?: string; renewed?: string; expired: boolean; checksum: string }[]; stoppedBy?: { slot: string; checksum: string; failure: string } };
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
  const core = apiClient(kube, CoreV1Api);
  const [secret, nodes, leases] = await Promise.all([
    core.readNamespacedSecret({ name, namespace: "kube-system" }),
    core.listNode({ labelSelector: `${poolLabel}=${name}` }),
    apiClient(kube, CoordinationV1Api).listNamespacedLease({ namespace: "kube-system", labelSelector: `${slotPoolLabel}=${name}` }),
  ]);
  const bytes = decodeBase64(secret.data?.[oscDataKey] ?? "");
  const checksum = bytes ? oscChecksum(bytes) : "";
  const annotations = secret.metadata?.annotations ?? {};
  const settingsText = Object.fromEntries(Object.entries(annotations).filter(([k]) => k.startsWith("rollout.trellis.dev/")).map(([k, v]) => [k.slice("rollout.trellis.dev/".length), v]));
  const parsed = parseRolloutSettings(annotations, `Secret kube-system/${name}`);
  const problems = parsed.ok ? [] : parsed.errors;
  const settings = parsed.ok ? parsed.value : undefined;

  const held = leases.items
    .map((l) => slotHolder(l, now))
    .filter((h) => h.node !== "")
    .map(({ acquired, ...h }) => ({ ...h, ...(acquired ? { since: new Date(acquired).toISOString() } : {}) }))
    .sort((a, b) => a.slot.localeCompare(b.slot, undefined, { numeric: true }));
  const failed = leases.items.find((l) => l.metadata?.annotations?.[slotFailedChecksumAnnotation] === checksum);
  const total = settings?.budget ? slotCount(settings.budget, Math.max(1, nodes.items.length), `Secret kube-system/${name}`) : undefined;
  if (total && !total.ok) problems.push(...total.errors);

  const holderOf = new Map(held.map((h) => [h.node, h.slot]));
  const rows = nodes.items.map((n): NodeRow => row(n, checksum, holderOf.get(n.metadata?.name ?? ""))).sort((a, b) => a.node.localeCompare(b.node));
  const counts = { updated: 0, holding: 0, waiting: 0, failed: 0, paused: 0 };
  for (const r of rows) counts[r.state]++;
  const open = settings?.windows ? openWindow(settings.windows, now) : undefined;
  const next = settings?.windows && !open ? nextOpening(settings.windows, now) : undefined;
  return {
    secret: name,
    checksum,
    settings: settingsText,
    problems,
    slots: {
      ...(total?.ok ? { total: total.value } : {}),
      held,
      ...(failed ? { stoppedBy: { slot: failed.metadata?.name as string, checksum, failure: failed.metadata?.annotations?.[slotFailureAnnotation] ?? "" } } : {}),
    },
    ...(settings?.windows ? { windows: { ...(open ? { open: open.text } : {}), ...(next ? { next: next.toISOString() } : {}) } } : {}),
    nodes: rows,
    counts,
  };
}

function row(n: V1Node, checksum: string, slot: string | undefined): NodeRow {
  const name = n.metadata?.name ?? "?";
  const applied = n.metadata?.annotations?.["checksum/cloud-config-data"] ?? "";
  const ready = n.status?.conditions?.find((c) => c.type === "Ready")?.status ?? "Unknown";
  const c = n.status?.conditions?.find((x) => x.type === rolloutConditionType);
  const detail = c && c.reason !== "HealthGatePassed" && c.reason !== "Applied" ? `${c.reason}: ${c.message ?? ""}` : "";
  const base = { node: name, ready, osc: applied.slice(0, 12) };
  if (c?.reason === "HealthGateFailed" || c?.reason === "RolledBack") return { ...base, state: "failed", detail };
  if (slot) return { ...base, state: "holding", detail: `${slot}${detail ? ` ${detail}` : ""}` };
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
    ...(r.slots.stoppedBy ? [`  STOPPED: this OSC failed its health gate (${r.slots.stoppedBy.failure}); recorded on ${r.slots.stoppedBy.slot}`] : []),
    `  nodes: ${r.counts.updated} updated, ${r.counts.holding} holding a slot, ${r.counts.waiting} waiting, ${r.counts.failed} failed, ${r.counts.paused} paused`,
    ...r.slots.held.map((h) => `  ${h.slot}: ${h.node} since ${h.since ?? "?"} for OSC ${h.checksum.slice(0, 12)}${h.expired ? " (NOT RENEWING)" : ""}`),
    "",
    `${"NODE".padEnd(24)} ${"READY".padEnd(7)} ${"OSC".padEnd(13)} ${"STATE".padEnd(8)} DETAIL`,
    ...r.nodes.map((n) => `${n.node.padEnd(24)} ${n.ready.padEnd(7)} ${(n.osc || "-").padEnd(13)} ${n.state.padEnd(8)} ${n.detail}`),
  ];
  return lines.join("\n");
}
