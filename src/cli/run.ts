// `trellis run` (also `trellis` with flags only, as gardener-node-agent is started): the agent. Reads
// the NodeAgentConfiguration, connects, and runs the controllers until SIGTERM/SIGINT or until the
// hostname changes (then it exits so that systemd starts it again under the new name).
import { existsSync, realpathSync } from "node:fs";
import { resolve } from "node:path";
import { parseArgs } from "node:util";
import { apiServerCa } from "../api/agent-config.ts";
import { agentUnit, paths } from "../api/paths.ts";
import { createStateStore, removeLeftoverTemp, stateLockPath } from "../apply/state-store.ts";
import { startBootstrapCredentialsCleanup } from "../controllers/bootstrap-credentials.ts";
import { startCertificateController } from "../controllers/certificate.ts";
import { startDriftController } from "../controllers/drift.ts";
import { startHealthController } from "../controllers/health.ts";
import { agentHostName, startHostnameCheck } from "../controllers/hostname.ts";
import { startLeaseController } from "../controllers/lease.ts";
import { startNodeSource } from "../controllers/node-source.ts";
import { startOscController } from "../controllers/osc/controller.ts";
import { startRollout } from "../controllers/rollout/controller.ts";
import { startRestartController } from "../controllers/restart.ts";
import { startTokenController } from "../controllers/token.ts";
import type { Controller } from "../controllers/types.ts";
import { startUnitHealthController } from "../controllers/unit-health.ts";
import { createFiles, type Files } from "../host/files.ts";
import { withKnownHashes } from "../host/known-hashes.ts";
import { archOf, createImageStore } from "../host/registry/store.ts";
import { startSystemdNotify } from "../host/notify.ts";
import { lockStateDir } from "../host/state-lock.ts";
import { createSystemd } from "../host/systemd.ts";
import { kubeFromConnection } from "../kube/client.ts";
import { connectionFor } from "../kube/connection.ts";
import { startSecretNameFollower } from "../controllers/secret-name.ts";
import { defaultWaitMs } from "../kube/csr.ts";
import { createEventRecorder } from "../kube/events.ts";
import { createLogger, describeError, type Logger } from "../log.ts";
import { createRegistry } from "../metrics.ts";
import { heapSnapshot, runtimeSettings } from "../runtime.ts";
import { startServers } from "../server.ts";
import { createStatusBoard, readiness } from "../status.ts";
import { monotonicMs } from "../time.ts";
import { commit, version } from "../version.ts";
import { loadAgentConfig } from "./agent-config.ts";
import { ensureAgentCredentials } from "./bootstrap.ts";
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
  const configDir = values["config-dir"];
  const { file, config, ignored } = loadAgentConfig(configDir);
  const log = createLogger({ level: config.logLevel, format: config.logFormat });
  for (const field of ignored) log.warn("configuration field not acted on", { config: file, field });
  const runtime = runtimeSettings();
  if (runtime.warning) log.warn(runtime.warning, { reason: runtime.reason });
  const hostName = agentHostName(values.hostname);
  const controllers = config.controllers;
  // Held until the process ends: no `trellis apply` or second agent changes the node meanwhile.
  const lock = await lockStateDir(stateLockPath, "run");
  const notify = startSystemdNotify({ log });
  const files = await withKnownHashes(createFiles("/"), { path: paths.knownHashes, log });
  // SIGTERM is a graceful stop from here on, the wait for a client certificate included.
  let stopFor: (reason: string) => void = () => {};
  const stopRequested = new Promise<string>((done) => (stopFor = done));
  for (const s of ["SIGTERM", "SIGINT"] as const) process.once(s, () => stopFor(s));
  const stopping = new AbortController();
  void stopRequested.then((reason) => stopping.abort(new Error(`the agent is stopping (${reason})`)));
  let connection = connectionFor(config, process.env, existsSync);
  // Its own client certificate, as gardener-node-agent gets it: requested with the bootstrap token when
  // there is no kubeconfig yet, or when its certificate expired while the machine was off (it cannot
  // renew itself with it); without a bootstrap token the agent ends saying what an operator must do.
  if (connection.kind === "token-file" || connection.path === paths.kubeconfig) {
    try {
      await ensureAgentCredentials({ config, files, log, waitMs: defaultWaitMs, hostName, signal: stopping.signal });
    } catch (err) {
      if (!stopping.signal.aborted) throw err;
      // Nothing to undo: the pending request (written atomically before the CSR) is resumed at the next start.
      log.info("trellis stopping", { reason: await stopRequested, while: "waiting for its client certificate" });
      notify.close();
      lock.release();
      return 0;
    }
    connection = { kind: "kubeconfig", path: paths.kubeconfig };
  }
  const kube = kubeFromConnection(connection, config.clientConnection);
  if (kube.insecure) log.warn("TLS verification is disabled by the kubeconfig (insecure-skip-tls-verify)", { server: kube.server });
  log.info("trellis starting", { version, commit, config: file, server: kube.server, hostName, secret: controllers.operatingSystemConfig.secretName, runtime: { execArgv: runtime.execArgv, env: runtime.env } });

  const systemd = createSystemd({ log });
  const store = createStateStore(files);
  // Before anything writes there (and only now that no other trellis can): what an agent killed mid-write left behind.
  await removeLeftoverTemp(files).then(
    (removed) => removed.length > 0 && log.info("removed temp files a killed agent left", { files: removed }),
    (err: unknown) => log.warn("could not remove temp files a killed agent left", { error: describeError(err) }),
  );
  const events = createEventRecorder({ kube, log });
  const metrics = createRegistry();
  metrics
    .gauge("trellis_config_not_acted_on", "Parts of the agent's configuration that are not acted on (keys Gardener's type does not have, values trellis takes without doing what they ask: protobuf, profiling); the journal names each at every start, check-config prints them.")
    .set(ignored.length);
  const status = createStatusBoard({ files, log });
  // Bound before any controller starts: a port already taken ends the agent before it touched anything.
  const servers = await startServers({
    health: config.server.healthProbes,
    metrics: config.server.metrics,
    registry: metrics,
    ready: () => readiness(status),
    log,
  });
  const lastNodeName = new TextDecoder().decode((await files.read(paths.nodeName)) ?? new Uint8Array()).trim() || undefined;
  const node = startNodeSource({ kube, hostName, lastNodeName, log });
  // Remembered for the next start: after a hostname change the agent restarts, and kubelet's Node keeps its name.
  void node.found.then(async (n) => {
    const name = n.metadata?.name;
    if (!name || name === lastNodeName) return;
    await files.writeAtomic(paths.nodeName, `${name}\n`, 0o644).catch((err: unknown) => log.warn("could not remember the Node's name", { path: paths.nodeName, error: err }));
  });

  // What the OSC controller and the two that work alongside it (rollouts, drift) all use.
  const shared = { kube, files, systemd, store, events, node, status, log, secretName: controllers.operatingSystemConfig.secretName };
  const rollout = startRollout({ ...shared, stuckThresholdMs: controllers.systemdUnitCheck.stuckThreshold });
  // Only the kubeconfig `trellis bootstrap` wrote holds a certificate the agent obtained and renews.
  const certificate =
    connection.kind === "kubeconfig" && connection.path === paths.kubeconfig
      ? startCertificateController({ kube, files, log, metrics, status, kubeconfigPath: connection.path })
      : undefined;
  const tokens = startTokenController({ kube, files, log, metrics, status, syncConfigs: controllers.token.syncConfigs, syncPeriodMs: controllers.token.syncPeriod });
  const osc = startOscController({
    ...shared,
    metrics,
    kubernetesVersion: controllers.operatingSystemConfig.kubernetesVersion,
    syncPeriodMs: controllers.operatingSystemConfig.syncPeriod,
    hostName,
    selfUnit: agentUnit,
    selfBinary: realpathSync(process.execPath),
    configDir: resolve(configDir),
    images: createImageStore({ cacheDir: paths.imageCache, hostsDir: paths.containerdHostsDir, arch: archOf(process.arch), log }),
    rollout,
    tokens,
    certificate,
    apiServer: { server: config.apiServer.server || kube.server, ca: apiServerCa(config.apiServer, paths.clusterCa) },
  });
  void osc.firstReconcile.then(() => notify.ready("the first reconcile finished"));
  // The node's health checks (kubelet, containerd, every managed unit over D-Bus) start once the OSC's
  // first reconcile ended, for at most firstReconcileHeadStartMs: on a slow CPU they would otherwise
  // share it with that reconcile, which a start or a node's first boot waits for (issue 21).
  const firstReconcileFirst = { until: osc.firstReconcile, maxMs: firstReconcileHeadStartMs };
  const running: Controller[] = [
    node,
    rollout,
    osc,
    startDriftController({ ...shared, metrics, osc, selfUnit: agentUnit, config: controllers.drift }),
    startBootstrapCredentialsCleanup({ files, node, store, log, osc }),
    startLeaseController({ kube, node, log, metrics, status }),
    tokens,
    startHealthController({ systemd, kube, nodes: node, events, metrics, status, log, config: controllers.healthCheck, firstAfter: firstReconcileFirst }),
    startUnitHealthController({ systemd, kube, nodes: node, store, status, log, config: controllers.systemdUnitCheck, firstAfter: firstReconcileFirst }),
    startRestartController({ kube, systemd, events, nodes: node, log, selfUnit: agentUnit, rollout }),
    startHostnameCheck({ log, restartSelf: () => stopFor("hostname changed") }),
    startSecretNameFollower({ node, files, configFile: file, secretName: controllers.operatingSystemConfig.secretName, log, restartSelf: stopFor }),
    ...(certificate ? [certificate] : []),
  ];
  const reloadLogLevel = () => reloadLevel(configDir, log);
  process.on("SIGHUP", reloadLogLevel);
  const snapshot = heapSnapshotOnSignal(process.env[heapSnapshotEnv], files, log);
  const reason = await stopRequested;
  process.off("SIGHUP", reloadLogLevel);
  if (snapshot) process.off("SIGUSR2", snapshot);
  notify.stopping();
  log.info("trellis stopping", { reason });
  // Controllers first (the OSC controller finishes the step it is in), then the servers and the bus.
  await Promise.all(running.map((c) => c.stop()));
  await servers.stop();
  await status.close();
  systemd.close();
  notify.close();
  lock.release();
  return 0;
}

