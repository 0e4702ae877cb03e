// A machine's disk for the model: the Files port (src/host/files.ts) over a Map. It outlives the agent
// process (an agent crash or a reboot keeps rollout.json and the last good OSC), and each write is atomic
// as writeAtomic promises. Nothing here waits on real I/O: every call settles within the microtask queue.
import { createHash } from "node:crypto";
import { dirname } from "node:path";
import type { FileContent, Files, FileStat, Inspection } from "../../src/host/files.ts";

export function memoryFiles(): Files & { snapshot(): Map<string, Uint8Array> } {
  const files = new Map<string, { bytes: Uint8Array; mode: number; version: number }>();
  let versions = 0;
  const sha = (b: Uint8Array) => createHash("sha256").update(b).digest("hex");
  const bytesOf = (c: FileContent): Uint8Array => {
    if (typeof c === "string") return new TextEncoder().encode(c);
    if (c instanceof Uint8Array) return c.slice();
    const from = files.get(c.copyFrom);
    if (!from || sha(from.bytes) !== c.sha256) throw new Error(`copying ${c.copyFrom}: missing or not of sha256 ${c.sha256}`);
    return from.bytes.slice();
  };
  const dirs = () => new Set([...files.keys()].flatMap((p) => ancestors(p)));

  return {
    root: "/",
    async read(path, opts) {
      const f = files.get(path);
      if (!f) return undefined;
      if (opts?.maxBytes !== undefined && f.bytes.length > opts.maxBytes) throw new Error(`${path}: larger than ${opts.maxBytes} bytes`);
      return f.bytes.slice();
    },
    async stat(path): Promise<FileStat | undefined> {
      const f = files.get(path);
      if (f) return { mode: f.mode, size: f.bytes.length, kind: "file" };
      return dirs().has(path) ? { mode: 0o755, size: 0, kind: "dir" } : undefined;
    },
    async sha256(path) {
      const f = files.get(path);
      return f ? sha(f.bytes) : undefined;
    },
    async writeAtomic(path, content, mode) {
      if (dirs().has(path)) throw new Error(`${path}: is a directory`);
      files.set(path, { bytes: bytesOf(content), mode, version: ++versions });
    },
    async writeProblem(path) {
      return dirs().has(path) ? `${path} is a directory` : undefined;
    },
    async landsAt(path) {
      return path;
    },
    async writeChecks(paths) {
      const d = dirs();
      return new Map(paths.map((p) => [p, { landsAt: p, problem: d.has(p) ? `${p} is a directory` : undefined }]));
    },
    async inspect(paths): Promise<Map<string, Inspection>> {
      return new Map(
        paths.map((p): [string, Inspection] => {
          const f = files.get(p);
          return [p, { landsAt: p, ...(f ? { file: { mode: f.mode, sha256: sha(f.bytes), identity: `${p}@${f.version}` } } : {}) }];
        }),
      );
    },
    async remove(path) {
      return files.delete(path);
    },
    async removeDirIfEmpty(path) {
      return !dirs().has(path);
    },
    async removeTree(path) {
      const below = [...files.keys()].filter((p) => p === path || p.startsWith(`${path}/`));
      for (const p of below) files.delete(p);
      return below.length > 0;
    },
    async list(dir) {
      const prefix = dir.endsWith("/") ? dir : `${dir}/`;
      const names = new Set<string>();
      for (const p of files.keys()) if (p.startsWith(prefix)) names.add(p.slice(prefix.length).split("/")[0] as string);
      return [...names].sort();
    },
    async cleanupTemp() {
      return [];
    },
    snapshot: () => new Map([...files].map(([p, f]) => [p, f.bytes.slice()])),
  };
}

function ancestors(path: string): string[] {
  const out: string[] = [];
  for (let d = dirname(path); d !== "/" && d !== "."; d = dirname(d)) out.push(d);
  return out;
}
