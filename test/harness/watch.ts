// Waiting for an object to reach a state by watching it (no fixed sleeps, no polling interval to tune):
// the watch's first event is the object as it is, every change follows at once, and a watch the server
// ends is opened again until the deadline.
import { type KubeConfig, type KubernetesObject, Watch } from "@kubernetes/client-node";

/**
 * Each watch asks the server to end it after this long, with a bookmark just before (the server sends one
 * 2 s before a watch's deadline): client-node aborts a watch that received nothing for 30 s, and a watch
 * resumed from a version that quiet minutes left behind is refused with 410 Gone, so a quiet object's
 * watch must still see its resourceVersion move on.
 */
const watchSeconds = 25;

/**
 * Watches the object `name` in the collection at `path`, calling `onObject` with each version of it, until
 * stop(). A watch the server ends (or that fails while the server starts) is opened again: with `resume`,
 * from the last resourceVersion seen (an object's or a bookmark's), so no change is missed; else (or after
 * 410 Gone: that version is too old to resume from) with the object as it is then.
 */
function keepWatching<T extends KubernetesObject>(kc: KubeConfig, path: string, name: string | undefined, onObject: (obj: T) => void, resume = false): { stop(): void } {
  let stopped = false;
  let watch: AbortController | undefined;
  let resourceVersion: string | undefined;
  const open = async (): Promise<void> => {
    try {
      const from = resume ? resourceVersion : undefined;
      watch = await new Watch(kc).watch(
        path,
        { ...(name === undefined ? {} : { fieldSelector: `metadata.name=${name}` }), ...(from ? { resourceVersion: from } : {}), allowWatchBookmarks: true, timeoutSeconds: watchSeconds },
        (phase, obj: T & { code?: number }) => {
          if (stopped) return;
          if (phase === "ERROR") {
            if (obj.code === 410) resourceVersion = undefined;
            return;
          }
          resourceVersion = obj.metadata?.resourceVersion ?? resourceVersion;
          if (phase === "ADDED" || phase === "MODIFIED") onObject(obj);
        },
        () => reopen(),
      );
      if (stopped) watch.abort();
    } catch {
      reopen();
    }
  };
  const reopen = () => void (stopped || setTimeout(() => void open(), 200));
  void open();
  return {
    stop: () => {
      stopped = true;
      watch?.abort();
    },
  };
}

/**
 * Watches the object `name` in the collection at `path` (e.g. "/api/v1/nodes",
 * "/api/v1/namespaces/default/pods"), or every object there when `name` is undefined, until `check`
 * returns something other than undefined, and returns that. The error on timeout carries `describe` of
 * the last version seen.
 */
export function watchUntil<T extends KubernetesObject, R>(
  kc: KubeConfig,
  what: string,
  path: string,
  name: string | undefined,
  check: (obj: T) => R | undefined,
  opts: { timeoutMs: number; describe?: (obj: T) => string },
): Promise<R> {
  return new Promise<R>((resolve, reject) => {
    let settled = false;
    let last: T | undefined;
    const settle = (outcome: () => void) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      watch.stop();
      outcome();
    };
    const timer = setTimeout(() => {
      const seen = last === undefined ? "never seen" : `last seen: ${(opts.describe ?? ((o: T) => JSON.stringify(o)))(last)}`;
      settle(() => reject(new Error(`timed out after ${opts.timeoutMs} ms waiting for ${what} (${seen})`)));
    }, opts.timeoutMs);
    const watch = keepWatching<T>(kc, path, name, (obj) => {
      last = obj;
      const result = check(obj);
      if (result !== undefined) settle(() => resolve(result));
    });
  });
}

/**
 * Records every version of the object `name` in the collection at `path` from now on, in order, each with
 * when it arrived (Date.now()): a watch the server ends is resumed from the last resourceVersion seen (bookmarks
 * keep it recent while the object is quiet), so no change is missed in between; after 410 Gone the object as
 * it is then is recorded again.
 */
export function recordVersions<T extends KubernetesObject>(kc: KubeConfig, path: string, name: string): { versions: { object: T; at: number }[]; stop(): void } {
  const versions: { object: T; at: number }[] = [];
  const watch = keepWatching<T>(kc, path, name, (object) => versions.push({ object, at: Date.now() }), true);
  return { versions, stop: watch.stop };
}
