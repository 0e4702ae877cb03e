// The agent's own systemd unit, gardener-node-agent.service, as `trellis bootstrap` installs it. It is
// gardener-node-agent's unit (pkg/component/extensions/operatingsystemconfig/original/components/
// nodeagent UnitContent) with trellis's description: Gardener's OSC carries that unit too, and the
// agent restarting itself (a hostname change) relies on Restart=always. Beyond Gardener's: Type=notify
// (ready once the first reconcile finished, however long its downloads take: no start timeout), a
// watchdog the agent's event loop feeds (src/host/notify.ts), and reload as SIGHUP (log level).
import { agentUnit, baseDir, paths } from "./paths.ts";

export { agentUnit };
/** The unit that runs `gardener-node-agent bootstrap` on a new machine; bootstrap disables it. */
export const initUnit = "gardener-node-init.service";
/** Where bootstrap writes the agent's unit; 0644, as gardener-node-agent's bootstrap writes it. */
export const agentUnitPath = `/etc/systemd/system/${agentUnit}`;
export const agentUnitMode = 0o644;
export const agentBinary = `${paths.binaryDir}/gardener-node-agent`;

/** How long the agent's event loop may stand still before systemd kills and restarts it. */
export const agentWatchdogSec = 60;

export function agentUnitContent(opts: { configDir?: string; restartSec?: number } = {}): string {
  const configDir = opts.configDir ?? baseDir;
  // Written into ExecStart unquoted: systemd would split at a space and expand % and $.
  if (!/^\/[A-Za-z0-9._/@+-]*$/.test(configDir)) throw new Error(`config dir ${JSON.stringify(configDir)}: must be an absolute path of letters, digits and ._/@+- for the agent's unit`);
  return `[Unit]
Description=trellis node agent (gardener-node-agent compatible)
After=network-online.target

[Service]
Type=notify
NotifyAccess=main
TimeoutStartSec=infinity
WatchdogSec=${agentWatchdogSec}s
LimitMEMLOCK=infinity
ExecStart=${agentBinary} --config-dir=${configDir}
ExecReload=/bin/kill -HUP $MAINPID
Restart=always
RestartSec=${opts.restartSec ?? 5}
StandardOutput=journal+console
StandardError=journal

[Install]
WantedBy=multi-user.target
`;
}
