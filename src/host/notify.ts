// sd_notify(3) for the agent's Type=notify unit: READY=1 once the first reconcile finished, WATCHDOG=1
// from a timer on the event loop (a hung loop sends none, and systemd's WatchdogSec= kills and restarts
// the agent), STOPPING=1 when it stops. Outside systemd (no NOTIFY_SOCKET) it does nothing.
import { setInterval } from "node:timers";
import type { Logger } from "../log.ts";
import { sendUnixDatagram } from "../runtime.ts";

export type Notifier = {
  ready(status: string): void;
  stopping(): void;
  /** Stops the watchdog timer. */
  close(): void;
};

export function startSystemdNotify(o: { log: Logger; env?: Record<string, string | undefined> }): Notifier {
  const env = o.env ?? process.env;
  const socket = env.NOTIFY_SOCKET;
  const log = o.log.with({ component: "sd_notify" });
  let failed = false;
  const send = (message: string) => {
    if (!socket) return;
    sendUnixDatagram(socket, message).then(
      () => (failed = false),
      (err: unknown) => {
        // Once per run of failures: a watchdog ping every few seconds must not flood the journal.
        if (!failed) log.warn("could not notify systemd", { socket, message: message.split("\n")[0], error: String(err) });
        failed = true;
      },
    );
  };
  const timer = watchdogTimer(env, () => send("WATCHDOG=1"));
  return {
    ready: (status) => send(`READY=1\nSTATUS=${status}`),
    stopping: () => send("STOPPING=1"),
    close: () => clearInterval(timer),
  };
}

/** Pings at half of WatchdogSec= (sd_watchdog_enabled(3)), if the watchdog is meant for this process. */
function watchdogTimer(env: Record<string, string | undefined>, ping: () => void): ReturnType<typeof setInterval> | undefined {
  const usec = Number(env.WATCHDOG_USEC);
  if (!env.NOTIFY_SOCKET || !Number.isInteger(usec) || usec <= 0) return undefined;
  if (env.WATCHDOG_PID && Number(env.WATCHDOG_PID) !== process.pid) return undefined;
  ping();
  // Unref'd: the pings must not keep alive an agent whose start failed (it would hang, fed, forever).
  return setInterval(ping, Math.max(1, Math.floor(usec / 2000))).unref();
}
