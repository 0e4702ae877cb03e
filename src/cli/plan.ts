import { parseArgs } from "node:util";
import { agentUnit } from "../api/paths.ts";
import { planForNode } from "../apply/observe.ts";
import { createStateStore } from "../apply/state-store.ts";
import { createFiles } from "../host/files.ts";
import { createSystemd, SystemdError } from "../host/systemd.ts";
import { createLogger } from "../log.ts";
import { renderPlan } from "../plan/render.ts";
import { UsageError } from "./errors.ts";
import { readOscFile } from "./osc-file.ts";

const help = `usage: trellis plan --osc FILE [--root DIR] [--hostname NAME] [--labels k=v,…] [--json]

Prints what applying the OperatingSystemConfig in FILE (the OSC YAML, or its Secret as
kubectl prints it) would change on this machine, and why, without changing anything.
--root DIR plans for a machine image mounted at DIR (systemd is not consulted then).
--labels: the Node's labels, which pick the Secret's overlays (overlay-*.yaml); the plan then
says, for every unit and file, which layer it came from.
Exit code 0: nothing to do; 3: there are changes; 1: the OSC or the machine could not be read.`;

export async function run(args: string[]): Promise<number> {
  const { values } = parseArgs({
    args,
    options: {
      osc: { type: "string" },
      root: { type: "string", default: "/" },
      hostname: { type: "string" },
      labels: { type: "string", default: "" },
      json: { type: "boolean", default: false },
      help: { type: "boolean", default: false },
    },
  });
  if (values.help) {
    console.log(help);
    return 0;
  }
  if (!values.osc) throw new UsageError(`--osc is required\n\n${help}`);
  const files = createFiles(values.root);
  const input = await readOscFile(values.osc, files, createLogger({ level: "error" }), { ...(values.hostname ? { host: values.hostname } : {}), labels: parseLabels(values.labels), imageCache: "throwaway" });
  const state = await createStateStore(files).read();
  const systemd = values.root === "/" ? createSystemd({ callTimeoutMs: 5_000 }) : undefined;
  try {
    const planWith = (sd: typeof systemd) =>
      planForNode({ desired: input.desired, checksum: input.checksum, owned: state.owned, files, systemd: sd, selfUnit: agentUnit });
    const { plan } = await planWith(systemd).catch((err: unknown) => {
      if (!(err instanceof SystemdError) || (err.kind !== "connection" && err.kind !== "timeout")) throw err;
      console.error(`note: systemd is not reachable (${err.message}); planning from the files alone`);
      return planWith(undefined);
    });
    if (values.json) console.log(JSON.stringify({ ...plan, unsupported: input.desired.unsupported, ...(input.layers ? { layers: input.layers } : {}) }, null, 2));
    else {
      console.log(renderPlan(plan));
      for (const u of input.desired.unsupported) console.log(`note: ${u}`);
      if (input.layers) {
        console.log("layers:");
        for (const [entry, layer] of Object.entries(input.layers)) console.log(`  ${entry}: ${layer}`);
      }
    }
    return plan.steps.length === 0 ? 0 : 3;
  } finally {
    systemd?.close();
  }
}

/** "a=b,c=d" → labels; a key without "=" has the empty value. */
function parseLabels(text: string): Record<string, string> {
  const labels: Record<string, string> = {};
  for (const pair of text.split(",").map((p) => p.trim()).filter(Boolean)) {
    const at = pair.indexOf("=");
    if (at === 0) throw new UsageError(`--labels: "${pair}" has no key`);
    labels[at < 0 ? pair : pair.slice(0, at)] = at < 0 ? "" : pair.slice(at + 1);
  }
  return labels;
}
