// NodeAgentConfiguration (nodeagent.config.gardener.cloud/v1alpha1): gardener-node-agent's own
// config file, read unchanged so trellis can replace it. Defaults and limits are Gardener's
// (pkg/apis/config/nodeagent/v1alpha1 defaults.go and validation.go).
import * as v from "valibot";
import { object, record } from "./shapes.ts";
import { parseGoDuration } from "./duration.ts";
import { formatIssues } from "./issues.ts";
import { parseYaml } from "./yaml.ts";

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
      // `qps: 0` and `logLevel: ""`), and Gardener's defaulting turns that into the default.
      qps: v.optional(v.pipe(v.number(), v.transform((q) => q || 50)), 50),
      burst: v.optional(v.pipe(v.number(), v.integer(), v.transform((b) => b || 100)), 100),
      acceptContentTypes: v.optional(v.string(), ""),
      contentType: v.optional(v.string(), ""),
    }),
    {},
  ),
  logLevel: v.optional(v.pipe(v.picklist(["debug", "info", "error", ""]), v.transform((l) => l || "info")), "info"),
  logFormat: v.optional(v.pipe(v.picklist(["json", "text", ""]), v.transform((f) => f || "json")), "json"),
  server: v.optional(object({ healthProbes: server(2751), metrics: server(2752) }), {}),
  featureGates: v.optional(record(v.string(), v.boolean()), {}),
  apiServer: v.optional(object({ server: v.optional(v.string(), ""), caFile: v.optional(v.string(), "") }), {}),
  bootstrap: v.optional(object({ kubeletDataVolumeSize: v.optional(v.pipe(v.number(), v.integer())) })),
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


export type ConfigResult = { ok: true; config: NodeAgentConfiguration } | { ok: false; errors: string[] };

/** Parses a NodeAgentConfiguration from YAML text; errors name the file and the field. */
export function parseAgentConfig(text: string, source: string): ConfigResult {
  const doc = parseYaml(text, source);
  if (!doc.ok) return { ok: false, errors: doc.errors };
  const r = v.safeParse(NodeAgentConfigurationSchema, doc.value);
  return r.success ? { ok: true, config: r.output } : { ok: false, errors: formatIssues(r.issues).map((e) => `${source}: ${e}`) };
}
