// The agent's state on the node (src/api/state.ts), read and written atomically through Files; the same
// for the other JSON files the agent keeps (jsonStore, src/host/json-store.ts).
// A state file that exists but cannot be parsed is an error, never silently replaced by an empty
// state: that would make trellis forget what it owns.
import { dirname } from "node:path";
import { baseDir, credentialsDir, paths } from "../api/paths.ts";
import { statusPath } from "../api/status-file.ts";
import { type AgentState, AgentStateSchema, emptyState } from "../api/state.ts";
import type { Desired } from "../api/desired.ts";
import type { Files } from "../host/files.ts";
import { gardenerLastApplied } from "./gardener-record.ts";
import { jsonStore } from "../host/json-store.ts";

export const statePath = `${baseDir}/trellis/state.json`;
/** The lock one trellis at a time holds while it changes the node (src/host/state-lock.ts). */
export const stateLockPath = `${baseDir}/trellis/lock`;

export type StateStore = {
  read(): Promise<AgentState>;
  write(state: AgentState): Promise<void>;
  /**
   * The OSC an apply completed, applied as `desired`: trellis's copy (the rollback target) and what
   * gardener-node-agent keeps of it (src/apply/gardener-record.ts).
   */
  recordApplied(oscYaml: string | Uint8Array, desired: Desired): Promise<void>;
};

export function createStateStore(files: Files): StateStore {
  const store = jsonStore(files, statePath, AgentStateSchema, emptyState);
  return {
    ...store,
    recordApplied: async (oscYaml, desired) => {
      await files.writeAtomic(paths.appliedOsc, oscYaml, 0o600);
      await files.writeAtomic(paths.lastAppliedOsc, gardenerLastApplied(oscYaml, desired), 0o600);
      await files.remove(paths.lastComputedOscChanges);
    },
  };
}

// Where the agent writes its own files: state, rollout record and last good OSC; last-applied-osc.yaml;
// credentials (token, kubeconfig, pending CSR); the status file.
const agentDirs = [dirname(statePath), baseDir, credentialsDir, dirname(statusPath)];

/**
 * Deletes the temp files an agent killed mid-write left in its own directories, and returns their node
 * paths. An apply clears only the directories its plan writes to, so these would stay forever (and pile
 * up, one per kill: the state file is written at every step). Run at the agent's start, before anything
 * writes there.
 */
export async function removeLeftoverTemp(files: Files): Promise<string[]> {
  const removed: string[] = [];
  for (const dir of agentDirs) removed.push(...(await files.cleanupTemp(dir)).map((name) => `${dir}/${name}`));
  return removed;
}
