// systemd's Manager API over the D-Bus system bus (dbus-next, low-level messages only: proxy objects
// cost an introspection round trip per object and can hang forever when the bus misbehaves).
//
// Every call has a deadline, and a lost connection fails its pending calls at once; the next call
// opens a new connection. systemd's private socket (/run/systemd/private) is not an option: it refuses
// clients from another PID namespace, and the bus works from everywhere.
import type { Duplex } from "node:stream";
import { DBusError, Message, MessageType, sessionBus, type MessageBus } from "dbus-next";
import type { Logger } from "../log.ts";

export const defaultBusAddress = "unix:path=/run/dbus/system_bus_socket";

export type UnitStatus = {
  name: string;
  loadState: string; // loaded, not-found, masked, ...
  activeState: string; // active, inactive, failed, activating, ...
  subState: string; // running, dead, exited, ...
  mainPID: number; // 0 when not running or not a service
  unitFileState: string; // enabled, disabled, static, "" for transient units, ...
  activeEnterTimestamp?: Date; // absent if the unit never became active
  stateChangeTimestamp?: Date; // when activeState last changed; absent if it never did
  /** The same moment in ms since boot (systemd's StateChangeTimestampMonotonic): how long a state lasts is measured by it, not by the wall clock. */
  stateChangeSinceBootMs?: number;
  triggeredBy: string[]; // timers, paths and sockets that start this unit
  serviceType?: string; // services only: simple, exec, forking, oneshot, notify, dbus, idle
  remainAfterExit?: boolean; // services only: active (exited) after the main process ended
  result?: string; // services only: success, exit-code, signal, timeout, start-limit-hit, ...
};

export type UnitState = Pick<UnitStatus, "loadState" | "activeState" | "subState" | "unitFileState">;

export type ListedUnit = { name: string; description: string; loadState: string; activeState: string; subState: string };

/** One symlink EnableUnitFiles/DisableUnitFiles created or removed. */
export type UnitFileChange = { type: string; file: string; destination: string };

export interface Systemd {
  readonly address: string;
  /** `systemctl daemon-reload`: resolves once systemd has re-read all unit files. */
  daemonReload(): Promise<void>;
  /** Creates the [Install] symlinks (not runtime, replacing conflicting symlinks). Needs a daemonReload() to take effect. */
  enableUnits(names: string[]): Promise<UnitFileChange[]>;
  disableUnits(names: string[]): Promise<UnitFileChange[]>;
  /** These queue a job (mode "replace") and resolve when it finished with result "done". */
  start(unit: string): Promise<void>;
  /** A restart refused by systemd's start limit is tried once more after resetting the limit (reset-failed). */
  restart(unit: string): Promise<void>;
  /**
   * Queues a restart and resolves once systemd accepted the job, without waiting for it to finish:
   * for the agent's own unit, whose restart job only completes after this process has exited.
   */
  queueRestart(unit: string): Promise<void>;
  stop(unit: string): Promise<void>;
  /** Loads the unit if needed: a unit without a unit file reports loadState "not-found". */
  unitStatus(unit: string): Promise<UnitStatus>;
  /**
   * The load, active and unit file states of `units` (loaded if needed, as unitStatus does), in one
   * ListUnitsByNames call and one small property read per unit: what an observation of the node needs,
   * without unitStatus's three calls and two full property sets per unit.
   */
  unitStates(units: readonly string[]): Promise<Map<string, UnitState>>;
  listUnits(): Promise<ListedUnit[]>;
  /**
   * Calls `listener` with a unit's name whenever systemd says its state changed (PropertiesChanged of
   * its Unit interface). Resolves once subscribed; the returned function unsubscribes. A new
   * connection subscribes again, so after a lost bus the next call (any) resumes the signals.
   */
  watchUnits(listener: (unit: string) => void): Promise<() => void>;
  /** Closes the connection; pending calls fail. A later call reconnects. */
  close(): void;
}

export type SystemdOptions = {
  address?: string;
  /** Limit for each D-Bus round trip, connecting included. */
  callTimeoutMs?: number;
  /** Limit for a start/restart/stop job to finish (oneshot units have no start timeout of their own). */
  jobTimeoutMs?: number;
  log?: Logger;
};

