// What the differential test compares of one node after a step, normalised so that the twin nodes'
// own names (node, OSC Secret, registry port) do not count: the files under the paths the OSCs touch,
// the units (state, enablement, whether the step restarted them), the Node's labels, annotations and
// conditions, the events' reasons, and the Leases.
import { createHash } from "node:crypto";
import { lstat, readdir, readFile, readlink } from "node:fs/promises";
import { CoordinationV1Api, CoreV1Api } from "@kubernetes/client-node";
import { parse as parseToml } from "smol-toml";
import type { Twin, World } from "./twins.ts";

export type FileEntry = { type: "file" | "dir" | "link" | "other"; mode: string; sha256?: string; text?: string };
export type UnitEntry = { load: string; active: string; sub: string; enabled: string; invocation: string };
export type Snapshot = {
  files: Record<string, FileEntry>;
  units: Record<string, UnitEntry>;
  labels: Record<string, string>;
  annotations: Record<string, string>;
  conditions: Record<string, string>;
  /** "Type/Reason" of every event about the Node so far (a set: both agents' recorders aggregate repeats). */
  events: string[];
  leases: Record<string, string>;
};

/** Where the OSCs write, and what a GNA or trellis apply writes beside them (containerd's files). */
const roots = ["/etc/parity", "/opt/parity", "/etc/containerd", "/var/bin/containerruntimes", "/var/lib/parity-token", "/var/lib/parity-token-nodir", "/etc/systemd/system", "/etc/kubernetes/manifests", "/var/lib/kubelet", "/etc/os-release"];
/** Under /etc/systemd/system only the scenario's units and containerd's drop-ins: the rest is the host image's. */
const systemdEntry = /^(parity-|containerd\.service|kubelet\.service)/;
/** Text shown in a difference instead of only its hash. */
const maxText = 4096;

export function normaliser(w: World, t: Twin): (s: string) => string {
  const pairs: [string, string][] = [
    [t.name, "<node>"],
    [t.secretName, "<osc-secret>"],
    [w.env.mirror, "<registry>"],
  ];
  return (s) => pairs.reduce((acc, [from, to]) => acc.split(from).join(to), s);
}

export async function snapshot(w: World, t: Twin, units: string[]): Promise<Snapshot> {
  const norm = normaliser(w, t);
  const [files, unitStates, node, events, leases] = await Promise.all([fileTree(t, norm), unitTable(t, units), t.core.readNode({ name: t.name }), eventReasons(w, t), leaseTable(w, t, norm)]);
  const normMap = (m: Record<string, string> | undefined) => Object.fromEntries(Object.entries(m ?? {}).map(([k, v]) => [norm(k), norm(v)]));
  return {
    files,
    units: unitStates,
    labels: normMap(node.metadata?.labels),
    annotations: normMap(node.metadata?.annotations),
    conditions: Object.fromEntries((node.status?.conditions ?? []).map((c) => [c.type, `${c.status}/${c.reason ?? ""}`])),
    events,
    leases,
  };
}

async function fileTree(t: Twin, norm: (s: string) => string): Promise<Record<string, FileEntry>> {
  const out: Record<string, FileEntry> = {};
  const walk = async (path: string, depth: number): Promise<void> => {
    let st;
    try {
      st = await lstat(t.node.root + path);
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === "ENOENT") return;
      throw err;
    }
    const mode = (st.mode & 0o7777).toString(8).padStart(4, "0");
    if (st.isSymbolicLink()) {
      out[norm(path)] = { type: "link", mode, text: norm(await readlink(t.node.root + path)) };
    } else if (st.isFile()) {
      const bytes = await readFile(t.node.root + path);
      const text = path.endsWith(".toml") ? canonicalToml(norm(bytes.toString("utf8"))) : bytes.length <= maxText ? norm(bytes.toString("utf8")) : undefined;
      out[norm(path)] = { type: "file", mode, sha256: createHash("sha256").update(text ?? bytes).digest("hex"), ...(text !== undefined ? { text } : {}) };
    } else if (st.isDirectory()) {
      if (depth > 0) out[norm(path)] = { type: "dir", mode };
      for (const name of (await readdir(t.node.root + path)).sort()) {
        if (path === "/etc/systemd/system" && !systemdEntry.test(name)) continue;
        await walk(`${path}/${name}`, depth + 1);
      }
    } else {
      out[norm(path)] = { type: "other", mode };
    }
  };
  for (const r of roots) await walk(r, 0);
  return out;
}

/**
 * containerd reads a TOML file's tables, not its layout: both agents' serialisers format differently, so a
 * TOML file is compared as its parsed value (keys sorted); one that does not parse, as its text.
 */
function canonicalToml(text: string): string {
  const sorted = (v: unknown): unknown =>
    v && typeof v === "object" && !Array.isArray(v) ? Object.fromEntries(Object.entries(v).sort(([a], [b]) => a.localeCompare(b)).map(([k, x]) => [k, sorted(x)])) : Array.isArray(v) ? v.map(sorted) : v;
  try {
    return JSON.stringify(sorted(parseToml(text)), null, 1);
  } catch {
    return text;
  }
}

const unitProperties = ["Id", "LoadState", "ActiveState", "SubState", "UnitFileState", "InvocationID"];

async function unitTable(t: Twin, units: string[]): Promise<Record<string, UnitEntry>> {
  const out = await t.node.execOk(["systemctl", "show", ...unitProperties.map((p) => `--property=${p}`), "--", ...units]);
  const table: Record<string, UnitEntry> = {};
  for (const block of out.split("\n\n")) {
    const p = Object.fromEntries(block.split("\n").filter(Boolean).map((l) => [l.slice(0, l.indexOf("=")), l.slice(l.indexOf("=") + 1)]));
    if (!p.Id) continue;
    table[p.Id] = { load: p.LoadState ?? "", active: p.ActiveState ?? "", sub: p.SubState ?? "", enabled: p.UnitFileState ?? "", invocation: p.InvocationID ?? "" };
  }
  return table;
}

async function eventReasons(w: World, t: Twin): Promise<string[]> {
  const list = await w.cluster.admin().makeApiClient(CoreV1Api).listEventForAllNamespaces({ fieldSelector: `involvedObject.name=${t.name}` });
  return [...new Set(list.items.map((e) => `${e.type ?? ""}/${e.reason ?? ""}`))].sort();
}

/** The Leases in kube-system named after this node or its OSC Secret (heartbeat, serial rollout): holder and duration. */
async function leaseTable(w: World, t: Twin, norm: (s: string) => string): Promise<Record<string, string>> {
  const list = await w.cluster.admin().makeApiClient(CoordinationV1Api).listNamespacedLease({ namespace: "kube-system" });
  const mine = list.items.filter((l) => {
    const name = l.metadata?.name ?? "";
    return name.includes(t.name) || name.includes(t.secretName);
  });
  return Object.fromEntries(mine.map((l) => [norm(l.metadata?.name ?? ""), `holder=${norm(l.spec?.holderIdentity ?? "")} duration=${l.spec?.leaseDurationSeconds ?? ""}`]));
}