/** SIGHUP (the unit's ExecReload): the configuration's log level, read again; a configuration that no longer reads keeps the old one. */
function reloadLevel(configDir: string, log: Logger): void {
  try {
    const { file, config } = loadAgentConfig(configDir);
    // Said before the change, at the level in force until then: a level raised to error would hide it.
    log.info("log level set from the configuration (SIGHUP)", { config: file, logLevel: config.logLevel });
    log.setLevel(config.logLevel);
  } catch (err) {
    log.error("SIGHUP: could not read the configuration again; the log level stays", { error: describeError(err) });
  }
}

/** Opt-in, for memory investigations (test/bench/profile.ts sets it): SIGUSR2 writes a heap snapshot to this file. */
const heapSnapshotEnv = "TRELLIS_HEAP_SNAPSHOT";
/** How long the node's health checks wait for the OSC's first reconcile at the most (it may not come: no API server). */
const firstReconcileHeadStartMs = 10_000;

/**
 * The SIGUSR2 handler installed, when `path` is set (without it SIGUSR2 ends the agent, as it always did).
 * Written as every node file is (atomically, no symlink followed): the path an operator names may lie in
 * a directory others can write to (/var/tmp).
 */
function heapSnapshotOnSignal(path: string | undefined, files: Files, log: Logger): (() => void) | undefined {
  if (!path) return undefined;
  const write = async () => {
    const started = monotonicMs();
    try {
      await files.writeAtomic(path, heapSnapshot(), 0o600);
      log.info("heap snapshot written", { path, durationMs: Math.round(monotonicMs() - started) });
    } catch (err) {
      log.warn("could not write a heap snapshot", { path, error: describeError(err) });
    }
  };
  process.on("SIGUSR2", write);
  return write;
}
