import { runtimeName } from "../runtime.ts";
import { bakedRuntimeEnv } from "../runtime-env.ts";
import { commit, version } from "../version.ts";

export async function run(args: string[]): Promise<number> {
  if (args.includes("--json")) console.log(JSON.stringify({ version, commit, runtime: runtimeName(), execArgv: process.execArgv, runtimeEnv: bakedRuntimeEnv() }));
  else console.log(`trellis ${version} (commit ${commit}, ${runtimeName()})`);
  return 0;
}
