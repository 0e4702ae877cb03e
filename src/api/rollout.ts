// Fleet rollout settings: annotations on the OSC Secret under rollout.trellis.dev/, read by every node of
// the pool. None set: the Secret behaves exactly as with gardener-node-agent. An annotation under the
// prefix that trellis does not know is an error naming it, like a bad value: nothing is ignored.
//
//   max-disrupted        how many of the pool's nodes may be disrupted at once: "2" or "10%" (of the
//                        pool, rounded down, at least 1). Turns on slots and the health gate.
//   disruptive-units     unit name patterns (* and ?) whose restart or stop makes an apply disruptive;
//                        default "*". kubelet.service and containerd.service always count.
//   settle-time          how long the node must stay healthy after a disruptive apply (default 60s,
//                        longer than a Node's 40 s grace period before it is marked NotReady)
//   health-timeout       how long it may take to get there before the change counts as failed (5m)
//   probe                an extra check: "http://…" (2xx/3xx is healthy) or "exec /path arg…" (exit 0)
//   probe-timeout        the probe's time limit (10s)
//   rollback             "true": a node whose change fails its gate goes back to its last good OSC
//   maintenance-windows  "Mon-Fri 22:00-06:00 Europe/Berlin; Sat,Sun 00:00-24:00": disruptive applies
//                        wait for a window (src/api/windows.ts)
//   canary-selector      a label selector: only matching nodes take a new OSC
//   serial-hold-limit    with the serial annotation: how long a node whose apply keeps failing holds the
//                        serial lease before giving it to the next node (default 10m, the lease's duration)
//
// The Node label rollout.trellis.dev/paused=true pauses one node: it keeps reporting, applies nothing new.
import { parseGoDuration } from "./duration.ts";
import type { Result } from "./result.ts";
import { parseSelector, type Selector } from "./selector.ts";
import { parseWindows, type Window } from "./windows.ts";

export const rolloutPrefix = "rollout.trellis.dev/";
export const rolloutKeys = {
  maxDisrupted: `${rolloutPrefix}max-disrupted`,
  disruptiveUnits: `${rolloutPrefix}disruptive-units`,
  settleTime: `${rolloutPrefix}settle-time`,
  healthTimeout: `${rolloutPrefix}health-timeout`,
  probe: `${rolloutPrefix}probe`,
  probeTimeout: `${rolloutPrefix}probe-timeout`,
  rollback: `${rolloutPrefix}rollback`,
  windows: `${rolloutPrefix}maintenance-windows`,
  canary: `${rolloutPrefix}canary-selector`,
  serialHoldLimit: `${rolloutPrefix}serial-hold-limit`,
} as const;
/** Node label: "true" pauses trellis on that node. */
export const pausedLabel = `${rolloutPrefix}paused`;
/** Node label naming the OSC Secret a node follows: the pool a budget is counted over. Gardener sets it (kubelet's --node-labels, gardenlet); trellis only reads it. */
export const poolLabel = "worker.gardener.cloud/gardener-node-agent-secret-name";

export type Probe = { kind: "http"; url: string } | { kind: "exec"; argv: string[] };
export type Budget = { text: string } & ({ count: number } | { percent: number });

export type RolloutSettings = {
  budget?: Budget;
  disruptiveUnits: string[];
  settleMs: number;
  healthTimeoutMs: number;
  probe?: Probe;
  probeTimeoutMs: number;
  rollback: boolean;
  windows?: Window[];
  canary?: Selector;
  serialHoldLimitMs: number;
};

const needsBudget = [rolloutKeys.settleTime, rolloutKeys.healthTimeout, rolloutKeys.probe, rolloutKeys.probeTimeout, rolloutKeys.rollback];

