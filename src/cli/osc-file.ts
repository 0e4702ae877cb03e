// Reads an OSC for `trellis plan`/`apply` from a file: the OperatingSystemConfig YAML itself, or the
// OSC Secret as `kubectl get secret -o yaml` prints it (data["osc.yaml"], base64), and resolves it for
// this machine the way the agent does. Without a cluster there are no Secrets to read: secretRef files
// are reported as missing. imageRef files are pulled through the machine's containerd mirrors.
import { mkdtemp, rm } from "node:fs/promises";
import { readFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { decodeBase64 } from "../api/base64.ts";
import { type Desired, parseOscBytes } from "../api/desired.ts";
import { layeredChecksum, layerOsc, parseOverlays } from "../api/layers.ts";
import { oscDataKey, paths } from "../api/paths.ts";
import { parseRolloutSettings } from "../api/rollout.ts";
import { oscYamlLimits, parseYaml } from "../api/yaml.ts";
import { desiredForNode } from "../apply/desired-for-node.ts";
import { agentHostName } from "../controllers/hostname.ts";
import { type Files, hostPathUnder } from "../host/files.ts";
import { archOf, createImageStore } from "../host/registry/store.ts";
import type { Logger } from "../log.ts";

export class OscInputError extends Error {
  override name = "OscInputError";
}

/** `layers`: where each unit and file came from ("osc.yaml" or an overlay), when the Secret has overlays. */
export type OscInput = { bytes: Uint8Array; checksum: string; desired: Desired; layers?: Record<string, string> };

/** The Secret form carries the OSC in base64 (4/3 of its size) plus the Secret's own fields. */
const secretFormLimits = { ...oscYamlLimits, maxBytes: Math.ceil((oscYamlLimits.maxBytes * 4) / 3) + 64 * 1024 };

/**
 * `imageCache`: "node" extracts imageRef files into the node's cache (apply); "throwaway" into a
 * temporary directory outside the root that is removed afterwards (plan, which changes nothing).
 */
export async function readOscFile(path: string, files: Files, log: Logger, opts: { host?: string; labels?: Record<string, string>; imageCache: "node" | "throwaway" }): Promise<OscInput> {
  const { bytes, source, overlayData, annotations } = oscBytesOf(path, readFileSync(path));
  const parsed = parseOscBytes(bytes, source);
  if (!parsed.ok) throw new OscInputError(parsed.errors.join("\n"));
  // The agent refuses a Secret whose rollout settings are bad: so does the plan of it.
  const rollout = parseRolloutSettings(annotations, source);
  if (!rollout.ok) throw new OscInputError(rollout.errors.join("\n"));
  const overlays = parseOverlays(overlayData, source);
  if (!overlays.ok) throw new OscInputError(overlays.errors.join("\n"));
  const layered = layerOsc(parsed.value, overlays.value, opts.labels ?? {}, source);
  if (!layered.ok) throw new OscInputError(layered.errors.join("\n"));
  const cacheDir = opts.imageCache === "node" ? hostPathUnder(files.root, paths.imageCache) : await mkdtemp(join(tmpdir(), "trellis-plan-images-"));
  try {
    const images = createImageStore({ cacheDir, hostsDir: hostPathUnder(files.root, paths.containerdHostsDir), arch: archOf(process.arch), log });
    const resolved = await desiredForNode(layered.value.osc, source, { files, hostName: agentHostName(opts.host), images, log, provenance: layered.value.provenance, ignored: parsed.ignored });
    if (!resolved.ok) throw new OscInputError(resolved.errors.join("\n"));
    return {
      bytes,
      checksum: layeredChecksum(bytes, layered.value.matched),
      desired: resolved.value,
      ...(overlays.value.length > 0 ? { layers: Object.fromEntries([...layered.value.provenance].sort(([a], [b]) => a.localeCompare(b))) } : {}),
    };
  } finally {
    if (opts.imageCache === "throwaway") await rm(cacheDir, { recursive: true, force: true });
  }
}

type OscBytes = { bytes: Uint8Array; source: string; overlayData: Record<string, Uint8Array>; annotations?: Record<string, string> };

/** The OSC's bytes: the file itself, or data["osc.yaml"] of the Secret in it (decoded strictly), and the Secret's overlays and annotations. */
function oscBytesOf(path: string, raw: Uint8Array): OscBytes {
  const text = new TextDecoder().decode(raw.subarray(0, Math.min(raw.byteLength, secretFormLimits.maxBytes + 1)));
  const doc = raw.byteLength <= secretFormLimits.maxBytes ? parseYaml(text, path, secretFormLimits) : undefined;
  // Anything that is not a Secret is read as the OSC itself, whose parse names its problems.
  if (!doc?.ok || !isSecret(doc.value)) return { bytes: raw, source: path, overlayData: {} };
  const secret = doc.value;
  const decode = (key: string) => {
    const encoded = secret.data?.[key];
    if (typeof encoded !== "string") throw new OscInputError(`${path}: Secret has no data["${key}"]`);
    const bytes = decodeBase64(encoded);
    if (!bytes) throw new OscInputError(`${path}: data["${key}"] is not valid base64`);
    return bytes;
  };
  const overlayData = Object.fromEntries(Object.keys(secret.data ?? {}).filter((k) => k.startsWith("overlay")).map((k) => [k, decode(k)]));
  return { bytes: decode(oscDataKey), source: path, overlayData, ...(secret.metadata?.annotations ? { annotations: secret.metadata.annotations } : {}) };
}

function isSecret(doc: unknown): doc is { data?: Record<string, unknown>; metadata?: { annotations?: Record<string, string> } } {
  return typeof doc === "object" && doc !== null && (doc as { kind?: unknown }).kind === "Secret";
}
