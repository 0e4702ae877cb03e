// Follows the pool's OSC Secret when its name changes, as gardener-node-agent's secret-name-change
// controller does: the control plane names the Secret by a hash of what the pool's nodes share, and when
// the name changes it labels each Node with the new one (worker.gardener.cloud/gardener-node-agent-secret-name,
// which kubelet registered the Node with). Like gardener-node-agent, trellis only reads that label.
// An agent whose configuration names another Secret writes the new name into its configuration file and
// restarts (systemd starts it again), so every controller reads the new Secret from the start.
// Unlike gardener-node-agent, a label removed or emptied is not written as an empty name.
import type { V1Node } from "@kubernetes/client-node";
import { parseDocument } from "yaml";
import { parseAgentConfig } from "../api/agent-config.ts";
import { poolLabel } from "../api/rollout.ts";
import type { Files } from "../host/files.ts";
import { describeError, type Logger } from "../log.ts";
import type { Controller, NodeSource } from "./types.ts";

const secretNamePath = ["controllers", "operatingSystemConfig", "secretName"] as const;

/** The configuration text with `secretName` replaced, everything else as it was; throws if the result is invalid. */
export function withSecretName(text: string, secretName: string, source: string): string {
  const doc = parseDocument(text);
  doc.setIn(secretNamePath, secretName);
  const updated = doc.toString();
  const check = parseAgentConfig(updated, source);
  if (!check.ok) throw new Error(`${source} with secretName ${secretName} would be invalid: ${check.errors.join("; ")}`);
  return updated;
}

export function startSecretNameFollower(deps: {
  node: NodeSource;
  files: Files;
  /** The configuration file the agent read, and the Secret name in it. */
  configFile: string;
  secretName: string;
  log: Logger;
  restartSelf: (reason: string) => void;
}): Controller {
  const log = deps.log.with({ controller: "secret-name" });
  // Node updates can come quickly one after another: one rewrite at a time, and none after the first.
  let busy = false;
  let done = false;
  const check = async (node: V1Node) => {
    const wanted = node.metadata?.labels?.[poolLabel];
    if (!wanted || wanted === deps.secretName || busy || done) return;
    busy = true;
    try {
      const bytes = await deps.files.read(deps.configFile);
      if (!bytes) throw new Error(`${deps.configFile} is gone`);
      const text = new TextDecoder().decode(bytes);
      // Gardener writes the configuration 0600 (it names the API server and the Secret).
      await deps.files.writeAtomic(deps.configFile, withSecretName(text, wanted, deps.configFile), 0o600);
      done = true;
      log.info("the Node names another OSC Secret: configuration rewritten, restarting to follow it", {
        label: poolLabel,
        from: deps.secretName,
        to: wanted,
        config: deps.configFile,
      });
      deps.restartSelf(`the OSC Secret's name changed to ${wanted}`);
    } catch (err) {
      // Retried with the Node's next update (kubelet updates it every few minutes at least).
      log.error("could not follow the OSC Secret's new name", { label: poolLabel, to: wanted, config: deps.configFile, error: describeError(err) });
    } finally {
      busy = false;
    }
  };
  const current = deps.node.current();
  if (current) void check(current);
  const unsubscribe = deps.node.subscribe((n) => void check(n));
  return {
    stop: async () => {
      unsubscribe();
    },
  };
}