type ErrorKind = "connection" | "timeout" | "dbus" | "job";

export class SystemdError extends Error {
  override name = "SystemdError";
  constructor(
    /** What went wrong, without the method/unit/bus prefix of `message`. */
    readonly reason: string,
    readonly kind: ErrorKind,
    /** The D-Bus method (StartUnit, GetAll, ...). */
    readonly method: string,
    readonly address: string,
    readonly unit?: string,
    /** The D-Bus error name (kind "dbus") or the job result (kind "job"). */
    readonly detail?: string,
    options?: { cause?: unknown },
  ) {
    super(`${method}${unit ? ` ${unit}` : ""} (bus ${address}): ${reason}`, options);
  }
}

const SYSTEMD = "org.freedesktop.systemd1";
const MANAGER_PATH = "/org/freedesktop/systemd1";
const MANAGER = "org.freedesktop.systemd1.Manager";
const PROPERTIES = "org.freedesktop.DBus.Properties";
const UNIT = "org.freedesktop.systemd1.Unit";

const UNIT_PATH_PREFIX = "/org/freedesktop/systemd1/unit/";
const jobsMatch = `type='signal',sender='${SYSTEMD}',path='${MANAGER_PATH}',interface='${MANAGER}',member='JobRemoved'`;
const unitsMatch = `type='signal',sender='${SYSTEMD}',interface='${PROPERTIES}',member='PropertiesChanged',arg0='org.freedesktop.systemd1.Unit'`;

type JobListener = (job: string, result: string) => void;

/** A unit's name from its bus object path, where every byte but [A-Za-z0-9] is "_" and two hex digits. */
export function unitNameOfPath(path: string): string {
  const escaped = path.slice(UNIT_PATH_PREFIX.length);
  const bytes: number[] = [];
  for (let i = 0; i < escaped.length; i++) {
    const hex = escaped[i] === "_" ? escaped.slice(i + 1, i + 3) : "";
    if (/^[0-9a-f]{2}$/.test(hex)) {
      bytes.push(Number.parseInt(hex, 16));
      i += 2;
    } else bytes.push(escaped.charCodeAt(i));
  }
  return new TextDecoder().decode(new Uint8Array(bytes));
}

// One bus connection. Losing it (the socket errors or closes) fails every call waiting on it
// (unlessLost); the connection is then discarded and the next call opens a new one.
type Connection = {
  bus: MessageBus;
  /** Why the connection was lost, once it was. */
  lostError?: Error;
  /** The calls in flight: each is failed with the error when the connection is lost. */
  lostWaiters: Set<(err: Error) => void>;
  dead: boolean;
  helloDone: boolean;
  jobListeners: Set<JobListener>;
  subscribed?: Promise<void>;
  /** Match rules added on this connection (AddMatch), by rule. */
  matches: Map<string, Promise<void>>;
  /** Fails the calls in flight and closes the socket; `unexpected` is logged. */
  drop(err: Error, unexpected: boolean): void;
};

type Call = { member: string; unit?: string; dest?: string; path?: string; iface?: string; signature?: string; body?: unknown[] };

