// The bad-input corpus (test/fixtures/bad-input): every case as bytes for `trellis plan --osc` and as
// a Secret for the agent, with the images the imageRef cases point at. cases.yaml says, for each case,
// its class, its form (an OSC as Gardener puts it in the Secret's osc.yaml, or a whole Secret), the
// field its error must name and, for the few that only one of the two ways can express, why.
import { Buffer } from "node:buffer";
import { readFileSync, writeFileSync } from "node:fs";
import { parse, stringify } from "yaml";
import { generated } from "../fixtures/bad-input/generate.ts";
import { writeLayout } from "./oci.ts";
import type { Registry } from "./registry.ts";

const dir = new URL("../fixtures/bad-input/", import.meta.url).pathname;

export type BadCase = {
  name: string;
  class: string;
  /** osc: the bytes of osc.yaml; secret: a Secret manifest (stringData is encoded into data, as the API server does). */
  form: "osc" | "secret";
  /** Text the error must contain: the field (and often the problem), after the object's name. */
  field: string;
  /** A regular expression the error must match as well. */
  error?: RegExp;
  /** Only one way can express the case (e.g. the API server refuses a Secret that is not base64). */
  only?: "plan" | "agent";
  why?: string;
  generate?: string;
};

type Manifest = { name: string; class: string; form?: "secret"; generate?: string; field: string; error?: string; only?: "plan" | "agent"; why?: string }[];

export function loadBadCases(): BadCase[] {
  const manifest = parse(readFileSync(`${dir}/cases.yaml`, "utf8")) as Manifest;
  return manifest.map((m) => ({
    name: m.name,
    class: m.class,
    form: m.form ?? "osc",
    field: m.field,
    ...(m.error ? { error: new RegExp(m.error) } : {}),
    ...(m.only ? { only: m.only, why: m.why ?? "" } : {}),
    ...(m.generate ? { generate: m.generate } : {}),
  }));
}

/** What the fixtures leave to the test: the registry the imageRef cases pull from. */
export type CaseVars = { registry: string };

function caseText(c: BadCase, vars: CaseVars): string {
  return readFileSync(`${dir}/${c.name}.yaml`, "utf8").replaceAll("${REGISTRY}", vars.registry);
}

/** osc.yaml's bytes of an osc-form case. */
export function caseOscBytes(c: BadCase, vars: CaseVars): Uint8Array {
  if (c.form !== "osc") throw new Error(`${c.name} is a Secret case`);
  if (c.generate) {
    const make = generated[c.generate];
    if (!make) throw new Error(`${c.name}: no generator ${c.generate}`);
    return make();
  }
  return new TextEncoder().encode(caseText(c, vars));
}

export type CaseSecret = { annotations: Record<string, string>; data: Record<string, string> };

/** A secret-form case as the API server stores it: data base64, stringData folded in. */
export function caseSecret(c: BadCase, vars: CaseVars): CaseSecret {
  const doc = parse(caseText(c, vars)) as { metadata?: { annotations?: Record<string, string> }; data?: Record<string, string>; stringData?: Record<string, string> };
  const data = { ...doc.data };
  for (const [k, v] of Object.entries(doc.stringData ?? {})) data[k] = Buffer.from(v).toString("base64");
  return { annotations: doc.metadata?.annotations ?? {}, data };
}

/** The file `trellis plan --osc` reads for a case: osc.yaml itself, or the Secret as kubectl prints it. */
export function writeCaseFile(c: BadCase, vars: CaseVars, path: string): void {
  if (c.form === "osc") return writeFileSync(path, caseOscBytes(c, vars));
  const s = caseSecret(c, vars);
  writeFileSync(path, stringify({ apiVersion: "v1", kind: "Secret", metadata: { name: "corpus", namespace: "kube-system", annotations: s.annotations }, type: "Opaque", data: s.data }));
}

/**
 * The images of the imageRef cases, pushed to `registry` (reached through the mirror the cases
 * configure for corpus.invalid): corpus/tool:v1 holding /usr/bin/tool, and corpus/tampered:v1 whose
 * layer blob in the registry's storage no longer matches its digest.
 */
export async function pushBadInputImages(registry: Registry, workDir: string): Promise<void> {
  const platform = { os: "linux", architecture: process.arch === "arm64" ? "arm64" : "amd64" };
  writeLayout(`${workDir}/tool`, "v1", { platform, layers: [{ "usr/bin/tool": { content: "#!/bin/sh\necho tool\n", mode: 0o755 } }] });
  await registry.push(`${workDir}/tool`, "corpus/tool", "v1");
  const tampered = writeLayout(`${workDir}/tampered`, "v1", { platform, layers: [{ "usr/bin/tool": { content: "#!/bin/sh\necho tampered\n", mode: 0o755 } }] });
  await registry.push(`${workDir}/tampered`, "corpus/tampered", "v1");
  const hex = (tampered.images[0]?.layers[0] as { digest: string }).digest.slice("sha256:".length);
  const blob = `${registry.dataDir}/docker/registry/v2/blobs/sha256/${hex.slice(0, 2)}/${hex}/data`;
  const bytes = readFileSync(blob);
  bytes[bytes.length >> 1] = (bytes[bytes.length >> 1] as number) ^ 0xff; // same size, other bytes
  writeFileSync(blob, bytes);
}
