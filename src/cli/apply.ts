import { parseArgs } from "node:util";
import { agentUnit, paths } from "../api/paths.ts";
import { applyDesired } from "../apply/apply.ts";
import { createStateStore, stateLockPath } from "../apply/state-store.ts";
import { createFiles } from "../host/files.ts";
import { withKnownHashes } from "../host/known-hashes.ts";
import { lockStateDir } from "../host/state-lock.ts";
import { createSystemd } from "../host/systemd.ts";
import { createLogger } from "../log.ts";
import { describeStep } from "../plan/render.ts";
import { UsageError } from "./errors.ts";
import { readOscFile } from "./osc-file.ts";

const help = `usage: trellis apply --osc FILE [--hostname NAME]

Applies the OperatingSystemConfig in FILE (the OSC YAML, or its Secret as kubectl prints it) to
this machine with the same engine as the agent: for the first boot before the cluster is
reachable, or for machines without a cluster. Changes only what differs; an interrupted apply is
resumed by the next one. Exit code 0: applied; 1: failed (the output names what).`;

export async function run(args: string[]): Promise<number> {
  const { values } = parseArgs({
    args,
    options: { osc: { type: "string" }, hostname: { type: "string" }, help: { type: "boolean", default: false } },
  });
  if (values.help) {
    console.log(help);
    return 0;
  }
  if (!values.osc) throw new UsageError(`--osc is required\n\n${help}`);
  const log = createLogger();
  // Before anything is read or cached: the agent, or another apply, may be changing the node.
  const lock = await lockStateDir(stateLockPath, "apply");
  const files = await withKnownHashes(createFiles("/"), { path: paths.knownHashes, log });
  const systemd = createSystemd({ log });
  try {
    const input = await readOscFile(values.osc, files, log, { ...(values.hostname ? { host: values.hostname } : {}), imageCache: "node" });
    const outcome = await applyDesired(input.desired, input.checksum, input.bytes, { files, systemd, store: createStateStore(files), log, selfUnit: agentUnit });
    for (const step of outcome.executed) console.log(describeStep(step));
    for (const u of input.desired.unsupported) console.log(`note: ${u}`);
    for (const f of outcome.failures) console.error(`failed: ${describeStep(f.step)}: ${f.error}`);
    if (outcome.complete) console.log(`applied OSC ${input.checksum.slice(0, 12)}: ${outcome.executed.length} step(s)${outcome.resumed ? " (resumed an interrupted apply)" : ""}`);
    return outcome.complete ? 0 : 1;
  } finally {
    systemd.close();
    lock.release();
  }
}
