// `trellis systemd ...`: drives the node's systemd through the same D-Bus client the agent uses, to
// diagnose bus access on a node (the e2e tests also run it inside a test node).
import { parseArgs } from "node:util";
import { createSystemd, defaultBusAddress, type Systemd, type UnitFileChange } from "../host/systemd.ts";
import { UsageError } from "./errors.ts";

const usage = `usage: trellis systemd <action> [unit...] [--bus ADDRESS] [--timeout SECONDS] [--json]

actions:
  daemon-reload               re-read all unit files
  enable UNIT...              create the units' [Install] symlinks (daemon-reload afterwards)
  disable UNIT...             remove them
  start|restart|stop UNIT...  queue the job and wait until it has finished
  status UNIT...              print ActiveState, SubState, MainPID, LoadState, UnitFileState

flags:
  --bus ADDRESS      the system bus (default ${defaultBusAddress})
  --timeout SECONDS  limit for each D-Bus call and each job (default 10 s per call, 120 s per job)
  --json             one JSON object per line`;

type Print = (text: string, json: object) => void;
type Action = { units: boolean; run(sd: Systemd, units: string[], print: Print): Promise<void> };

const printChanges = (print: Print, changes: UnitFileChange[]) => {
  for (const c of changes) {
    const text = c.type === "symlink" ? `Created symlink ${c.file} → ${c.destination}.` : c.type === "unlink" ? `Removed ${c.file}.` : `${c.type} ${c.file}`;
    print(text, c);
  }
};

const actions: Record<string, Action> = {
  "daemon-reload": { units: false, run: (sd) => sd.daemonReload() },
  enable: { units: true, run: async (sd, units, print) => printChanges(print, await sd.enableUnits(units)) },
  disable: { units: true, run: async (sd, units, print) => printChanges(print, await sd.disableUnits(units)) },
  start: { units: true, run: (sd, units) => each(units, sd.start) },
  restart: { units: true, run: (sd, units) => each(units, sd.restart) },
  stop: { units: true, run: (sd, units) => each(units, sd.stop) },
  status: {
    units: true,
    run: (sd, units, print) =>
      each(units, async (unit) => {
        const s = await sd.unitStatus(unit);
        print(
          `${s.name} ActiveState=${s.activeState} SubState=${s.subState} MainPID=${s.mainPID} ` +
            `LoadState=${s.loadState} UnitFileState=${s.unitFileState || "-"}`,
          s,
        );
      }),
  },
};

// One after the other, like systemctl: the first failure stops the command.
async function each(units: string[], fn: (unit: string) => Promise<void>): Promise<void> {
  for (const unit of units) await fn(unit);
}

export async function run(args: string[]): Promise<number> {
  let parsed;
  try {
    parsed = parseArgs({
      args,
      allowPositionals: true,
      options: {
        bus: { type: "string", default: defaultBusAddress },
        timeout: { type: "string" },
        json: { type: "boolean", default: false },
        help: { type: "boolean", short: "h", default: false },
      },
    });
  } catch (err) {
    throw new UsageError(`${err instanceof Error ? err.message : String(err)}\n\n${usage}`);
  }
  const { values, positionals } = parsed;
  if (values.help) {
    console.log(usage);
    return 0;
  }
  const [name, ...units] = positionals;
  if (name === undefined) throw new UsageError(`no action given\n\n${usage}`);
  const action = actions[name];
  if (!action) throw new UsageError(`unknown action "${name}"\n\n${usage}`);
  if (action.units && units.length === 0) throw new UsageError(`${name} needs at least one unit`);
  if (!action.units && units.length > 0) throw new UsageError(`${name} takes no units`);

  let timeoutMs: number | undefined;
  if (values.timeout !== undefined) {
    const seconds = Number(values.timeout);
    if (!Number.isFinite(seconds) || seconds <= 0) throw new UsageError(`--timeout wants a positive number of seconds, not "${values.timeout}"`);
    timeoutMs = Math.round(seconds * 1000);
  }

  let sd: Systemd;
  try {
    sd = createSystemd({ address: values.bus, callTimeoutMs: timeoutMs, jobTimeoutMs: timeoutMs });
  } catch (err) {
    if (err instanceof RangeError) throw new UsageError(`--bus: ${err.message}`);
    throw err;
  }
  const print: Print = (text, json) => console.log(values.json ? JSON.stringify(json) : text);
  try {
    await action.run(sd, units, print);
  } finally {
    sd.close(); // the open socket would keep the process alive
  }
  return 0;
}