export function createSystemd(opts: SystemdOptions = {}): Systemd {
  const address = opts.address ?? defaultBusAddress;
  // dbus-next also knows tcp: and abstract sockets, but only unix:path= works in the compiled binary.
  if (!/^unix:path=\/[^,;=]*$/.test(address)) throw new RangeError(`unsupported D-Bus address "${address}" (want unix:path=/...)`);
  const callTimeoutMs = opts.callTimeoutMs ?? 10_000;
  const jobTimeoutMs = opts.jobTimeoutMs ?? 120_000;
  const log = opts.log;
  let current: Connection | undefined;
  const unitListeners = new Set<(unit: string) => void>();

  const fail = (kind: ErrorKind, c: Call, reason: string, detail?: string, cause?: unknown) =>
    new SystemdError(reason, kind, c.member, address, c.unit, detail, { cause });

  function connect(c: Call): Connection {
    if (current && !current.dead) return current;
    let bus: MessageBus;
    try {
      bus = sessionBus({ busAddress: address }); // "session" only means "not from $DBUS_SYSTEM_BUS_ADDRESS"
    } catch (err) {
      throw fail("connection", c, `cannot connect: ${errorText(err)}`, undefined, err);
    }
    // dbus-next does not report a closed socket on the bus object: watch the stream itself.
    const stream = (bus as unknown as { _connection: { stream: Duplex } })._connection.stream;
    const conn: Connection = {
      bus,
      lostWaiters: new Set(),
      dead: false,
      helloDone: false,
      jobListeners: new Set(),
      matches: new Map(),
      drop: (err, unexpected) => {
        if (conn.dead) return;
        conn.dead = true;
        conn.lostError = err;
        for (const failCall of conn.lostWaiters) failCall(err);
        conn.lostWaiters.clear();
        stream.destroy();
        if (unexpected && conn.helloDone) log?.warn("D-Bus connection lost", { address, error: err });
      },
    };
    // Attached before the first tick: without an error listener a missing socket kills the process.
    bus.on("error", (err: unknown) => conn.drop(err instanceof Error ? err : new Error(String(err)), true));
    stream.on("close", () => conn.drop(new Error("connection closed by the bus"), true));
    bus.on("connect", () => {
      conn.helloDone = true;
      log?.info("connected to D-Bus", { address, name: (bus as unknown as { name: string }).name });
    });
    bus.on("message", (msg: Message) => {
      if (msg.type !== MessageType.SIGNAL) return;
      if (msg.interface === MANAGER && msg.member === "JobRemoved") {
        const [, job, , result] = msg.body as [number, string, string, string];
        for (const listener of conn.jobListeners) listener(job, result);
      } else if (msg.interface === PROPERTIES && msg.member === "PropertiesChanged" && msg.path?.startsWith(UNIT_PATH_PREFIX)) {
        const unit = unitNameOfPath(msg.path);
        for (const listener of unitListeners) listener(unit);
      }
    });
    current = conn;
    if (unitListeners.size > 0) {
      subscribe(conn, unitsMatch).catch((err: unknown) => log?.warn("could not subscribe to systemd's unit signals", { address, error: err }));
    }
    return conn;
  }

  async function call(c: Call, conn = connect(c)): Promise<unknown[]> {
    const msg = new Message({
      destination: c.dest ?? SYSTEMD,
      path: c.path ?? MANAGER_PATH,
      interface: c.iface ?? MANAGER,
      member: c.member,
      signature: c.signature ?? "",
      body: c.body ?? [],
    });
    const timeout = deadline(callTimeoutMs);
    try {
      const reply = await Promise.race([unlessLost(conn, conn.bus.call(msg)), timeout.expired]);
      return reply?.body ?? [];
    } catch (err) {
      if (err === timeout.error) {
        // A bus that does not answer in time is not trusted with the next call either.
        const what = conn.helloDone ? "no reply" : "no D-Bus handshake (is anything serving this socket?)";
        conn.drop(new Error(`${c.member} timed out`), true);
        throw fail("timeout", c, `timed out after ${callTimeoutMs} ms: ${what}`);
      }
      if (err instanceof DBusError) throw fail("dbus", c, `${err.text} (${err.type})`, err.type, err);
      throw fail("connection", c, errorText(err), undefined, err);
    } finally {
      timeout.cancel();
    }
  }

  // systemd emits its signals only to clients that called Subscribe (once per connection), and the
  // bus daemon only routes them to clients with a matching rule (once per rule and connection).
  function subscribe(conn: Connection, match: string): Promise<void> {
    const bus = { dest: "org.freedesktop.DBus", path: "/org/freedesktop/DBus", iface: "org.freedesktop.DBus" };
    const added =
      conn.matches.get(match) ??
      call({ member: "AddMatch", ...bus, signature: "s", body: [match] }, conn).then(
        () => undefined,
        (err: unknown) => {
          conn.matches.delete(match); // let the next caller try again
          throw err;
        },
      );
    conn.matches.set(match, added);
    conn.subscribed ??= call({ member: "Subscribe" }, conn).then(
      () => undefined,
      (err: unknown) => {
        conn.subscribed = undefined;
        throw err;
      },
    );
    return Promise.all([added, conn.subscribed]).then(() => undefined);
  }

  async function job(member: "StartUnit" | "RestartUnit" | "StopUnit", unit: string): Promise<void> {
    const c: Call = { member, unit, signature: "ss", body: [unit, "replace"] };
    const conn = connect(c);
    await subscribe(conn, jobsMatch).catch((err: SystemdError) => {
      throw fail(err.kind, c, `${err.method}: ${err.reason}`, err.detail, err);
    });
    // JobRemoved may arrive before we know the job's path: remember results until then.
    const early = new Map<string, string>();
    let jobPath: string | undefined;
    let finished!: (result: string) => void;
    const done = new Promise<string>((resolve) => (finished = resolve));
    const listener: JobListener = (path, result) => {
      if (jobPath === undefined) early.set(path, result);
      else if (path === jobPath) finished(result);
    };
    conn.jobListeners.add(listener);
    const timeout = deadline(jobTimeoutMs);
    try {
      const [path] = (await call(c, conn)) as [string];
      jobPath = path;
      const result = early.get(path) ?? (await Promise.race([unlessLost(conn, done), timeout.expired]));
      if (result !== "done") throw fail("job", c, `job finished with result "${result}"`, result);
    } catch (err) {
      if (err === timeout.error) throw fail("timeout", c, `job ${jobPath} did not finish within ${jobTimeoutMs} ms`);
      if (err instanceof SystemdError) throw err;
      throw fail("connection", c, `waiting for job ${jobPath}: ${errorText(err)}`, undefined, err);
    } finally {
      timeout.cancel();
      conn.jobListeners.delete(listener);
    }
  }

  async function unitStatus(unit: string): Promise<UnitStatus> {
    const [path] = (await call({ member: "LoadUnit", unit, signature: "s", body: [unit] })) as [string];
    const get = (iface: string) =>
      call({ member: "GetAll", unit, path, iface: PROPERTIES, signature: "s", body: [iface] }).then(
        ([props]) => props as Record<string, { value: unknown }>,
      );
    const [u, service] = await Promise.all([
      get(UNIT),
      unit.endsWith(".service") ? get("org.freedesktop.systemd1.Service") : undefined,
    ]);
    const str = (key: string) => String(u[key]?.value ?? "");
    // Realtime timestamps in µs since the epoch; 0 means "never".
    const time = (key: string) => {
      const us = BigInt((u[key]?.value as bigint | undefined) ?? 0n);
      return us > 0n ? new Date(Number(us / 1000n)) : undefined;
    };
    const entered = time("ActiveEnterTimestamp");
    const changed = time("StateChangeTimestamp");
    const changedSinceBootUs = BigInt((u.StateChangeTimestampMonotonic?.value as bigint | undefined) ?? 0n);
    return {
      name: str("Id"),
      loadState: str("LoadState"),
      activeState: str("ActiveState"),
      subState: str("SubState"),
      mainPID: Number(service?.MainPID?.value ?? 0),
      unitFileState: str("UnitFileState"),
      ...(entered ? { activeEnterTimestamp: entered } : {}),
      ...(changed ? { stateChangeTimestamp: changed } : {}),
      ...(changedSinceBootUs > 0n ? { stateChangeSinceBootMs: Number(changedSinceBootUs / 1000n) } : {}),
      triggeredBy: (u.TriggeredBy?.value as string[] | undefined) ?? [],
      ...(service
        ? { serviceType: String(service.Type?.value ?? ""), remainAfterExit: service.RemainAfterExit?.value === true, result: String(service.Result?.value ?? "") }
        : {}),
    };
  }

  async function unitStates(units: readonly string[]): Promise<Map<string, UnitState>> {
    const states = new Map<string, UnitState>();
    if (units.length === 0) return states;
    const [rows] = (await call({ member: "ListUnitsByNames", unit: units.join(" "), signature: "as", body: [[...units]] })) as [string[][]];
    if (rows.length !== units.length) throw fail("dbus", { member: "ListUnitsByNames", unit: units.join(" ") }, `${rows.length} units in the reply for ${units.length} names`);
    // One row per name, in the order asked (an alias's row names the unit it is an alias of).
    await Promise.all(
      units.map(async (unit, i) => {
        const [, , loadState = "", activeState = "", subState = "", , path = ""] = rows[i] as string[];
        const [fileState] = (await call({ member: "Get", unit, path, iface: PROPERTIES, signature: "ss", body: [UNIT, "UnitFileState"] })) as [{ value: unknown }];
        states.set(unit, { loadState, activeState, subState, unitFileState: String(fileState?.value ?? "") });
      }),
    );
    return states;
  }

  const changes = (list: unknown): UnitFileChange[] =>
    (list as [string, string, string][]).map(([type, file, destination]) => ({ type, file, destination }));

  return {
    address,
    daemonReload: async () => {
      await call({ member: "Reload" });
    },
    enableUnits: async (names) => {
      const [, list] = await call({ member: "EnableUnitFiles", unit: names.join(" "), signature: "asbb", body: [names, false, true] });
      return changes(list);
    },
    disableUnits: async (names) => {
      const [list] = await call({ member: "DisableUnitFiles", unit: names.join(" "), signature: "asb", body: [names, false] });
      return changes(list);
    },
    start: (unit) => job("StartUnit", unit),
    restart: async (unit) => {
      try {
        await job("RestartUnit", unit);
      } catch (err) {
        // A unit restarted more than StartLimitBurst times within StartLimitIntervalSec (5 in 10 s by default)
        // refuses the next start ("start-limit-hit") and stays down until the interval passed. Restarts that
        // follow configuration changes (a few OSCs in a row) are no crash loop, and gardener-node-agent never
        // meets the limit: the daemon-reload it runs at every reconcile resets it. Reset it, as `systemctl
        // reset-failed` does, and restart once more (found side by side with gardener-node-agent).
        if (!(err instanceof SystemdError && err.kind === "job") || (await unitStatus(unit)).result !== "start-limit-hit") throw err;
        await call({ member: "ResetFailedUnit", unit, signature: "s", body: [unit] });
        await job("RestartUnit", unit);
      }
    },
    queueRestart: async (unit) => {
      await call({ member: "RestartUnit", unit, signature: "ss", body: [unit, "replace"] });
    },
    stop: (unit) => job("StopUnit", unit),
    watchUnits: async (listener) => {
      unitListeners.add(listener);
      const c: Call = { member: "AddMatch", unit: "(unit signals)" };
      await subscribe(connect(c), unitsMatch).catch((err: unknown) => {
        unitListeners.delete(listener);
        throw err;
      });
      return () => void unitListeners.delete(listener);
    },
    unitStatus,
    unitStates,
    listUnits: async () => {
      const [list] = await call({ member: "ListUnits" });
      return (list as string[][]).map(([name = "", description = "", loadState = "", activeState = "", subState = ""]) => ({
        name,
        description,
        loadState,
        activeState,
        subState,
      }));
    },
    close: () => {
      current?.drop(new Error("connection closed by the client"), false);
      current = undefined;
    },
  };
}

// A timer to race against; `error` identifies its rejection. cancel() so it does not hold the process open.
/**
 * `p`, unless the connection is lost first. Not a Promise.race with a promise that stays pending for
 * the connection's life: every such race leaves a reaction on it that keeps the call's result
 * reachable — every D-Bus reply of the agent's life was kept that way (+3.4 MiB of heap per apply of
 * a 500-file OSC, test/bench/trace.ts's steady state).
 */
function unlessLost<T>(conn: Connection, p: Promise<T>): Promise<T> {
  return new Promise<T>((resolve, reject) => {
    if (conn.lostError) return reject(conn.lostError);
    conn.lostWaiters.add(reject);
    p.then(resolve, reject).finally(() => conn.lostWaiters.delete(reject));
  });
}

function deadline(ms: number): { expired: Promise<never>; error: Error; cancel(): void } {
  const error = new Error(`deadline of ${ms} ms`);
  let timer: ReturnType<typeof setTimeout> | undefined;
  const expired = new Promise<never>((_, reject) => (timer = setTimeout(() => reject(error), ms)));
  expired.catch(() => {});
  return { expired, error, cancel: () => clearTimeout(timer) };
}

function errorText(err: unknown): string {
  return err instanceof Error ? err.message : String(err);
}
