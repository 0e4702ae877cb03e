// Restart on a hostname change, as gardener-node-agent does: the agent found its Node and filters the
// OSC's files by the hostname it started with, and a changed name is easiest to get right by starting
// over. Checked every 30 s; restartSelf() (a clean shutdown and exit, after which systemd's
// Restart=always starts the agent again) is called once.
import { hostname as osHostname } from "node:os";
import { later } from "../loops.ts";
import { describeError, type Logger } from "../log.ts";
import type { Controller } from "./types.ts";

export type HostnameCheckDeps = {
  restartSelf: () => void;
  log: Logger;
  hostname?: () => string;
  intervalMs?: number;
};

export function startHostnameCheck(deps: HostnameCheckDeps): Controller {
  const log = deps.log.with({ controller: "hostname" });
  const hostname = deps.hostname ?? osHostname;
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
