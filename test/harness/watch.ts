// Waiting for an object to reach a state by watching it (no fixed sleeps, no polling interval to tune):
// the watch's first event is the object as it is, every change follows at once, and a watch the server
// ends is opened again until the deadline.
import { type KubeConfig, type KubernetesObject, Watch } from "@kubernetes/client-node";

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
    let watch: AbortController | undefined;
    let last: T | undefined;
    const settle = (outcome: () => void) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      watch?.abort();
      outcome();
    };
    const timer = setTimeout(() => {
      const seen = last === undefined ? "never seen" : `last seen: ${(opts.describe ?? ((o: T) => JSON.stringify(o)))(last)}`;
      settle(() => reject(new Error(`timed out after ${opts.timeoutMs} ms waiting for ${what} (${seen})`)));
    }, opts.timeoutMs);
    const open = async (): Promise<void> => {
      try {
        watch = await new Watch(kc).watch(
          path,
          name === undefined ? {} : { fieldSelector: `metadata.name=${name}` },
          (phase, obj: T) => {
            if (phase !== "ADDED" && phase !== "MODIFIED") return;
            last = obj;
            const result = check(obj);
            if (result !== undefined) settle(() => resolve(result));
          },
          () => reopen(),
        );
        if (settled) watch.abort();
      } catch {
        reopen();
      }
    };
    // The server ends watches after a while, and the first one can fail while the server starts.
    const reopen = () => void (settled || setTimeout(() => void open(), 200));
    void open();
  });
}
