// `trellis run` (also `trellis` with flags only, as gardener-node-agent is started): the agent. Reads
// the NodeAgentConfiguration, connects, and runs the controllers until SIGTERM/SIGINT or until the
// hostname changes (then it exits so that systemd starts it again under the new name).
import { existsSync, realpathSync } from "node:fs";
import { hostname } from "node:os";
import { resolve } from "node:path";
import { parseArgs } from "node:util";
import { agentUnit, paths } from "../api/paths.ts";
import { createStateStore, removeLeftoverTemp } from "../apply/state-store.ts";
import { startBootstrapCredentialsCleanup } from "../controllers/bootstrap-credentials.ts";
import { startCertificateController } from "../controllers/certificate.ts";
import { startHealthController } from "../controllers/health.ts";
import { startHostnameCheck } from "../controllers/hostname.ts";
import { startLeaseController } from "../controllers/lease.ts";
import { startNodeSource } from "../controllers/node-source.ts";
import { startOscController } from "../controllers/osc.ts";
import { startRollout } from "../controllers/rollout.ts";
import { startRestartController } from "../controllers/restart.ts";
import { startTokenController } from "../controllers/token.ts";
import type { Controller } from "../controllers/types.ts";
import { startUnitHealthController } from "../controllers/unit-health.ts";
import { createFiles } from "../host/files.ts";
import { archOf, createImageStore } from "../host/registry/store.ts";
import { createSystemd } from "../host/systemd.ts";
import { kubeFromConnection } from "../kube/client.ts";
import { connectionFor } from "../kube/connection.ts";
import { createEventRecorder } from "../kube/events.ts";
import { createLogger, describeError } from "../log.ts";
import { createRegistry } from "../metrics.ts";
import { startServers } from "../server.ts";
import { createStatusBoard, readiness } from "../status.ts";
import { commit, version } from "../version.ts";
import { loadAgentConfig } from "./agent-config.ts";
import { UsageError } from "./errors.ts";

const help = `usage: trellis run --config-dir DIR [--hostname NAME]

Runs the node agent: watches the OperatingSystemConfig Secret named in the configuration and keeps
this machine at it, renews the node's lease, checks kubelet, containerd and the configured units,
syncs tokens, and serves /healthz, /readyz and /metrics on localhost. DIR holds the
NodeAgentConfiguration (gardener-node-agent's format).`;

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
  const controllers = config.controllers;
  log.info("trellis starting", { version, commit, config: file, server: kube.server, hostName, secret: controllers.operatingSystemConfig.secretName });

  const files = createFiles("/");
  const systemd = createSystemd({ log });
  const store = createStateStore(files);
  // Before anything writes there: what an agent killed mid-write left behind.
  await removeLeftoverTemp(files).then(
    (removed) => removed.length > 0 && log.info("removed temp files a killed agent left", { files: removed }),
    (err: unknown) => log.warn("could not remove temp files a killed agent left", { error: describeError(err) }),
  );
  const events = createEventRecorder({ kube, log });
  const metrics = createRegistry();
  const status = createStatusBoard({ files, log });
  // Bound before any controller starts: a port already taken ends the agent before it touched anything.
  const servers = await startServers({
    health: config.server.healthProbes,
    metrics: config.server.metrics,
    registry: metrics,
    ready: () => readiness(status),
    log,
  });
  const node = startNodeSource({ kube, hostName, log });
  let stopFor: (reason: string) => void = () => {};
  const stopRequested = new Promise<string>((done) => (stopFor = done));

  const rollout = startRollout({
    kube,
    files,
    systemd,
    store,
    events,
    node,
    status,
    log,
    secretName: controllers.operatingSystemConfig.secretName,
    stuckThresholdMs: controllers.systemdUnitCheck.stuckThreshold,
  });
  // Only the kubeconfig `trellis bootstrap` wrote holds a certificate the agent obtained and renews.
  const certificate =
    connection.kind === "kubeconfig" && connection.path === paths.kubeconfig
      ? startCertificateController({ kube, files, log, metrics, status, kubeconfigPath: connection.path })
      : undefined;
  const tokens = startTokenController({ kube, files, log, metrics, status, syncConfigs: controllers.token.syncConfigs, syncPeriodMs: controllers.token.syncPeriod });
  const running: Controller[] = [
    node,
    rollout,
    startOscController({
      kube,
      files,
      systemd,
      store,
      events,
      node,
      status,
      metrics,
      log,
      secretName: controllers.operatingSystemConfig.secretName,
      kubernetesVersion: controllers.operatingSystemConfig.kubernetesVersion,
      syncPeriodMs: controllers.operatingSystemConfig.syncPeriod,
      hostName,
      selfUnit: agentUnit,
      selfBinary: realpathSync(process.execPath),
      configDir: resolve(values["config-dir"]),
      images: createImageStore({ cacheDir: paths.imageCache, hostsDir: paths.containerdHostsDir, arch: archOf(process.arch), log }),
      rollout,
      tokens,
      certificate,
      apiServer: { server: config.apiServer.server || kube.server, caFile: config.apiServer.caFile || paths.clusterCa },
    }),
    startBootstrapCredentialsCleanup({ files, node, store, log, bootstrapTokenInUse: connection.kind === "token-file" }),
    startLeaseController({ kube, node, log, metrics, status }),
    tokens,
    startHealthController({ systemd, nodes: node, events, metrics, status, log, config: controllers.healthCheck }),
    startUnitHealthController({ systemd, kube, nodes: node, store, status, log, config: controllers.systemdUnitCheck }),
    startRestartController({ kube, systemd, events, nodes: node, log, selfUnit: agentUnit, rollout }),
    startHostnameCheck({ log, restartSelf: () => stopFor("hostname changed") }),
    ...(certificate ? [certificate] : []),
  ];
  for (const s of ["SIGTERM", "SIGINT"] as const) process.once(s, () => stopFor(s));
  const reason = await stopRequested;
  log.info("trellis stopping", { reason });
  // Controllers first (the OSC controller finishes the step it is in), then the servers and the bus.
  await Promise.all(running.map((c) => c.stop()));
  await servers.stop();
  await status.close();
  systemd.close();
  return 0;
}
