// `trellis bootstrap --config-dir DIR`: what gardener-node-init.service runs on a new machine (Gardener's
// init script execs `gardener-node-agent bootstrap --config-dir=…`). Each step looks at the machine
// first and does only what is missing, so a run interrupted anywhere converges when it runs again (the
// init unit has Restart=on-failure):
//
//   a. the agent's client certificate: unless credentials/kubeconfig holds a usable one, a CSR made with
//      the bootstrap token, and the kubeconfig written (0600) once it is issued; meanwhile the binary
//      install.sh installed is taken into the agent's image cache (src/cli/installed-binary.ts);
//   b. kubelet's bootstrap kubeconfig from the bootstrap token, while kubelet has no credentials yet;
//   c. the agent's unit written, enabled and started;
//   d. gardener-node-init.service disabled (not stopped: it is the unit running this command).
//
// The certificate comes BEFORE the agent starts, unlike gardener-node-agent, whose bootstrap only
// installs the unit and whose agent requests the certificate when it starts. That way the agent always
// runs as its own user gardener.cloud:node-agent:machine:<machine>, never as the bootstrap token, and a
// denied or failed CSR fails the init unit, where it is seen and retried, instead of an agent crash-looping.
// The bootstrap token stays: the agent deletes it after its first successful apply.
import { resolve } from "node:path";
import { parseArgs } from "node:util";
import { agentUnit, agentUnitContent, agentUnitMode, agentUnitPath, initUnit } from "../api/agent-unit.ts";
import { apiServerCa, type NodeAgentConfiguration } from "../api/agent-config.ts";
import { formatDuration, parseGoDuration } from "../api/duration.ts";
import { kubelet, paths } from "../api/paths.ts";
import { stateLockPath } from "../apply/state-store.ts";
import { agentHostName } from "../controllers/hostname.ts";
import { createFiles, type Files } from "../host/files.ts";
import { ensureKubeletDataVolume } from "../host/kubelet-data-volume.ts";
import { lockStateDir } from "../host/state-lock.ts";
import { createSystemd, type Systemd } from "../host/systemd.ts";
import { kubeFromConnection } from "../kube/client.ts";
import { CsrError, defaultWaitMs, machineName, pendingRequest, pendingRequestPath, requestClientCertificate } from "../kube/csr.ts";
import { kubeconfigProblem, readClientCertificate, renderKubeconfig, renderTokenKubeconfig } from "../kube/csr-kubeconfig.ts";
import { createLogger, type Logger } from "../log.ts";
import { loadAgentConfig } from "./agent-config.ts";
import { adoptInstalledBinary } from "./installed-binary.ts";
import { UsageError } from "./errors.ts";

const help = `usage: trellis bootstrap --config-dir DIR [--wait DURATION]

Turns a new machine into one the agent runs on, as gardener-node-init.service does:
  a. unless ${paths.kubeconfig} holds a valid client certificate,
     requests one with the bootstrap token (a CertificateSigningRequest someone must approve);
  b. writes kubelet's bootstrap kubeconfig while kubelet has no credentials;
  c. installs, enables and starts ${agentUnit};
  d. disables ${initUnit}.
Safe to run again: it does only what is missing.

  --wait DURATION   how long to wait for the CSR to be approved and issued (default ${formatDuration(defaultWaitMs)})`;

export async function run(args: string[]): Promise<number> {
  const { values } = parseArgs({
    args,
    options: { "config-dir": { type: "string" }, wait: { type: "string" }, help: { type: "boolean", default: false } },
  });
  if (values.help) {
    console.log(help);
    return 0;
  }
  if (!values["config-dir"]) throw new UsageError(`--config-dir is required\n\n${help}`);
  const waitMs = values.wait === undefined ? defaultWaitMs : parseGoDuration(values.wait);
  if (waitMs === undefined || waitMs <= 0) throw new UsageError(`--wait ${values.wait}: not a positive duration (e.g. 15m, 90s)`);
  const configDir = resolve(values["config-dir"]);
  const { file, config, ignored } = loadAgentConfig(configDir);
  const log = createLogger({ level: config.logLevel === "error" ? "error" : config.logLevel, format: config.logFormat }).with({ command: "bootstrap" });
  log.info("bootstrap starting", { config: file });
  for (const field of ignored) log.warn("configuration field not acted on", { config: file, field });
  const files = createFiles("/");
  // Steps a and b write the agent's credentials: not while an agent (or apply) runs. Released before c starts the agent.
  const lock = await lockStateDir(stateLockPath, "bootstrap");
  const systemd = createSystemd({ log });
  try {
    let renewed: boolean;
    try {
      // Before anything is written below /var/lib/kubelet: that directory moves onto the volume.
      const volumeSize = config.bootstrap?.kubeletDataVolumeSize;
      if (volumeSize) {
        await step("0. the kubelet data volume", async () => log.info(await ensureKubeletDataVolume({ size: volumeSize, tmpDir: paths.tempDir, log })));
      }
      // Meanwhile (the CSR waits for its approver) the binary install.sh installed is made known to the
      // agent's image cache and file hashes, under the same lock, finished even when step a fails (it
      // never throws): the agent starts after both.
      const adopting = adoptInstalledBinary({ configDir, files, log });
      try {
        renewed = await step("a. the agent's client certificate", () => ensureAgentCredentials({ config, files, log, waitMs, hostName: agentHostName() }));
      } finally {
        await adopting;
      }
      await step("b. kubelet's bootstrap kubeconfig", () => ensureKubeletBootstrapKubeconfig({ config, files, log }));
    } finally {
      lock.release();
    }
    await step(`c. ${agentUnit}`, () => installAgentUnit({ files, systemd, log, configDir, restart: renewed }));
    await step(`d. ${initUnit}`, () => disableInitUnit({ systemd, log }));
  } finally {
    systemd.close();
  }
  log.info("bootstrap finished");
  return 0;
}

