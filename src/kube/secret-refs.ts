// The kube-system Secrets an OSC's `secretRef` files name. The first read of one is a GET (its errors
// are the caller's, as any read's); from then on it is watched by name, as the OSC Secret is, so a
// re-check reads it from memory instead of asking the API server, and a change to it is reported
// (`onChange`) instead of waiting for the next syncPeriod. gardener-node-agent GETs each one on every
// reconcile; its NodeAgentAuthorizer grants get, list and watch on them alike.
import type { V1Secret } from "@kubernetes/client-node";
import { decodeBase64 } from "../api/base64.ts";
import type { Logger } from "../log.ts";
import { coreV1 } from "./api.ts";
import type { Kube } from "./client.ts";
import { explainKubeError } from "./errors.ts";
import { type Watcher, watchObjects } from "./watch.ts";

type SecretData = Readonly<Record<string, Uint8Array>>;

export type SecretRefs = {
  /** The Secret's data (undefined: it does not exist); throws when it cannot be read or decoded. */
  read(name: string): Promise<SecretData | undefined>;
  /** Stops watching every Secret not in `names` (the OSC no longer names it). */
  keepOnly(names: readonly string[]): Promise<void>;
  stop(): Promise<void>;
};

type Entry = { watcher: Watcher; seen: { synced: boolean; secret: V1Secret | undefined } };

export function watchSecretRefs(opts: { kube: Kube; log: Logger; onChange: (name: string) => void }): SecretRefs {
  const core = coreV1(opts.kube);
  const watched = new Map<string, Entry>();

  const watch = (name: string) => {
    const seen: Entry["seen"] = { synced: false, secret: undefined };
    const watcher = watchObjects<V1Secret>({
      kube: opts.kube,
      path: "/api/v1/namespaces/kube-system/secrets",
      fieldSelector: `metadata.name=${name}`,
      log: opts.log,
      onEvent: (e) => {
        seen.secret = e.type === "DELETED" ? undefined : e.object;
        if (seen.synced) opts.onChange(name);
      },
    });
    void watcher.synced.then(
      () => {
        seen.synced = true;
      },
      () => undefined, // stopped before its first list: nothing to wait for
    );
    watched.set(name, { watcher, seen });
  };

  const get = async (name: string): Promise<V1Secret | undefined> => {
    try {
      return await core.readNamespacedSecret({ name, namespace: "kube-system" });
    } catch (err) {
      const e = explainKubeError(err, { server: opts.kube.server, caSource: opts.kube.caSource, what: `reading Secret kube-system/${name}` });
      if (e.reason !== "not-found") throw e;
      return undefined;
    }
  };

  return {
    async read(name) {
      const entry = watched.get(name);
      if (!entry) watch(name);
      // Until its watch has listed it (just started, or its first list keeps failing: RBAC without list/watch), a GET.
      return decoded(name, entry?.seen.synced ? entry.seen.secret : await get(name));
    },
    async keepOnly(names) {
      const keep = new Set(names);
      for (const [name, entry] of [...watched]) {
        if (keep.has(name)) continue;
        watched.delete(name);
        await entry.watcher.stop();
      }
    },
    async stop() {
      await Promise.all([...watched.values()].map((e) => e.watcher.stop()));
      watched.clear();
    },
  };
}

function decoded(name: string, s: V1Secret | undefined): SecretData | undefined {
  if (!s) return undefined;
  const data: Record<string, Uint8Array> = {};
  for (const [key, encoded] of Object.entries(s.data ?? {})) {
    const bytes = decodeBase64(encoded);
    if (!bytes) throw new Error(`Secret kube-system/${name}: data["${key}"] is not valid base64`);
    data[key] = bytes;
  }
  return data;
}
