// `trellis run` (also `trellis` with no command): the agent. Reads the NodeAgentConfiguration,
// connects, and runs the controllers until SIGTERM/SIGINT.
import { existsSync } from "node:fs";
import { hostname } from "node:os";
import { parseArgs } from "node:util";
import { agentUnit } from "../api/paths.ts";
import { createStateStore } from "../apply/state-store.ts";
import { startOscController } from "../controllers/osc.ts";
import { createFiles } from "../host/files.ts";
import { createSystemd } from "../host/systemd.ts";
import { kubeFromConnection } from "../kube/client.ts";
import { connectionFor } from "../kube/connection.ts";
import { createEventRecorder } from "../kube/events.ts";
import { createLogger } from "../log.ts";
import { commit, version } from "../version.ts";
import { loadAgentConfig } from "./agent-config.ts";
import { UsageError } from "./errors.ts";

const help = `usage: trellis run --config-dir DIR [--hostname NAME]

Runs the node agent: watches the OperatingSystemConfig Secret named in the configuration and keeps
this machine at it. DIR holds the NodeAgentConfiguration (gardener-node-agent's format).`;

export async function run(args: string[]): Promise<number> {
  const { values } = parseArgs({
    args,
    options: { "config-dir": { type: "string" }, hostname: { type: "string" }, help: { type: "boolean", default: false } },
  });
  if (values.help) {
    console.log(help);
    return 0;
  }
  if (!values["config-dir"]) throw new UsageError(`--config-dir is required\n\n${help}`);
  const { file, config } = loadAgentConfig(values["config-dir"]);
  const log = createLogger({ level: config.logLevel === "error" ? "error" : config.logLevel });
  const connection = connectionFor(config, process.env, existsSync);
  const kube = kubeFromConnection(connection);
  if (kube.insecure) log.warn("TLS verification is disabled by the kubeconfig (insecure-skip-tls-verify)", { server: kube.server });
  const hostName = values.hostname ?? hostname();
  log.info("trellis starting", { version, commit, config: file, server: kube.server, hostName, secret: config.controllers.operatingSystemConfig.secretName });

  const files = createFiles("/");
  const systemd = createSystemd({ log });
  const osc = startOscController({
    kube,
    files,
    systemd,
    store: createStateStore(files),
    events: createEventRecorder({ kube, log }),
    log,
    secretName: config.controllers.operatingSystemConfig.secretName,
    kubernetesVersion: config.controllers.operatingSystemConfig.kubernetesVersion,
    syncPeriodMs: config.controllers.operatingSystemConfig.syncPeriod,
    hostName,
    selfUnit: agentUnit,
    bootstrapTokenInUse: connection.kind === "token-file",
  });

  const signal = await new Promise<string>((resolve) => {
    for (const s of ["SIGTERM", "SIGINT"] as const) process.once(s, () => resolve(s));
  });
  log.info("trellis stopping", { signal });
  await osc.stop();
  systemd.close();
  return 0;
}
