// The agent's state on the node (src/api/state.ts), read and written atomically through Files.
// A state file that exists but cannot be parsed is an error, never silently replaced by an empty
// state: that would make trellis forget what it owns.
import * as v from "valibot";
import { formatIssues } from "../api/issues.ts";
import { baseDir, paths } from "../api/paths.ts";
import { type AgentState, AgentStateSchema, emptyState } from "../api/state.ts";
import type { Files } from "../host/files.ts";

export const statePath = `${baseDir}/trellis/state.json`;

export type StateStore = {
  read(): Promise<AgentState>;
  write(state: AgentState): Promise<void>;
  /** gardener-node-agent's last-applied-osc.yaml, for tools that read it. */
  writeLastAppliedOsc(oscYaml: string | Uint8Array): Promise<void>;
};

export function createStateStore(files: Files): StateStore {
  return {
    read: async () => {
      const raw = await files.read(statePath);
      if (!raw) return emptyState();
      let doc: unknown;
      try {
        doc = JSON.parse(new TextDecoder().decode(raw));
      } catch (err) {
        throw new Error(`${statePath}: not valid JSON (${err instanceof Error ? err.message : String(err)}); move it away to start over`);
      }
      const r = v.safeParse(AgentStateSchema, doc);
      if (!r.success) throw new Error(`${statePath}: ${formatIssues(r.issues).join("; ")}; move it away to start over`);
      return r.output;
    },
    write: (state) => files.writeAtomic(statePath, `${JSON.stringify(state)}\n`, 0o600),
    writeLastAppliedOsc: (oscYaml) => files.writeAtomic(paths.lastAppliedOsc, oscYaml, 0o600),
  };
}
