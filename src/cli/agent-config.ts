// Finds and reads the NodeAgentConfiguration in --config-dir. Gardener writes it per agent version
// (config-<version>.yaml) so that a new binary never reads a config format it does not know; trellis
// prefers its own version's file, then config.yaml, then the newest config-*.yaml (the one the
// control plane wrote for the agent it believes runs here).
import { readdirSync, readFileSync, statSync } from "node:fs";
import { join } from "node:path";
import { type NodeAgentConfiguration, parseAgentConfig } from "../api/agent-config.ts";
import { version } from "../version.ts";

export class ConfigError extends Error {
  override name = "ConfigError";
}

export function configFileIn(dir: string): string {
  let names: string[];
  try {
    names = readdirSync(dir);
  } catch (err) {
    throw new ConfigError(`--config-dir ${dir}: ${err instanceof Error ? err.message : String(err)}`);
  }
  for (const preferred of [`config-v${version}.yaml`, "config.yaml"]) if (names.includes(preferred)) return join(dir, preferred);
  const versioned = names
    .filter((n) => /^config-.+\.yaml$/.test(n))
    .map((n) => ({ path: join(dir, n), mtime: statSync(join(dir, n)).mtimeMs }))
    .sort((a, b) => b.mtime - a.mtime);
  if (versioned[0]) return versioned[0].path;
  throw new ConfigError(`--config-dir ${dir}: no config-v${version}.yaml, config.yaml or config-*.yaml in it`);
}

export function loadAgentConfig(dir: string): { file: string; config: NodeAgentConfiguration } {
  const file = configFileIn(dir);
  const r = parseAgentConfig(readFileSync(file, "utf8"), file);
  if (!r.ok) throw new ConfigError(`invalid configuration:\n  ${r.errors.join("\n  ")}`);
  return { file, config: r.config };
}
