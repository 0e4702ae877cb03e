// `trellis check-config --config-dir DIR`: can this binary read the configuration it would run with?
// An agent replacing its own binary runs the new one with this before installing it (src/apply/self-update.ts).
import { parseArgs } from "node:util";
import { loadAgentConfig } from "./agent-config.ts";
import { UsageError } from "./errors.ts";

const help = `usage: trellis check-config --config-dir DIR

Finds and validates the NodeAgentConfiguration this version of trellis would use in DIR, prints
the file it chose (and each key or value in it that is not acted on), and exits 0; exits 1 naming the file
and field when it cannot be used.`;

export async function run(args: string[]): Promise<number> {
  const { values } = parseArgs({ args, options: { "config-dir": { type: "string" }, help: { type: "boolean", default: false } } });
  if (values.help) {
    console.log(help);
    return 0;
  }
  if (!values["config-dir"]) throw new UsageError(`--config-dir is required\n\n${help}`);
  const { file, ignored } = loadAgentConfig(values["config-dir"]);
  console.log(`configuration ${file} is valid`);
  for (const field of ignored) console.log(`note: ${field}`);
  return 0;
}
