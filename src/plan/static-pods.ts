// Whether the static pods an OSC brings are rolled out and Ready, as gardener-node-agent decides it before
// it sets checksum/cloud-config-data (v1.150.0 operatingsystemconfig/reconciler.go,
// ensureStaticPodsReconciledAndReady; gardenadm's control-plane pools, whose `gardenadm join` reads the
// checksum). Pure; src/controllers/osc/before-report.ts lists the mirror pods and reports.
//
// - A static pod is a file of the OSC (spec.files and status.extensionFiles, for this host) whose path starts
//   with /etc/kubernetes/manifests and whose content is inline or a secretRef (an imageRef file is not one),
//   read as a Pod: its name and its annotation gardener.cloud/config.mirror, the hash gardenadm puts there
//   ("" without one). One that is not a Pod is an error, as there.
// - Its mirror pod is a Pod on the Node labelled static-pod=true, named `<name>-<node>` (kubelet names it
//   so), in any namespace: the name less its `-<spec.nodeName>` is the static pod's. Kubelet copies the
//   manifest's annotations to it, so its hash says which manifest it runs.
// - Rolled out: the static pods' names and hashes are exactly the mirror pods' (a mirror pod of a static pod
//   the OSC no longer has, or one missing, or one with another hash, is not). Then every mirror pod must be
//   Running or Succeeded, and Ready.
import * as v from "valibot";
import type { DesiredFile } from "../api/desired.ts";
import { formatIssues } from "../api/issues.ts";
import type { Result } from "../api/result.ts";
import { looseObject, record } from "../api/shapes.ts";
import { decodeYamlBytes, parseYaml } from "../api/yaml.ts";

/** kubelet's staticPodPath in Gardener's OSC (components/kubelet FilePathKubernetesManifests). */
export const manifestsDir = "/etc/kubernetes/manifests";
/** gardenadm's label on its static pods (pkg/gardenadm/staticpod), which kubelet copies to their mirror pods. */
export const staticPodLabel = { key: "static-pod", value: "true" } as const;
/** gardenadm's annotation with the hash of a static pod's manifest. */
export const staticPodHashAnnotation = "gardener.cloud/config.mirror";

/** A mirror pod as the API server has it: what the decision reads of it. */
export type MirrorPod = {
  namespace: string;
  name: string;
  nodeName: string;
  /** Its gardener.cloud/config.mirror annotation; "" when it has none (Go's zero value). */
  hash: string;
  phase: string;
  /** Its Ready condition is True. */
  ready: boolean;
};

const ManifestSchema = looseObject({
  apiVersion: v.nullish(v.string()),
  kind: v.nullish(v.string()),
  metadata: v.nullish(looseObject({ name: v.nullish(v.string()), annotations: v.nullish(record(v.string(), v.string())) })),
});

/** The static pods the OSC's files on this node hold: name → hash. */
export function desiredStaticPods(files: readonly DesiredFile[]): Result<Map<string, string>> {
  const pods = new Map<string, string>();
  const errors: string[] = [];
  for (const f of files) {
    // Gardener's test is a prefix of the path, not a directory: /etc/kubernetes/manifests-x/… counts too.
    if (!f.path.startsWith(manifestsDir) || !(f.content instanceof Uint8Array)) continue;
    const pod = readPod(f.content, `static pod manifest ${f.origin}`);
    if (pod.ok) pods.set(pod.value.name, pod.value.hash);
    else errors.push(...pod.errors);
  }
  return errors.length > 0 ? { ok: false, errors } : { ok: true, value: pods };
}

/** A manifest's Pod name and hash, read as Go's decoder reads it into a v1 Pod (it fills in a missing apiVersion and kind, and refuses another). */
function readPod(bytes: Uint8Array, source: string): Result<{ name: string; hash: string }> {
  const text = decodeYamlBytes(bytes, source);
  const doc = text.ok ? parseYaml(text.value, source) : text;
  if (!doc.ok) return doc;
  const r = v.safeParse(ManifestSchema, doc.value);
  if (!r.success) return { ok: false, errors: formatIssues(r.issues).map((e) => `${source}: not a Pod: ${e}`) };
  const { apiVersion, kind, metadata } = r.output;
  if ((apiVersion ?? "v1") !== "v1" || (kind ?? "Pod") !== "Pod") return { ok: false, errors: [`${source}: not a Pod: it is ${apiVersion ?? "v1"} ${kind ?? "Pod"}`] };
  return { ok: true, value: { name: metadata?.name ?? "", hash: metadata?.annotations?.[staticPodHashAnnotation] ?? "" } };
}

/** What the static pods still wait for (each named); empty: rolled out and Ready. */
export function staticPodsWaiting(desired: ReadonlyMap<string, string>, mirrors: readonly MirrorPod[]): string[] {
  const actual = new Map<string, MirrorPod>();
  for (const p of mirrors) actual.set(p.name.endsWith(`-${p.nodeName}`) ? p.name.slice(0, -(p.nodeName.length + 1)) : p.name, p);
  const waiting: string[] = [];
  for (const [name, hash] of desired) {
    const mirror = actual.get(name);
    if (!mirror) waiting.push(`${name}: no mirror pod yet`);
    else if (mirror.hash !== hash) waiting.push(`${name}: mirror pod ${mirror.namespace}/${mirror.name} runs ${shown(mirror.hash)}, the manifest has ${shown(hash)}`);
  }
  for (const [name, mirror] of actual) {
    if (!desired.has(name)) waiting.push(`${name}: mirror pod ${mirror.namespace}/${mirror.name} of a static pod the OSC does not have`);
  }
  if (waiting.length > 0) return waiting;
  for (const p of mirrors) {
    if (p.phase !== "Running" && p.phase !== "Succeeded") waiting.push(`${p.namespace}/${p.name}: phase ${p.phase || "unknown"}`);
    else if (!p.ready) waiting.push(`${p.namespace}/${p.name}: not Ready`);
  }
  return waiting;
}

const shown = (hash: string) => (hash ? `hash ${hash}` : "no hash");
