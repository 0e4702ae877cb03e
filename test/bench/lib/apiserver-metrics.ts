// kube-apiserver's own account of what it served, from its /metrics endpoint: requests by verb, resource
// and code, response bytes by verb and resource, watch events and their bytes by resource, and the watches
// open. Two scrapes make a window; counters are differenced, gauges read at the window's end.
import type { Admin } from "./scale-pool.ts";

type Series = Map<string, number>;
export type Scrape = { at: number; series: Series };

const wanted = /^(apiserver_request_total|apiserver_response_sizes_(sum|count)|apiserver_watch_events_total|apiserver_watch_events_sizes_sum|apiserver_longrunning_requests|apiserver_flowcontrol_rejected_requests_total)\{/;

export async function scrape(admin: Admin): Promise<Scrape> {
  const res = await fetch(`${admin.server}/metrics`, { tls: admin.tls });
  const text = await res.text();
  if (!res.ok) throw new Error(`/metrics: HTTP ${res.status}`);
  const series: Series = new Map();
  for (const line of text.split("\n")) {
    if (!wanted.test(line)) continue;
    const cut = line.lastIndexOf(" ");
    series.set(line.slice(0, cut), Number(line.slice(cut + 1)));
  }
  return { at: performance.now(), series };
}

function labels(key: string): { name: string; l: Record<string, string> } {
  const brace = key.indexOf("{");
  const l: Record<string, string> = {};
  for (const m of key.slice(brace + 1, -1).matchAll(/(\w+)="([^"]*)"/g)) l[m[1] as string] = m[2] as string;
  return { name: key.slice(0, brace), l };
}

export type Window = {
  seconds: number;
  /** "VERB resource" → count, non-watch and watch alike (a WATCH counts when it ends). */
  requests: Record<string, number>;
  /** "VERB resource code" → count, for the codes other than 200/201. */
  failures: Record<string, number>;
  /** "VERB resource" → response bytes (the API server does not count watch streams here). */
  responseBytes: Record<string, number>;
  /** resource → watch events sent, and their bytes. */
  watchEvents: Record<string, number>;
  watchEventBytes: Record<string, number>;
  /** resource → watches open at the window's end. */
  watchesOpen: Record<string, number>;
  /** Requests API Priority and Fairness turned away (429), by priority level. */
  rejected: Record<string, number>;
};

const add = (m: Record<string, number>, k: string, v: number) => {
  if (v !== 0) m[k] = (m[k] ?? 0) + v;
};

/** What the API server served between two scrapes. */
export function windowOf(a: Scrape, b: Scrape): Window {
  const w: Window = { seconds: (b.at - a.at) / 1000, requests: {}, failures: {}, responseBytes: {}, watchEvents: {}, watchEventBytes: {}, watchesOpen: {}, rejected: {} };
  for (const [key, after] of b.series) {
    const { name, l } = labels(key);
    const delta = after - (a.series.get(key) ?? 0);
    const kind = `${l.verb ?? ""} ${l.resource ?? ""}${l.subresource ? `/${l.subresource}` : ""}`;
    if (name === "apiserver_request_total") {
      add(w.requests, kind, delta);
      if (l.code !== "200" && l.code !== "201") add(w.failures, `${kind} ${l.code}`, delta);
    } else if (name === "apiserver_response_sizes_sum") add(w.responseBytes, kind, delta);
    else if (name === "apiserver_watch_events_total") add(w.watchEvents, l.resource ?? l.kind ?? "?", delta);
    else if (name === "apiserver_watch_events_sizes_sum") add(w.watchEventBytes, l.resource ?? l.kind ?? "?", delta);
    else if (name === "apiserver_longrunning_requests" && l.verb === "WATCH") add(w.watchesOpen, l.resource ?? "?", after);
    else if (name === "apiserver_flowcontrol_rejected_requests_total") add(w.rejected, `${l.priority_level ?? "?"} ${l.reason ?? ""}`, delta);
  }
  return w;
}

const sum = (m: Record<string, number>, keep: (k: string) => boolean) => Object.entries(m).reduce((s, [k, v]) => s + (keep(k) ? v : 0), 0);

/** The window's Lease traffic in totals: requests other than WATCH, their response bytes, and the watch events. */
export function leaseTotals(w: Window) {
  const lease = (k: string) => k.split(" ")[1] === "leases";
  const notWatch = (k: string) => lease(k) && !k.startsWith("WATCH ");
  return {
    requests: sum(w.requests, notWatch),
    watchRequests: sum(w.requests, (k) => lease(k) && k.startsWith("WATCH ")),
    responseBytes: sum(w.responseBytes, notWatch),
    watchEvents: w.watchEvents.leases ?? 0,
    watchEventBytes: w.watchEventBytes.leases ?? 0,
    failures: sum(w.failures, lease),
    watchesOpen: w.watchesOpen.leases ?? 0,
  };
}
