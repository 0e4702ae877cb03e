// The token controller, as gardener-node-agent's (pkg/nodeagent/controller/token): each syncConfig names
// a Secret in kube-system whose data.token is kept in a file on the node with mode 0640 (e.g. the access
// token Gardener rotates for the agent itself). Each Secret is watched by name only, never another one.
//
// A file is written only when it differs from the token (sha256, mode, a regular file), so an unchanged
// Secret costs no write. The few files are checked every checkIntervalMs, so one deleted or changed on
// disk is restored within that. A Secret that is deleted or has no token leaves its file as it is: an
// old token is worth more than none, and it may be valid still.
import { Buffer } from "node:buffer";
import { createHash } from "node:crypto";
import type { V1Secret } from "@kubernetes/client-node";
import type { Files } from "../host/files.ts";
import type { Kube } from "../kube/client.ts";
import { watchObjects, type Watcher } from "../kube/watch.ts";
import { every, serializer } from "../loops.ts";
import { describeError, type Logger } from "../log.ts";
import type { Registry } from "../metrics.ts";
import type { Controller, StatusBoard } from "./types.ts";

export type TokenSyncConfig = { secretName: string; path: string };

export type TokenControllerDeps = {
  kube: Kube;
  files: Files;
  log: Logger;
  metrics: Registry;
  status: StatusBoard;
  syncConfigs: TokenSyncConfig[];
  /**
   * Every syncPeriod each Secret's watch starts afresh from a LIST: the safety net against an event
   * lost on the server's side, in the place of gardener-node-agent's GET of each Secret this often.
   */
  syncPeriodMs: number;
  /** How often the files are compared with the tokens (a stat and a hash of a few small files). */
  checkIntervalMs?: number;
};

const namespace = "kube-system";
const dataKey = "token";
const fileMode = 0o640;

/** What the Secret says the file should hold: a token, or why there is none to write. */
type Wanted = { token: Buffer; sha256: string } | { none: "waiting for the first list" | "not found" | "has no data.token" };

export type TokenController = Controller & {
  /**
   * Reads each Secret afresh and brings its file in line, as gardener-node-agent makes its token
   * controller do after a service-account key rotation. Resolves with what is still wrong, per file.
   */
  resync(): Promise<string[]>;
};