/** Runs one step; its failure says which step it was. */
async function step<T>(name: string, fn: () => Promise<T>): Promise<T> {
  try {
    return await fn();
  } catch (err) {
    throw new Error(`bootstrap step ${name}`, { cause: err });
  }
}

async function readText(files: Files, path: string): Promise<string | undefined> {
  const content = await files.read(path);
  return content === undefined ? undefined : new TextDecoder().decode(content);
}

/** Step a; returns whether it wrote a new kubeconfig. */
export async function ensureAgentCredentials(o: {
  config: NodeAgentConfiguration;
  files: Files;
  log: Logger;
  waitMs: number;
  hostName: string;
  env?: Record<string, string | undefined>;
  /** Ends the wait for the CSR at once (the agent stopping): rejects with the signal's reason, the pending request kept. */
  signal?: AbortSignal;
}): Promise<boolean> {
  const { config, files, log } = o;
  // The agent uses such a kubeconfig as it is (src/kube/connection.ts): nothing to request for it.
  const explicit = (o.env ?? process.env).KUBECONFIG || config.clientConnection.kubeconfig;
  if (explicit) {
    log.info("the agent is given a kubeconfig; no client certificate is requested", { kubeconfig: explicit });
    return false;
  }
  const current = await readText(files, paths.kubeconfig);
  const problem = kubeconfigProblem(current, Date.now());
  if (problem === undefined) {
    log.info("the agent's kubeconfig is valid; no client certificate is requested", { kubeconfig: paths.kubeconfig });
    await removeSettledRequest(files, current, log);
    return false;
  }
  const server = config.apiServer.server;
  if (!server) throw new Error(`${paths.kubeconfig} is ${problem}, and apiServer.server, needed to request a client certificate, is not set`);
  if (!(await files.stat(paths.bootstrapToken))) {
    throw new Error(
      `${paths.kubeconfig} is ${problem}, and there is no bootstrap token ${paths.bootstrapToken} to request a client certificate with. ` +
        `An operator must either write a bootstrap token (<token-id>.<token-secret> of a bootstrap-token Secret in kube-system, allowed to create CSRs) to ${paths.bootstrapToken}, ` +
        `or replace ${paths.kubeconfig} with a kubeconfig holding a valid client certificate; then restart ${agentUnit}`,
    );
  }
  const ca = apiServerCa(config.apiServer, paths.clusterCa);
  const machine = await machineName(files, o.hostName);
  log.info("requesting a client certificate with the bootstrap token", { kubeconfig: paths.kubeconfig, because: problem, machineName: machine, server });
  const kube = kubeFromConnection({ kind: "token-file", server, ca, tokenFile: paths.bootstrapToken }, config.clientConnection);
  const request = await pendingRequest(files, machine, log);
  let certPem: string;
  try {
    certPem = await requestClientCertificate({ kube, request, log, waitMs: o.waitMs, ...(o.signal ? { signal: o.signal } : {}) });
  } catch (err) {
    // A CSR that timed out may still be approved: the next run waits for it again. Any other end is final.
    if (err instanceof CsrError && err.reason !== "timeout") await files.remove(pendingRequestPath);
    throw err;
  }
  const kubeconfig = renderKubeconfig({ server, ca, certPem, keyPem: request.keyPem });
  await files.writeAtomic(paths.kubeconfig, kubeconfig, 0o600);
  await files.remove(pendingRequestPath);
  const cert = readClientCertificate(kubeconfig);
  log.info("wrote the agent's kubeconfig", { kubeconfig: paths.kubeconfig, csr: request.name, user: cert?.commonName, notAfter: cert?.notAfter.toISOString() });
  return true;
}

/**
 * The pending request whose certificate the kubeconfig holds already (a run ended between writing the
 * kubeconfig and removing the request): removed, or the next renewal would resume it and get the same
 * certificate back.
 */
