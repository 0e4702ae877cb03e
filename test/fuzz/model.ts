// An in-memory node for the fuzz harness: a disk behind the Files interface and a systemd behind the
// Systemd interface, so that the agent's own applyDesired (src/apply/apply.ts) runs a plan against it
// and the planner observes the result, thousands of times a second. The disk follows the POSIX rules a
// real apply meets: a write below a regular file or onto a directory fails, as does removing a
// directory; symlinks in parent directories are followed within the root, a final one is replaced.
import { posix } from "node:path";
import { sha256Hex } from "../../src/api/desired.ts";
import { unitFilePath } from "../../src/api/paths.ts";
import { type FileContent, FileError, type Files, type FileStat, type Inspection } from "../../src/host/files.ts";
import type { Systemd, UnitFileChange, UnitState as SystemdUnitState, UnitStatus } from "../../src/host/systemd.ts";

export type Entry =
  | { kind: "file"; sha256: string; mode: number; bytes?: Uint8Array }
  | { kind: "dir" }
  | { kind: "symlink"; target: string }
  | { kind: "other" };

const maxSymlinks = 40;
const rootDir: Entry = { kind: "dir" };

type Located = { path: string; entry: Entry | undefined } | { error: string };

export class ModelDisk implements Files {
  readonly root = "/";
  readonly entries = new Map<string, Entry>();

  /** Where `path` lands: parents' symlinks followed, the last one too when `followLast`. */
  locate(path: string, followLast: boolean): Located {
    let todo = path.split("/").filter(Boolean);
    let at = "";
    for (let hops = 0; todo.length > 0; ) {
      const [name, ...rest] = todo as [string, ...string[]];
      const next = name === ".." ? posix.dirname(at || "/") : name === "." ? at : `${at}/${name}`;
      const entry = next === "" || next === "/" ? rootDir : this.entries.get(next);
      if (entry?.kind === "symlink" && (rest.length > 0 || followLast)) {
        if (++hops > maxSymlinks) return { error: "too many levels of symbolic links" };
        const target = entry.target.startsWith("/") ? entry.target : `${at}/${entry.target}`;
        todo = [...target.split("/").filter(Boolean), ...rest];
        at = "";
        continue;
      }
      if (rest.length > 0 && entry && entry.kind !== "dir") return { error: "not a directory" };
      if (rest.length > 0 && !entry) return { path: [next, ...rest].join("/"), entry: undefined };
      at = next === "/" ? "" : next;
      todo = rest;
    }
    return { path: at || "/", entry: at ? this.entries.get(at) : rootDir };
  }

  async read(path: string): Promise<Uint8Array | undefined> {
    const at = this.locate(path, true);
    if ("error" in at || !at.entry) return undefined;
    if (at.entry.kind !== "file") throw new FileError("read", path, `is a ${at.entry.kind}`);
    return at.entry.bytes ?? new Uint8Array();
  }

  async stat(path: string): Promise<FileStat | undefined> {
    const at = this.locate(path, false);
    if ("error" in at || !at.entry) return undefined;
    const e = at.entry;
    return { kind: e.kind, mode: e.kind === "file" ? e.mode : 0o755, size: e.kind === "file" ? (e.bytes?.byteLength ?? 0) : 0 };
  }

  async sha256(path: string): Promise<string | undefined> {
    const at = this.locate(path, true);
    return "error" in at || at.entry?.kind !== "file" ? undefined : at.entry.sha256;
  }

  async writeAtomic(path: string, content: FileContent, mode: number): Promise<void> {
    const at = this.locate(path, false);
    if ("error" in at) throw new FileError("writeAtomic", path, at.error);
    if (at.entry && at.entry.kind !== "file" && at.entry.kind !== "symlink") throw new FileError("writeAtomic", path, `is a ${at.entry.kind}`);
    const parents = at.path.split("/").filter(Boolean).slice(0, -1);
    parents.forEach((_, i) => this.entries.set(`/${parents.slice(0, i + 1).join("/")}`, { kind: "dir" }));
    const bytes = typeof content === "string" ? new TextEncoder().encode(content) : content instanceof Uint8Array ? content : undefined;
    const sha256 = bytes ? sha256Hex(bytes) : (content as { sha256: string }).sha256;
    this.entries.set(at.path, { kind: "file", sha256, mode, ...(bytes ? { bytes } : {}) });
  }

  async writeProblem(path: string): Promise<string | undefined> {
    throw new FileError("writeProblem", path, "the model disk does not validate paths; the resolver uses the real Files");
  }

  async writeChecks(paths: readonly string[]): Promise<Map<string, { landsAt: string | undefined; problem: string | undefined }>> {
    throw new FileError("writeChecks", paths[0] ?? "", "the model disk does not validate paths; the resolver uses the real Files");
  }

  async landsAt(path: string): Promise<string | undefined> {
    const at = this.locate(path, false);
    return "error" in at ? undefined : at.path;
  }