export function startTokenController(deps: TokenControllerDeps): TokenController {
  const log = deps.log.with({ controller: "token" });
  const checkIntervalMs = deps.checkIntervalMs ?? 10_000;
  for (const [what, ms] of [["syncPeriodMs", deps.syncPeriodMs], ["checkIntervalMs", checkIntervalMs]] as const) {
    if (!(ms > 0)) throw new Error(`token controller: ${what} must be positive, not ${ms}`);
  }
  const writes = deps.metrics.counter("trellis_token_writes_total", "Token files written from their Secret, by Secret.");
  const stopper = new AbortController();
  const secretNames = [...new Set(deps.syncConfigs.map((c) => c.secretName))];
  const wanted = new Map<string, Wanted>(secretNames.map((name) => [name, { none: "waiting for the first list" }]));
  /** path → undefined once the file was found matching or written, else the error of its last check or write; absent before the first check. */
  const problems = new Map<string, string | undefined>();

  // One sync at a time: a watch event and the periodic check must not write the same file at once.
  const syncs = serializer();
  const sync = (configs: TokenSyncConfig[]): Promise<void> => syncs.run(() => syncFiles(configs));

  async function syncFiles(configs: TokenSyncConfig[]): Promise<void> {
    for (const c of configs) {
      const want = wanted.get(c.secretName);
      if (!want || "none" in want) continue; // the file stays as it is
      try {
        const why = await difference(c.path, want.sha256);
        if (why !== undefined) {
          await deps.files.writeAtomic(c.path, want.token, fileMode);
          writes.inc({ secret: c.secretName });
          log.info("wrote the token file", { path: c.path, secret: `${namespace}/${c.secretName}`, why });
        }
        problems.set(c.path, undefined);
      } catch (err) {
        const error = describeError(err);
        // Logged when it starts or changes, not at every check while it lasts.
        if (problems.get(c.path) !== error) log.error("could not write the token file; trying again at the next check", { path: c.path, error });
        problems.set(c.path, error);
      }
    }
    report();
  }

  /** Why the file at `path` does not hold the token (undefined: it does). */
  async function difference(path: string, sha256: string): Promise<string | undefined> {
    const stat = await deps.files.stat(path);
    if (!stat) return "missing";
    if (stat.kind !== "file") return `a ${stat.kind}, not a file`;
    if ((await deps.files.sha256(path)) !== sha256) return "content differs from the Secret";
    if (stat.mode !== fileMode) return `mode 0${stat.mode.toString(8)}, not 0${fileMode.toString(8)}`;
    return undefined;
  }

  function onSecret(name: string, secret: V1Secret | undefined): Promise<void> {
    const ref = `${namespace}/${name}`;
    const paths = deps.syncConfigs.filter((c) => c.secretName === name);
    const encoded = secret?.data?.[dataKey];
    if (!secret) {
      wanted.set(name, { none: "not found" });
      log.warn("the token Secret was deleted; its file is left as it is", { secret: ref, paths: paths.map((c) => c.path) });
    } else if (!encoded) {
      // gardener-node-agent refuses an empty token too.
      wanted.set(name, { none: "has no data.token" });
      log.warn(`the token Secret has no data.${dataKey}; its file is left as it is`, { secret: ref, paths: paths.map((c) => c.path) });
    } else {
      const token = Buffer.from(encoded, "base64");
      wanted.set(name, { token, sha256: createHash("sha256").update(token).digest("hex") });
    }
    return sync(paths);
  }

  function watch(name: string): Watcher {
    return watchObjects<V1Secret>({
      kube: deps.kube,
      path: `/api/v1/namespaces/${namespace}/secrets`,
      fieldSelector: `metadata.name=${name}`,
      log,
      onEvent: (e) => onSecret(name, e.type === "DELETED" ? undefined : e.object),
    });
  }

  function problemLines(): string[] {
    return deps.syncConfigs.flatMap((c) => {
      const want = wanted.get(c.secretName);
      if (want && "none" in want) return [`${c.path}: Secret ${namespace}/${c.secretName} ${want.none}`];
      const problem = problems.get(c.path);
      return problem === undefined && problems.has(c.path) ? [] : [`${c.path}: ${problem ?? "not checked yet"}`];
    });
  }

  function report(): void {
    const lines = problemLines();
    const total = deps.syncConfigs.length;
    const summary = lines.length > 0 ? lines.join("; ") : total === 0 ? "no token secrets configured" : `${total} token file(s) match their Secret`;
    deps.status.set("token", { ok: lines.length === 0, summary, files: deps.syncConfigs.map((c) => c.path) });
  }

  const watchers = new Map(
    secretNames.map((name) => {
      const w = watch(name);
      // A Secret that does not exist yet produces no event: the first list says so.
      void w.synced.then(() => {
        const want = wanted.get(name);
        if (want && "none" in want && want.none === "waiting for the first list") {
          wanted.set(name, { none: "not found" });
          log.warn("the token Secret does not exist (yet); its file is left as it is", { secret: `${namespace}/${name}` });
          report();
        }
      }, () => undefined); // rejected only when stopped before the first list
      return [name, w];
    }),
  );
  report();

  // One relist at a time: the periodic one and a resync must not both replace a watch.
  const relists = serializer();
  const relist = (): Promise<void> =>
    relists.run(async () => {
      for (const name of secretNames) {
        await watchers.get(name)?.stop();
        if (stopper.signal.aborted) return;
        watchers.set(name, watch(name));
      }
    });
  const loops = [
    every(checkIntervalMs, () => sync(deps.syncConfigs), { firstAfterInterval: true }),
    every(deps.syncPeriodMs, relist, { firstAfterInterval: true }),
  ];

  return {
    async stop() {
      stopper.abort();
      await Promise.all(loops.map((l) => l.stop()));
      await Promise.all([...watchers.values()].map((w) => w.stop()));
      await syncs.idle();
    },
    async resync() {
      await relist();
      await Promise.all([...watchers.values()].map((w) => w.synced));
      await sync(deps.syncConfigs);
      return problemLines();
    },
  };
}