async function removeSettledRequest(files: Files, kubeconfig: string | undefined, log: Logger): Promise<void> {
  const pending = await readText(files, pendingRequestPath);
  if (pending === undefined || kubeconfig === undefined) return;
  const keyPem = (() => {
    try {
      return (JSON.parse(pending) as { keyPem?: unknown }).keyPem;
    } catch {
      return undefined;
    }
  })();
  if (typeof keyPem === "string" && readClientCertificate(kubeconfig)?.keyPem.trim() === keyPem.trim()) {
    await files.remove(pendingRequestPath);
    log.info("removed the certificate request the kubeconfig was issued for", { pending: pendingRequestPath });
  }
}

/**
 * Step b, gardener-node-agent's KubeletBootstrapKubeconfig: only while there is a bootstrap token and
 * kubelet has neither its real kubeconfig nor a client certificate (it would otherwise be sent back to
 * bootstrapping with a token that is about to be deleted).
 */
export async function ensureKubeletBootstrapKubeconfig(o: { config: NodeAgentConfiguration; files: Files; log: Logger }): Promise<void> {
  const { config, files, log } = o;
  const token = (await readText(files, paths.bootstrapToken))?.trim();
  if (!token) {
    log.info("no bootstrap token: kubelet's bootstrap kubeconfig is not written", { token: paths.bootstrapToken });
    return;
  }
  for (const existing of [kubelet.realKubeconfig, kubelet.clientCertificate]) {
    if (await files.stat(existing)) {
      log.info("kubelet has its credentials already: its bootstrap kubeconfig is not written", { found: existing });
      return;
    }
  }
  if (!config.apiServer.server) {
    // Not fatal: the agent matters more than kubelet's bootstrap, and its OSC can bring a complete configuration.
    log.warn("apiServer.server is not set: kubelet's bootstrap kubeconfig cannot be written", { path: kubelet.bootstrapKubeconfig });
    return;
  }
  const content = renderTokenKubeconfig({
    name: "kubelet-bootstrap",
    server: config.apiServer.server,
    ca: apiServerCa(config.apiServer, paths.clusterCa),
    token,
  });
  const mode = 0o600;
  if ((await readText(files, kubelet.bootstrapKubeconfig)) === content && (await files.stat(kubelet.bootstrapKubeconfig))?.mode === mode) {
    log.info("kubelet's bootstrap kubeconfig is up to date", { path: kubelet.bootstrapKubeconfig });
    return;
  }
  await files.writeAtomic(kubelet.bootstrapKubeconfig, content, mode);
  log.info("wrote kubelet's bootstrap kubeconfig", { path: kubelet.bootstrapKubeconfig });
}

/** Step c: the unit written if it differs, enabled, and started (restarted when step a just gave it new credentials). */
export async function installAgentUnit(o: { files: Files; systemd: Systemd; log: Logger; configDir: string; restart: boolean }): Promise<void> {
  const { files, systemd, log } = o;
  const content = agentUnitContent({ configDir: o.configDir });
  const same = (await readText(files, agentUnitPath)) === content && (await files.stat(agentUnitPath))?.mode === agentUnitMode;
  if (same) log.info("the agent's unit is up to date", { path: agentUnitPath });
  else {
    await files.writeAtomic(agentUnitPath, content, agentUnitMode);
    log.info("wrote the agent's unit", { path: agentUnitPath });
  }
  const changes = await systemd.enableUnits([agentUnit]);
  // Always: a run interrupted between writing the unit and reloading must still end with systemd knowing it.
  await systemd.daemonReload();
  log.info("enabled the agent's unit", { unit: agentUnit, symlinksCreated: changes.length });
  // An agent already running (started by someone in the moment since bootstrap let go of the lock) may
  // have the old kubeconfig: it must read the new one.
  const active = (await systemd.unitStatus(agentUnit)).activeState === "active";
  if (active && !o.restart) {
    log.info("the agent's unit is running", { unit: agentUnit });
    return;
  }
  // Queued, not waited for: the unit is Type=notify, and its start job ends only when the agent's
  // first reconcile did (an apply that may download images for minutes).
  await systemd.queueRestart(agentUnit);
  log.info(active ? "restarted the agent's unit (it had the old kubeconfig)" : "started the agent's unit", { unit: agentUnit });
}

/** Step d: disabled only — stopping it would stop this very command. A machine without it is fine. */
export async function disableInitUnit(o: { systemd: Systemd; log: Logger }): Promise<void> {
  const { systemd, log } = o;
  const status = await systemd.unitStatus(initUnit);
  if (status.loadState === "not-found") {
    log.info("there is no init unit to disable", { unit: initUnit });
    return;
  }
  const changes = await systemd.disableUnits([initUnit]);
  if (changes.length > 0) await systemd.daemonReload(); // as `systemctl disable` does
  log.info(changes.length > 0 ? "disabled the init unit" : "the init unit is not enabled", { unit: initUnit, symlinksRemoved: changes.length });
}
