// Reads an OSC for `trellis plan`/`apply` from a file: the OperatingSystemConfig YAML itself, or the
// OSC Secret as `kubectl get secret -o yaml` prints it (data["osc.yaml"], base64), and resolves it for
// this machine the way the agent does. Without a cluster there are no Secrets to read: secretRef files
// are reported as missing. imageRef files are pulled through the machine's containerd mirrors.
import { Buffer } from "node:buffer";
import { readFileSync } from "node:fs";
import { hostname } from "node:os";
import { parse as parseYaml } from "yaml";
import { type Desired, parseOsc, sha256Hex } from "../api/desired.ts";
import { oscDataKey, paths } from "../api/paths.ts";
import { desiredForNode } from "../apply/desired-for-node.ts";
import { type Files, hostPathUnder } from "../host/files.ts";
import { archOf, createImageStore } from "../host/registry/store.ts";
import type { Logger } from "../log.ts";

export class OscInputError extends Error {
  override name = "OscInputError";
}

export type OscInput = { text: string; checksum: string; desired: Desired };

export async function readOscFile(path: string, files: Files, log: Logger, host = hostname()): Promise<OscInput> {
  let text = readFileSync(path, "utf8");
  const doc = safeYaml(text);
  if (isSecret(doc)) {
    const encoded = doc.data?.[oscDataKey];
    if (typeof encoded !== "string") throw new OscInputError(`${path}: Secret has no data["${oscDataKey}"]`);
    text = Buffer.from(encoded, "base64").toString("utf8");
  }
  const parsed = parseOsc(text, path);
  if (!parsed.ok) throw new OscInputError(parsed.errors.join("\n"));
  const images = createImageStore({
    cacheDir: hostPathUnder(files.root, paths.imageCache),
    hostsDir: hostPathUnder(files.root, paths.containerdHostsDir),
    arch: archOf(process.arch),
    log,
  });
  const resolved = await desiredForNode(parsed.value, path, { files, hostName: host, images, log });
  if (!resolved.ok) throw new OscInputError(resolved.errors.join("\n"));
  return { text, checksum: sha256Hex(text), desired: resolved.value };
}

function safeYaml(text: string): unknown {
  try {
    return parseYaml(text, { version: "1.1" });
  } catch {
    return undefined; // parseOsc reports it with the field and source
  }
}

function isSecret(doc: unknown): doc is { data?: Record<string, unknown> } {
  return typeof doc === "object" && doc !== null && (doc as { kind?: unknown }).kind === "Secret";
}
