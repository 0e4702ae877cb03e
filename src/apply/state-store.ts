// The agent's state on the node (src/api/state.ts), read and written atomically through Files; the same
// for the other JSON files the agent keeps (jsonStore).
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
  const store = jsonStore(files, statePath, AgentStateSchema, emptyState);
  return { ...store, writeLastAppliedOsc: (oscYaml) => files.writeAtomic(paths.lastAppliedOsc, oscYaml, 0o600) };
}

/** A JSON file of the agent's (0600), parsed with `schema`; missing is `empty()`, unreadable is an error naming the file. */
export function jsonStore<S extends v.GenericSchema>(files: Files, path: string, schema: S, empty: () => v.InferOutput<S>) {
  return {
    read: async (): Promise<v.InferOutput<S>> => {
      const raw = await files.read(path);
      if (!raw) return empty();
      let doc: unknown;
      try {
        doc = JSON.parse(new TextDecoder().decode(raw));
      } catch (err) {
        throw new Error(`${path}: not valid JSON (${err instanceof Error ? err.message : String(err)}); move it away to start over`);
      }
      const r = v.safeParse(schema, doc);
      if (!r.success) throw new Error(`${path}: ${formatIssues(r.issues).join("; ")}; move it away to start over`);
      return r.output;
    },
    write: (value: v.InferOutput<S>) => files.writeAtomic(path, `${JSON.stringify(value)}\n`, 0o600),
  };
}
