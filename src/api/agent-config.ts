// NodeAgentConfiguration (nodeagent.config.gardener.cloud/v1alpha1): gardener-node-agent's own
// config file, read unchanged so trellis can replace it. Defaults and limits are Gardener's
// (pkg/apis/config/nodeagent/v1alpha1 defaults.go and validation.go). Every field is acted on, or
// refused with an error naming it where gardener-node-agent refuses the value too, or, where trellis
// takes a value without doing what it asks (protobuf, profiling), said (docs/gardener-fields.md): a
// setting the operator wrote must never be dropped silently. A key that is no field of Gardener's is
// ignored, as gardener-node-agent's non-strict decoder ignores it, and said (a warning naming it): a
// newer Gardener's config must not keep the agent from starting.
import * as v from "valibot";
import { Buffer } from "node:buffer";
import { decodeBase64 } from "./base64.ts";
import { decodeGardener } from "./gardener-decode.ts";
import { object, record } from "./shapes.ts";
import { parseGoDuration } from "./duration.ts";
const json = "application/json";

const duration = (min: { ms: number; text: string }) =>
  v.pipe(
    v.string(),
    v.check((s) => parseGoDuration(s) !== undefined, (i) => `not a duration like "10m" or "1h30m": ${JSON.stringify(i.input)}`),
    v.transform((s) => parseGoDuration(s) as number),
    v.check((ms) => ms >= min.ms, `must be at least ${min.text}`),
  );
const syncPeriod = (fallback: string) => v.optional(duration({ ms: 15_000, text: "15s" }), fallback);

const server = (port: number) =>
  v.optional(
    object({
      bindAddress: v.optional(v.string(), ""),
      // Gardener treats an absent port and port 0 alike: the default.
      port: v.pipe(
        v.optional(v.pipe(v.number(), v.integer(), v.minValue(0), v.maxValue(65535)), 0),
        v.transform((p) => (p === 0 ? port : p)),
      ),
    }),
    {},
  );

const semver = v.pipe(
  v.string(),
  v.regex(/^v?\d+\.\d+\.\d+(?:[-+][0-9A-Za-z.+-]+)?$/, (i) => `not a version like "1.35.4": ${JSON.stringify(i.input)}`),
  v.transform((s) => s.replace(/^v/, "")),
);

export const NodeAgentConfigurationSchema = object({
  apiVersion: v.literal("nodeagent.config.gardener.cloud/v1alpha1"),
  kind: v.literal("NodeAgentConfiguration"),
  clientConnection: v.optional(
    object({
      kubeconfig: v.optional(v.string(), ""),
      // Go writes a field it has no value for as its zero value (Gardener's rendered configuration has
      // `qps: 0`), and Gardener's defaulting turns 0 into 50 and 100. A negative qps is client-go's "no limit".
      qps: v.optional(v.pipe(v.number(), v.transform((q) => (q === 0 ? 50 : q))), 50),
      burst: v.optional(v.pipe(v.number(), v.integer(), v.minValue(0, "must be non-negative"), v.transform((b) => (b === 0 ? 100 : b))), 100),
      // trellis's client speaks JSON whatever these say: a value asking for more is reported (notActedOn).
      acceptContentTypes: v.optional(v.string(), ""),
      contentType: v.optional(v.string(), ""),
    }),
    {},
  ),
  logLevel: v.optional(v.pipe(v.picklist(["debug", "info", "error", ""]), v.transform((l) => l || "info")), "info"),
  logFormat: v.optional(v.pipe(v.picklist(["json", "text", ""]), v.transform((f) => f || "json")), "json"),
  server: v.optional(object({ healthProbes: server(2751), metrics: server(2752) }), {}),
  // gardener-node-agent v1.150 registers no feature gate of its own; trellis has none either, so any
  // gate named is one whose behaviour it cannot switch.
  featureGates: v.optional(
    v.pipe(
      record(v.string(), v.boolean()),
      v.check((g) => Object.keys(g).length === 0, (i) => `${Object.keys(i.input as object).join(", ")}: not supported by trellis: trellis has no feature gates (gardener-node-agent v1.150 registers none)`),
    ),
    {},
  ),
  // trellis serves no profiling endpoint: a value asking for one is reported (notActedOn).
  debugging: v.optional(v.nullable(object({ enableProfiling: v.optional(v.nullable(v.boolean())), enableContentionProfiling: v.optional(v.nullable(v.boolean())) }))),
  apiServer: v.optional(
    v.pipe(
      object({
        server: v.optional(v.string(), ""),
        caFile: v.optional(v.string(), ""),
        // Gardener before v1.147 sends the CA itself (Go []byte: base64 of the PEM) instead of caFile.
        caBundle: v.optional(v.pipe(v.string(), v.check((b) => caBundlePem(b) !== undefined, "not base64 of a PEM certificate bundle"))),
      }),
      v.check((a) => !(a.caFile && a.caBundle), "caFile and caBundle are both set: Gardener sends one of them; remove the other"),
    ),
    {},
  ),
  bootstrap: v.optional(
    v.nullable(
      object({
        // Bytes, as Gardener renders the worker's data volume size.
        kubeletDataVolumeSize: v.optional(v.nullable(v.pipe(v.number(), v.integer(), v.minValue(1)))),
      }),
    ),
  ),
  controllers: object({
    operatingSystemConfig: object({
      secretName: v.pipe(v.string("must provide the secret name for the operating system config"), v.nonEmpty("must provide the secret name for the operating system config")),
      kubernetesVersion: semver,
      syncPeriod: syncPeriod("10m"),
    }),
    token: v.optional(
      v.pipe(
        object({
          syncConfigs: v.optional(v.array(object({ secretName: v.pipe(v.string(), v.nonEmpty()), path: v.pipe(v.string(), v.nonEmpty()) })), []),
          syncPeriod: syncPeriod("1h"),
        }),
        v.forward(
          v.check((t) => new Set(t.syncConfigs.map((c) => c.path)).size === t.syncConfigs.length, "paths must be unique"),
          ["syncConfigs"],
        ),
      ),
      {},
    ),
    systemdUnitCheck: v.optional(
      object({ syncPeriod: syncPeriod("1m"), stuckThreshold: v.optional(duration({ ms: 30_000, text: "30s" }), "5m") }),
      {},
    ),
    // trellis's own (Gardener never writes it): gardener-node-agent hard-codes these values.
    healthCheck: v.optional(
      object({
        syncPeriod: v.optional(duration({ ms: 1000, text: "1s" }), "30s"),
        kubeletFailureThreshold: v.optional(duration({ ms: 1000, text: "1s" }), "1m"),
        containerdFailureThreshold: v.optional(duration({ ms: 1000, text: "1s" }), "1m"),
        /** NotReady → Ready transitions of the Node within readinessFlapWindow that make a Warning event. */
        readinessFlaps: v.optional(v.pipe(v.number(), v.integer(), v.minValue(2)), 5),
        readinessFlapWindow: v.optional(duration({ ms: 1000, text: "1s" }), "10m"),
      }),
      {},
    ),
    // trellis's own: gardener-node-agent repairs nothing once its checksum matches.
    drift: v.optional(
      object({
        /** repair: at once and report; report: report only (the periodic re-check still repairs); disabled: no watches ("off" would be YAML 1.1's false). */
        mode: v.optional(v.picklist(["repair", "report", "disabled"]), "repair"),
        /** How long changes are gathered before they are looked at (an editor writes a file in several steps). */
        debounce: v.optional(duration({ ms: 10, text: "10ms" }), "200ms"),
        /** Repairs of one file or unit within recurringWindow that set the Node condition ConfigurationDrift. */
        recurringRepairs: v.optional(v.pipe(v.number(), v.integer(), v.minValue(2)), 3),
        recurringWindow: v.optional(duration({ ms: 1000, text: "1s" }), "10m"),
      }),
      {},
    ),
  }),
});

