// The agent's Node, found once and then watched by name: one watch shared by every controller that
// needs the Node, instead of one each. Before kubelet registers the Node it is looked for again
// every retry interval (by name = hostname, then by the kubernetes.io/hostname label).
import type { V1Node } from "@kubernetes/client-node";
import type { Kube } from "../kube/client.ts";
import { KubeError } from "../kube/errors.ts";
import { findNode } from "../kube/node.ts";
import { watchObjects, type Watcher } from "../kube/watch.ts";
import { describeError, type Logger } from "../log.ts";
import type { Controller, NodeSource } from "./types.ts";

export function startNodeSource(opts: { kube: Kube; hostName: string; log: Logger; retryMs?: number }): NodeSource & Controller {
  const log = opts.log.with({ controller: "node" });
  const listeners = new Set<(node: V1Node) => void>();
  let current: V1Node | undefined;
  let watch: Watcher | undefined;
  let stopped = false;
  let timer: ReturnType<typeof setTimeout> | undefined;
  let resolveFound!: (node: V1Node) => void;
  const found = new Promise<V1Node>((resolve) => (resolveFound = resolve));

  const find = async (): Promise<V1Node> => {
    // By name first (one GET: kubelet names the Node after the host by default), then by label.
    return findNode(opts.kube, { name: opts.hostName.trim().toLowerCase() }).catch((err: unknown) => {
      if (err instanceof KubeError && err.reason === "not-found") return findNode(opts.kube, { hostname: opts.hostName });
      throw err;
    });
  };
  const attempt = async () => {
    if (stopped) return;
    try {
      const node = await find();
      current = node;
      const name = node.metadata?.name as string;
      log.info("found the Node", { node: name });
      watch = watchObjects<V1Node>({
        kube: opts.kube,
        path: "/api/v1/nodes",
        fieldSelector: `metadata.name=${name}`,
        log,
        onEvent: (e) => {
          if (e.type === "DELETED") {
            current = undefined;
            return;
          }
          current = e.object;
          for (const l of listeners) l(e.object);
        },
      });
      resolveFound(node);
    } catch (err) {
      log.info("the Node is not registered yet (or not readable); looking again later", {
        hostName: opts.hostName,
        reason: describeError(err),
      });
      timer = setTimeout(attempt, opts.retryMs ?? 10_000);
    }
  };
  void attempt();

  return {
    current: () => current,
    subscribe: (listener) => {
      listeners.add(listener);
      return () => listeners.delete(listener);
    },
    found,
    stop: async () => {
      stopped = true;
      if (timer) clearTimeout(timer);
      await watch?.stop();
    },
  };
}
