import { parseArgs } from "node:util";
import { kubeFromConnection } from "../kube/client.ts";
import { whoami } from "../kube/whoami.ts";
import { createLogger } from "../log.ts";
import { connectionFromFlags, connectionOptions } from "./connection-flags.ts";

const help = `usage: trellis whoami [--config-dir DIR | --kubeconfig FILE | --server URL --ca-file FILE --token-file FILE] [--json]

Connects to the API server the way the agent would and prints the server's version and the
user and groups the server authenticated trellis as.`;

export async function run(args: string[]): Promise<number> {
  const { values } = parseArgs({
    args,
    options: {
      ...connectionOptions,
      json: { type: "boolean", default: false },
      help: { type: "boolean", default: false },
    },
  });
  if (values.help) {
    console.log(help);
    return 0;
  }
  const kube = kubeFromConnection(connectionFromFlags(values, help));
  if (kube.insecure) createLogger().warn("TLS verification is disabled by the kubeconfig (insecure-skip-tls-verify)", { server: kube.server });
  const me = await whoami(kube);
  if (values.json) console.log(JSON.stringify(me));
  else console.log(`server ${me.server} (${me.serverVersion})\nuser ${me.username}\ngroups ${me.groups.join(", ")}`);
  return 0;
}
