import { existsSync } from "node:fs";
import { parseArgs } from "node:util";
import { kubeFromConnection } from "../kube/client.ts";
import { type Connection, connectionFor } from "../kube/connection.ts";
import { whoami } from "../kube/whoami.ts";
import { createLogger } from "../log.ts";
import { loadAgentConfig } from "./agent-config.ts";
import { UsageError } from "./errors.ts";

const help = `usage: trellis whoami [--config-dir DIR | --kubeconfig FILE | --server URL --ca-file FILE --token-file FILE] [--json]

Connects to the API server the way the agent would and prints the server's version and the
user and groups the server authenticated trellis as.`;

export async function run(args: string[]): Promise<number> {
  const { values } = parseArgs({
    args,
    options: {
      "config-dir": { type: "string" },
      kubeconfig: { type: "string" },
      server: { type: "string" },
      "ca-file": { type: "string" },
      "token-file": { type: "string" },
      json: { type: "boolean", default: false },
      help: { type: "boolean", default: false },
    },
  });
  if (values.help) {
    console.log(help);
    return 0;
  }
  const kube = kubeFromConnection(connectionFromFlags(values));
  if (kube.insecure) createLogger().warn("TLS verification is disabled by the kubeconfig (insecure-skip-tls-verify)", { server: kube.server });
  const me = await whoami(kube);
  if (values.json) console.log(JSON.stringify(me));
  else console.log(`server ${me.server} (${me.serverVersion})\nuser ${me.username}\ngroups ${me.groups.join(", ")}`);
  return 0;
}

function connectionFromFlags(values: { "config-dir"?: string; kubeconfig?: string; server?: string; "ca-file"?: string; "token-file"?: string }): Connection {
  const { server, "ca-file": caFile, "token-file": tokenFile } = values;
  const chosen = [values["config-dir"], values.kubeconfig, server].filter((x) => x !== undefined).length;
  if (chosen !== 1) throw new UsageError(`give exactly one of --config-dir, --kubeconfig, --server\n\n${help}`);
  if (values.kubeconfig) return { kind: "kubeconfig", path: values.kubeconfig };
  if (server !== undefined) {
    if (!caFile || !tokenFile) throw new UsageError(`--server needs --ca-file and --token-file\n\n${help}`);
    return { kind: "token-file", server, caFile, tokenFile };
  }
  const { config } = loadAgentConfig(values["config-dir"] as string);
  return connectionFor(config, process.env, existsSync);
}
