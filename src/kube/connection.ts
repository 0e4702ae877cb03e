// Where the agent's API credentials come from, in gardener-node-agent's order of precedence:
// KUBECONFIG, then clientConnection.kubeconfig, then the kubeconfig the bootstrap wrote, and on a
// node that has none yet, the API server URL + cluster CA + bootstrap token.
import { apiServerCa, type NodeAgentConfiguration } from "../api/agent-config.ts";
import { paths } from "../api/paths.ts";
import type { CaRef } from "./csr-kubeconfig.ts";

export type Connection =
  | { kind: "kubeconfig"; path: string }
  | { kind: "token-file"; server: string; ca: CaRef; tokenFile: string };

export function connectionFor(
  config: Pick<NodeAgentConfiguration, "clientConnection" | "apiServer">,
  env: Record<string, string | undefined>,
  exists: (path: string) => boolean,
): Connection {
  const explicit = env.KUBECONFIG || config.clientConnection.kubeconfig;
  if (explicit) return { kind: "kubeconfig", path: explicit };
  if (exists(paths.kubeconfig)) return { kind: "kubeconfig", path: paths.kubeconfig };
  if (!exists(paths.bootstrapToken)) {
    throw new Error(`no API credentials: neither the kubeconfig ${paths.kubeconfig} nor the bootstrap token ${paths.bootstrapToken} exists`);
  }
  if (!config.apiServer.server) throw new Error(`apiServer.server: required to bootstrap with ${paths.bootstrapToken}`);
  return { kind: "token-file", server: config.apiServer.server, ca: apiServerCa(config.apiServer, paths.clusterCa), tokenFile: paths.bootstrapToken };
}
