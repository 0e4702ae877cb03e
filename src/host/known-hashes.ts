// Files whose re-checks read only what changed: the sha256 of every file an inspect pass hashed is kept
// with the file's identity (device, inode, size, mtime and ctime in ns), as git's index keeps it, and the
// next pass reads a file only when its identity differs. Drift is still found: any write or rename over a
// file changes its identity, and ctime cannot be set back, so content changed with its mtime restored is
// read again. The table is persisted in the state directory so a restarted agent need not read every
// file for its first reconcile; a missing, unreadable or invalid table is only a slower pass.
import * as v from "valibot";
import { KnownHashesSchema } from "../api/known-hashes.ts";
import { describeError, type Logger } from "../log.ts";
import { serializer } from "../loops.ts";
import type { FileIdentity, Files } from "./files.ts";

/** Beyond this many entries the oldest are forgotten (paths long gone from the OSC), bounding the table. */
const maxEntries = 20_000;
/** A table file larger than this is not read. */
const maxFileBytes = 8 << 20;

export async function withKnownHashes(files: Files, o: { path: string; log: Logger }): Promise<Files> {
  const log = o.log.with({ component: "known-hashes", path: o.path });
  const table = new Map<string, { identity: FileIdentity; sha256: string }>(Object.entries(await load(files, o.path, log)));
  const saves = serializer();
  let dirty = false;

  const save = () =>
    saves.run(async () => {
      if (!dirty) return;
      dirty = false;
      const doc = { version: 1, files: Object.fromEntries(table) };
      await files.writeAtomic(o.path, `${JSON.stringify(doc)}\n`, 0o600).catch((err: unknown) => {
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

async function load(files: Files, path: string, log: Logger): Promise<Record<string, { identity: string; sha256: string }>> {
  try {
    const raw = await files.read(path, { maxBytes: maxFileBytes });
    if (!raw) return {};
    const parsed = v.safeParse(KnownHashesSchema, JSON.parse(new TextDecoder().decode(raw)));
    if (!parsed.success) throw new Error(v.summarize(parsed.issues));
    return parsed.output.files;
  } catch (err) {
    log.warn("ignoring the files' known hashes: every file is read on the first pass", { error: describeError(err) });
    return {};
  }
}