  /** As the real one, without identities (nothing is vouched for): a path that cannot be resolved lands at itself, with no file. */
  async inspect(paths: readonly string[]): Promise<Map<string, Inspection>> {
    return new Map(
      paths.map((path) => {
        const at = this.locate(path, false);
        if ("error" in at) return [path, { landsAt: path }];
        const e = at.entry;
        return [path, { landsAt: at.path, ...(e?.kind === "file" ? { file: { mode: e.mode, sha256: e.sha256 } } : {}) }];
      }),
    );
  }

  async remove(path: string): Promise<boolean> {
    const at = this.locate(path, false);
    if ("error" in at || !at.entry) return false;
    if (at.entry.kind === "dir") throw new FileError("remove", path, "is a directory");
    return this.entries.delete(at.path);
  }

  async removeDirIfEmpty(path: string): Promise<boolean> {
    const at = this.locate(path, true);
    if ("error" in at || !at.entry) return false;
    if (at.entry.kind !== "dir") throw new FileError("removeDirIfEmpty", path, `is a ${at.entry.kind}`);
    if (this.childrenOf(at.path).length > 0) return false;
    return this.entries.delete(at.path);
  }

  /** As the real one: the final symlink is removed, not followed; a directory goes with everything below it. */
  async removeTree(path: string): Promise<boolean> {
    const at = this.locate(path, false);
    if ("error" in at || !at.entry) return false;
    for (const p of [...this.entries.keys()]) if (p.startsWith(`${at.path}/`)) this.entries.delete(p);
    return this.entries.delete(at.path);
  }

  async list(dir: string): Promise<string[]> {
    const at = this.locate(dir, true);
    return "error" in at || at.entry?.kind !== "dir" ? [] : this.childrenOf(at.path).sort();
  }

  async cleanupTemp(): Promise<string[]> {
    return [];
  }

  private childrenOf(dir: string): string[] {
    const prefix = dir === "/" ? "/" : `${dir}/`;
    return [...this.entries.keys()].filter((p) => p.startsWith(prefix) && !p.slice(prefix.length).includes("/")).map((p) => p.slice(prefix.length));
  }
}

export type UnitState = { unitFileState: string; activeState: string };

export const unitNotFound = "not found on the node";

class UnitOperationError extends Error {
  override name = "UnitOperationError";
}

/**
 * systemd as far as an apply uses it: a unit exists when its file is on the model disk or it is one of
 * the host's own units (`hostUnits`, under /lib/systemd/system on a real node).
 */
export class ModelSystemd implements Systemd {
  readonly address = "model";
  constructor(
    private readonly disk: ModelDisk,
    readonly units: Map<string, UnitState>,
    private readonly hostUnits: ReadonlySet<string>,
  ) {
    // A unit the node does not have is not running, whatever the case said: once its file is written it
    // starts out inactive, as systemd loads it.
    for (const name of [...units.keys()]) if (!this.exists(name)) units.delete(name);
  }

  private exists(unit: string): boolean {
    const template = unit.replace(/@[^.]*\./, "@.");
    return this.hostUnits.has(unit) || [unit, template].some((u) => this.disk.entries.get(unitFilePath(u))?.kind === "file");
  }

  private set(unit: string, change: Partial<UnitState>, op: string): void {
    if (!this.exists(unit)) throw new UnitOperationError(`${op} ${unit}: ${unitNotFound}`);
    this.units.set(unit, { ...(this.units.get(unit) ?? { unitFileState: "disabled", activeState: "inactive" }), ...change });
  }

  async daemonReload(): Promise<void> {}
  async enableUnits(names: string[]): Promise<UnitFileChange[]> {
    for (const n of names) this.set(n, { unitFileState: "enabled" }, "enable");
    return [];
  }
  async disableUnits(names: string[]): Promise<UnitFileChange[]> {
    for (const n of names) if (this.exists(n)) this.set(n, { unitFileState: "disabled" }, "disable");
    return [];
  }
  async start(unit: string): Promise<void> {
    this.set(unit, { activeState: "active" }, "start");
  }
  async restart(unit: string): Promise<void> {
    this.set(unit, { activeState: "active" }, "restart");
  }
  async queueRestart(unit: string): Promise<void> {
    this.set(unit, { activeState: "active" }, "restart");
  }
  async stop(unit: string): Promise<void> {
    if (this.exists(unit)) this.set(unit, { activeState: "inactive" }, "stop");
  }
  async unitStatus(unit: string): Promise<UnitStatus> {
    const s = this.units.get(unit);
    const known = this.exists(unit);
    return {
      name: unit,
      loadState: known ? "loaded" : "not-found",
      activeState: s?.activeState ?? "inactive",
      subState: s?.activeState === "active" ? "running" : "dead",
      mainPID: 0,
      unitFileState: known ? (s?.unitFileState ?? "disabled") : "",
      triggeredBy: [],
    };
  }
  async unitStates(units: readonly string[]): Promise<Map<string, SystemdUnitState>> {
    return new Map(await Promise.all(units.map(async (u) => [u, await this.unitStatus(u)] as const)));
  }
  async listUnits() {
    return [];
  }
  // Nothing stops a unit behind the model's back: there is nothing to signal.
  async watchUnits(): Promise<() => void> {
    return () => {};
  }
  close(): void {}
}
