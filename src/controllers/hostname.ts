// The hostname as the agent uses it, and a restart when it changes, as gardener-node-agent does: the
// agent found its Node and filters the OSC's files by the hostname it started with, and a changed name
// is easiest to get right by starting over. Checked every 30 s; restartSelf() (a clean shutdown and
// exit, after which systemd's Restart=always starts the agent again) is called once. Both compare the
// lower-cased name, so a change of case alone is no change.
import { hostname as osHostname } from "node:os";
import { later } from "../loops.ts";
import { describeError, type Logger } from "../log.ts";
import type { Controller } from "./types.ts";

/**
 * The hostname as gardener-node-agent uses it (nodeagent.GetHostName): lower-cased, as kubelet's
 * `kubernetes.io/hostname` label is. A file's `hostName` is compared with it as the OSC spells it, so a
 * file for "Node-A" is written on no host, as with gardener-node-agent.
 */
export const agentHostName = (name: string = osHostname()): string => name.toLowerCase();

export type HostnameCheckDeps = {
  restartSelf: () => void;
  log: Logger;
  hostname?: () => string;
  intervalMs?: number;
};

export function startHostnameCheck(deps: HostnameCheckDeps): Controller {
  const log = deps.log.with({ controller: "hostname" });
  const hostname = () => agentHostName((deps.hostname ?? osHostname)());
  const initial = hostname();
  const next = later(() => {
    let current: string;
    try {
      current = hostname();
    } catch (err) {
      log.warn("could not read the hostname", { error: describeError(err) });
      return next.in(intervalMs);
    }
    if (current === initial) return next.in(intervalMs);
    log.info("the hostname changed; restarting the agent to pick it up", { from: initial, to: current });
    deps.restartSelf();
  });
  const intervalMs = deps.intervalMs ?? 30_000;
  next.in(intervalMs);
  return {
    stop: async () => next.cancel(),
  };
}