export type NodeAgentConfiguration = v.InferOutput<typeof NodeAgentConfigurationSchema>;

/** The API server's CA as the config gives it: caFile, else caBundle (older Gardener), else cluster-ca.crt. */
export function apiServerCa(apiServer: NodeAgentConfiguration["apiServer"], clusterCaFile: string): { file: string } | { data: string } {
  if (apiServer.caFile) return { file: apiServer.caFile };
  const pem = apiServer.caBundle === undefined ? undefined : caBundlePem(apiServer.caBundle);
  return pem === undefined ? { file: clusterCaFile } : { data: pem };
}

function caBundlePem(base64: string): string | undefined {
  const bytes = decodeBase64(base64);
  const pem = bytes && Buffer.from(bytes).toString("utf8");
  return pem?.includes("-----BEGIN CERTIFICATE-----") ? pem : undefined;
}


/**
 * `ignored`: what the file holds that trellis does not act on, one line each: keys that are no field of
 * Gardener's, values a repeated key replaced, and values of Gardener's fields that trellis does not do.
 */
export type ConfigResult = { ok: true; config: NodeAgentConfiguration; ignored: string[] } | { ok: false; errors: string[] };

/** Parses a NodeAgentConfiguration from YAML text; errors name the file and the field. */
export function parseAgentConfig(text: string, source: string): ConfigResult {
  const r = decodeGardener(NodeAgentConfigurationSchema, "NodeAgentConfiguration", text, source);
  return r.ok ? { ok: true, config: r.value, ignored: [...r.ignored, ...notActedOn(r.value).map((line) => `${source}: ${line}`)] } : r;
}

/** Values gardener-node-agent acts on that trellis takes without doing what they ask: the agent runs as without them. */
function notActedOn(config: NodeAgentConfiguration): string[] {
  const { contentType, acceptContentTypes } = config.clientConnection;
  const out: string[] = [];
  if (contentType !== "" && contentType !== json) out.push(`clientConnection.contentType: ${contentType}: not acted on: trellis's client sends ${json}`);
  if (acceptContentTypes.split(",").some((t) => t.trim() !== "" && t.trim() !== json)) {
    out.push(`clientConnection.acceptContentTypes: ${acceptContentTypes}: not acted on: trellis's client accepts ${json} only`);
  }
  if (config.debugging?.enableProfiling) {
    out.push("debugging.enableProfiling: true: not acted on: trellis serves no profiling endpoint");
    // Without enableProfiling gardener-node-agent ignores it too.
    if (config.debugging.enableContentionProfiling) out.push("debugging.enableContentionProfiling: true: not acted on: trellis serves no profiling endpoint");
  }
  return out;
}
