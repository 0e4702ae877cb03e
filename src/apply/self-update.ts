// An OSC that replaces the agent's own binary, or the configuration it reads, must not leave the node
// with an agent that cannot start: systemd would restart it forever and nothing would ever apply a fix.
// Before such an OSC is applied, the agent it leaves behind (the new binary, else the running one) is run
// once against the configuration it will find after the apply (the config files in its config dir as
// they are now, overlaid with the ones the OSC writes). Gardener keeps one config file per agent version
// for this reason; the check makes it hold for any binary and any configuration. A binary that is not
// trellis — gardener-node-agent, when an operator goes back to it — cannot be asked about the
// configuration (it has no check-config); it must at least start on this machine and print its version.
import { execFile } from "node:child_process";
import { basename, dirname } from "node:path";
import type { Desired, DesiredFile } from "../api/desired.ts";
import { paths } from "../api/paths.ts";
import { type Files, hostPathUnder } from "../host/files.ts";
import type { Logger } from "../log.ts";

export type SelfUpdateCheck = {
  files: Files;
  /** Node path of the running agent's binary. */
  selfBinary: string;
  /** The agent's --config-dir (node path). */
  configDir: string;
  /** sha256 of what trellis last installed at selfBinary (its ownership record), if anything. */
  installed?: string;
  timeoutMs?: number;
  /** Where a binary that is not trellis, hence only started, is told of. */
  log?: Logger;
};

const configFile = /^config(-.+)?\.yaml$/;

/** Undefined when the OSC leaves the agent and its configuration alone, or the agent after it starts; else why not. */
export async function checkSelfUpdate(desired: Desired, check: SelfUpdateCheck): Promise<string | undefined> {
  const binary = desired.files.find((f) => f.path === check.selfBinary);
  // The binary trellis installed itself was checked then: no need to hash 100 MB on every re-check.
  // Otherwise (the first apply on a node install.sh set up) the binary is inspected, which the table of
  // known hashes answers while its identity is unchanged (src/host/known-hashes.ts), and the node's
  // observation after this finds it there too.
  const newBinary = binary && binary.sha256 !== check.installed && binary.sha256 !== (await currentSha256(check.files, check.selfBinary)) ? binary : undefined;
  const configs = desired.files.filter(isConfigOf(check.configDir));
  const changedConfig = (await Promise.all(configs.map(async (f) => ((await check.files.sha256(f.path)) === f.sha256 ? undefined : f)))).find((f) => f);
  if (!newBinary && !changedConfig) return undefined;
  const dir = `${paths.tempDir}/agent-check-${(newBinary ?? changedConfig)?.sha256.slice(0, 12)}`;
  const configDir = `${dir}/config`;
  try {
    if (newBinary) await check.files.writeAtomic(`${dir}/agent`, newBinary.content, 0o700);
    for (const name of await check.files.list(check.configDir)) {
      if (!configFile.test(name)) continue;
      const content = await check.files.read(`${check.configDir}/${name}`);
      if (content) await check.files.writeAtomic(`${configDir}/${name}`, content, 0o600);
    }
    for (const f of configs) await check.files.writeAtomic(`${configDir}/${basename(f.path)}`, f.content, 0o600);
    const host = (p: string) => hostPathUnder(check.files.root, p);
    const agent = host(newBinary ? `${dir}/agent` : check.selfBinary);
    const timeoutMs = check.timeoutMs ?? 30_000;
    const result = await run([agent, "check-config", "--config-dir", host(configDir)], timeoutMs);
    if (result.ok) return undefined;
    const other = newBinary ? await anotherAgentStarts(agent, timeoutMs) : undefined;
    if (other !== undefined) {
      check.log?.info("the new agent binary is not trellis: it starts on this machine, its configuration cannot be checked", { path: check.selfBinary, sha256: newBinary?.sha256, version: other });
      return undefined;
    }
    return newBinary
      ? `${newBinary.origin}: the new agent binary (sha256 ${newBinary.sha256.slice(0, 12)}) cannot start with this node's configuration, so it is not installed: ${result.output}`
      : `${changedConfig?.origin}: the agent cannot start with the configuration this OSC writes, so it is not applied: ${result.output}`;
  } finally {
    await removeTree(check.files, dir);
  }
}

/**
 * What a binary that is not trellis says with --version (gardener-node-agent: "Kubernetes v1.150.0"), if it
 * starts; undefined for trellis (it answers `version --json`: its check-config failure stands) or for a
 * binary that does not start here.
 */
async function anotherAgentStarts(agent: string, timeoutMs: number): Promise<string | undefined> {
  const identity = await run([agent, "version", "--json"], timeoutMs);
  if (identity.ok && isTrellisVersion(identity.output)) return undefined;
  const version = await run([agent, "--version"], timeoutMs);
  return version.ok ? version.output : undefined;
}

function isTrellisVersion(output: string): boolean {
  try {
    const v: unknown = JSON.parse(output);
    return typeof v === "object" && v !== null && "version" in v && "commit" in v;
  } catch {
    return false;
  }
}

const currentSha256 = async (files: Files, path: string) => (await files.inspect([path])).get(path)?.file?.sha256;

const isConfigOf = (configDir: string) => (f: DesiredFile) => dirname(f.path) === configDir && configFile.test(basename(f.path));

function run(cmd: string[], timeoutMs: number): Promise<{ ok: boolean; output: string }> {
  return new Promise((resolve) => {
    const failed = (err: Error, output = "") => resolve({ ok: false, output: `${err.message.split("\n")[0]}${output ? `: ${output}` : ""}` });
    try {
      execFile(cmd[0] as string, cmd.slice(1), { timeout: timeoutMs, maxBuffer: 1 << 20 }, (err, stdout, stderr) => {
        const output = `${stderr}${stdout}`.trim().split("\n").slice(-5).join("\n");
        if (err) failed(err, output);
        else resolve({ ok: true, output });
      });
    } catch (err) {
      // Bun throws an exec failure (ENOEXEC: not a binary for this machine) instead of passing it on.
      failed(err instanceof Error ? err : new Error(String(err)));
    }
  });
}

async function removeTree(files: Files, dir: string): Promise<void> {
  for (const name of await files.list(`${dir}/config`)) await files.remove(`${dir}/config/${name}`);
  await files.removeDirIfEmpty(`${dir}/config`);
  await files.remove(`${dir}/agent`);
  await files.removeDirIfEmpty(dir);
}
