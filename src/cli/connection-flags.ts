// How a command that talks to the API server is told where and as whom: exactly one of --config-dir
// (the agent's own way, NodeAgentConfiguration and its credentials), --kubeconfig, or --server with
// --ca-file and --token-file.
import { existsSync } from "node:fs";
import { type Connection, connectionFor } from "../kube/connection.ts";
import { loadAgentConfig } from "./agent-config.ts";
import { UsageError } from "./errors.ts";

export type ConnectionFlags = { "config-dir"?: string; kubeconfig?: string; server?: string; "ca-file"?: string; "token-file"?: string };

export const connectionOptions = {
  "config-dir": { type: "string" },
  kubeconfig: { type: "string" },
  server: { type: "string" },
  "ca-file": { type: "string" },
  "token-file": { type: "string" },
} as const;

export function connectionFromFlags(values: ConnectionFlags, help: string): Connection {
  const { server, "ca-file": caFile, "token-file": tokenFile } = values;
  const chosen = [values["config-dir"], values.kubeconfig, server].filter((x) => x !== undefined).length;
  if (chosen !== 1) throw new UsageError(`give exactly one of --config-dir, --kubeconfig, --server\n\n${help}`);
  if (values.kubeconfig) return { kind: "kubeconfig", path: values.kubeconfig };
  if (server !== undefined) {
    if (!caFile || !tokenFile) throw new UsageError(`--server needs --ca-file and --token-file\n\n${help}`);
    return { kind: "token-file", server, ca: { file: caFile }, tokenFile };
  }
  const { config } = loadAgentConfig(values["config-dir"] as string);
  return connectionFor(config, process.env, existsSync);
}
