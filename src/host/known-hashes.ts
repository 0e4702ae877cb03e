// Files whose re-checks read only what changed: the sha256 of every file an inspect pass hashed is kept
// with the file's identity (device, inode, size, mtime and ctime in ns), as git's index keeps it, and the
// next pass reads a file only when its identity differs. Drift is still found: any write or rename over a
// file changes its identity, and ctime cannot be set back, so content changed with its mtime restored is
// read again. The table is persisted in the state directory so a restarted agent need not read every
// file for its first reconcile; a missing, unreadable or invalid table is only a slower pass.
import { KnownHashesSchema } from "../api/known-hashes.ts";
import { describeError, type Logger } from "../log.ts";
import { serializer } from "../loops.ts";
import type { FileIdentity, Files } from "./files.ts";
import { jsonStore } from "./json-store.ts";

/** Beyond this many entries the oldest are forgotten (paths long gone from the OSC), bounding the table. */
const maxEntries = 20_000;
/** A table file larger than this is not read. */
const maxFileBytes = 8 << 20;

const tableStore = (files: Files, path: string) => jsonStore(files, path, KnownHashesSchema, () => ({ version: 1 as const, files: {} }), { maxBytes: maxFileBytes });

export async function withKnownHashes(files: Files, o: { path: string; log: Logger }): Promise<Files> {
  const log = o.log.with({ component: "known-hashes", path: o.path });
  const store = tableStore(files, o.path);
  const table = new Map<string, { identity: FileIdentity; sha256: string }>(Object.entries(await load(store, o.path, log)));
  const saves = serializer();
  let dirty = false;

  const save = () =>
    saves.run(async () => {
      if (!dirty) return;
      dirty = false;
      await store.write({ version: 1, files: Object.fromEntries(table) }).catch((err: unknown) => {
        dirty = true;
        log.warn("could not save the files' known hashes; the next start reads every file", { error: describeError(err) });
      });
    });

  return {
    ...files,
    async inspect(paths, known) {
      const seen = await files.inspect(paths, known ?? ((path, identity) => (table.get(path)?.identity === identity ? table.get(path)?.sha256 : undefined)));
      for (const [path, { file }] of seen) {
        const had = table.get(path);
        if (file?.identity === undefined) {
          if (had) dirty = table.delete(path) || dirty;
        } else if (had?.identity !== file.identity || had.sha256 !== file.sha256) {
          table.delete(path); // re-inserted last: the oldest entries are the first forgotten
          table.set(path, { identity: file.identity, sha256: file.sha256 });
          dirty = true;
        }
      }
      for (const path of table.keys()) {
        if (table.size <= maxEntries) break;
        table.delete(path);
      }
      await save();
      return seen;
    },
  };
}

async function load(store: ReturnType<typeof tableStore>, path: string, log: Logger): Promise<Record<string, { identity: string; sha256: string }>> {
  try {
    return (await store.read()).files;
  } catch (err) {
    log.warn("ignoring the files' known hashes: every file is read on the first pass", { path, error: describeError(err) });
    return {};
  }
}