/** The settings of a Secret's annotations; each problem names the annotation and the Secret. */
export function parseRolloutSettings(annotations: Readonly<Record<string, string>> | undefined, source: string): Result<RolloutSettings> {
  const a = annotations ?? {};
  const errors: string[] = [];
  const fail = (key: string, why: string) => errors.push(`${source}: annotation ${key}: ${why}`);
  const known = new Set<string>(Object.values(rolloutKeys));
  for (const k of Object.keys(a)) if (k.startsWith(rolloutPrefix) && !known.has(k)) fail(k, `unknown setting (known: ${[...known].map((x) => x.slice(rolloutPrefix.length)).join(", ")})`);

  const duration = (key: string, fallback: number, min: number): number => {
    const text = a[key];
    if (text === undefined) return fallback;
    const ms = parseGoDuration(text);
    if (ms === undefined || ms < min) fail(key, `"${text}" is not a duration of at least ${min / 1000}s (e.g. 30s, 5m)`);
    return ms ?? fallback;
  };

  let budget: Budget | undefined;
  const max = a[rolloutKeys.maxDisrupted];
  if (max !== undefined) {
    const pct = /^(\d{1,3})%$/.exec(max);
    const count = /^\d+$/.test(max) ? Number(max) : undefined;
    if (pct && Number(pct[1]) >= 1 && Number(pct[1]) <= 100) budget = { text: max, percent: Number(pct[1]) };
    else if (count !== undefined && count >= 1) budget = { text: max, count };
    else fail(rolloutKeys.maxDisrupted, `"${max}" is not a number of nodes (≥ 1) or a percentage (1%–100%)`);
  } else {
    for (const k of needsBudget) if (a[k] !== undefined) fail(k, `takes effect only with ${rolloutKeys.maxDisrupted}`);
  }

  const units = (a[rolloutKeys.disruptiveUnits] ?? "*").split(",").map((u) => u.trim());
  if (units.some((u) => !/^[A-Za-z0-9:_.\\@*?-]+$/.test(u))) fail(rolloutKeys.disruptiveUnits, `"${a[rolloutKeys.disruptiveUnits]}" is not a comma-separated list of unit name patterns`);

  let probe: Probe | undefined;
  const probeText = a[rolloutKeys.probe]?.trim();
  if (probeText !== undefined) {
    if (/^https?:\/\//.test(probeText)) {
      try {
        probe = { kind: "http", url: new URL(probeText).toString() };
      } catch {
        fail(rolloutKeys.probe, `"${probeText}" is not a URL`);
      }
    } else if (/^exec\s+\/\S/.test(probeText)) {
      probe = { kind: "exec", argv: probeText.split(/\s+/).slice(1) };
    } else {
      fail(rolloutKeys.probe, `"${probeText}" is neither "http(s)://…" nor "exec /absolute/command [args…]"`);
    }
  }

  const rollbackText = a[rolloutKeys.rollback];
  if (rollbackText !== undefined && rollbackText !== "true" && rollbackText !== "false") fail(rolloutKeys.rollback, `"${rollbackText}" is not "true" or "false"`);

  let windows: Window[] | undefined;
  if (a[rolloutKeys.windows] !== undefined) {
    const w = parseWindows(a[rolloutKeys.windows] as string);
    if (w.ok) windows = w.value;
    else for (const e of w.errors) fail(rolloutKeys.windows, e);
  }
  let canary: Selector | undefined;
  if (a[rolloutKeys.canary] !== undefined) {
    const s = parseSelector(a[rolloutKeys.canary] as string);
    if (s.ok) canary = s.value;
    else for (const e of s.errors) fail(rolloutKeys.canary, e);
  }

  const settings: RolloutSettings = {
    ...(budget ? { budget } : {}),
    disruptiveUnits: units,
    settleMs: duration(rolloutKeys.settleTime, 60_000, 0),
    healthTimeoutMs: duration(rolloutKeys.healthTimeout, 5 * 60_000, 1000),
    ...(probe ? { probe } : {}),
    probeTimeoutMs: duration(rolloutKeys.probeTimeout, 10_000, 100),
    rollback: rollbackText === "true",
    ...(windows ? { windows } : {}),
    ...(canary ? { canary } : {}),
    serialHoldLimitMs: duration(rolloutKeys.serialHoldLimit, 10 * 60_000, 1000),
  };
  if (settings.healthTimeoutMs <= settings.settleMs) fail(rolloutKeys.healthTimeout, `must be longer than the settle time (${settings.settleMs / 1000}s)`);
  return errors.length > 0 ? { ok: false, errors } : { ok: true, value: settings };
}
