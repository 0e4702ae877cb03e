// Finds and reads the NodeAgentConfiguration in --config-dir. Gardener writes it per agent version
// (config-<version>.yaml, the version of the gardener-node-agent its control plane deploys) so that a new
// binary never reads a config format it does not know. trellis prefers its own version's file, then the
// highest version's config-*.yaml (what the control plane wrote last: an OSC brings the current one),
// then config.yaml (a node bootstrapped without Gardener's init script).
import { readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { type NodeAgentConfiguration, parseAgentConfig } from "../api/agent-config.ts";
import { compareText } from "../api/text-order.ts";
import { version } from "../version.ts";

export class ConfigError extends Error {
  override name = "ConfigError";
}

const versionOf = (name: string): number[] => (/^config-v?(.+)\.yaml$/.exec(name)?.[1] ?? "").split(/[.+-]/).map((p) => Number.parseInt(p, 10) || 0);
const newerFirst = (a: string, b: string): number => {
  const [va, vb] = [versionOf(a), versionOf(b)];
  for (let i = 0; i < Math.max(va.length, vb.length); i++) if ((va[i] ?? 0) !== (vb[i] ?? 0)) return (vb[i] ?? 0) - (va[i] ?? 0);
  return compareText(a, b);
};

export function configFileIn(dir: string): string {
  let names: string[];
  try {
    names = readdirSync(dir);
  } catch (err) {
    throw new ConfigError(`--config-dir ${dir}: ${err instanceof Error ? err.message : String(err)}`);
  }
  const own = `config-v${version}.yaml`;
  const versioned = names.filter((n) => /^config-.+\.yaml$/.test(n)).sort(newerFirst);
  const chosen = names.includes(own) ? own : (versioned[0] ?? (names.includes("config.yaml") ? "config.yaml" : undefined));
  if (chosen) return join(dir, chosen);
  throw new ConfigError(`--config-dir ${dir}: no config-v${version}.yaml, config-*.yaml or config.yaml in it`);
}

/** `ignored`: what the configuration holds that is not acted on (keys Gardener's type does not have, values trellis does not do), to be said. */
export function loadAgentConfig(dir: string): { file: string; config: NodeAgentConfiguration; ignored: string[] } {
  const file = configFileIn(dir);
  const r = parseAgentConfig(readFileSync(file, "utf8"), file);
  if (!r.ok) throw new ConfigError(`invalid configuration:\n  ${r.errors.join("\n  ")}`);
  return { file, config: r.config, ignored: r.ignored };
}
