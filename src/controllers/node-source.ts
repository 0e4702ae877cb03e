// The agent's Node, watched by name: one watch shared by every controller that needs the Node, instead
// of one each. The watch starts before kubelet has registered the Node (a watch by name of an object
// that does not exist yet is allowed), so the Node is known the moment kubelet creates it: reporting,
// the bootstrap credentials and the serial rollout wait for that. kubelet names its Node after the host
// unless told otherwise; for a Node of another name, the hostname label is looked up every retry interval.
// When neither finds one and the agent reported on a Node before (`lastNodeName`, kept across restarts),
// it keeps to that Node: after a hostname change the agent restarts, but kubelet's Node keeps its name.
import type { V1Node } from "@kubernetes/client-node";
import type { Kube } from "../kube/client.ts";
import { KubeError } from "../kube/errors.ts";
import { findNode } from "../kube/node.ts";
import { watchObjects, type Watcher } from "../kube/watch.ts";
import { describeError, type Logger } from "../log.ts";
import { later } from "../loops.ts";
import type { Controller, NodeSource } from "./types.ts";

export type NodeSourceOptions = {
  kube: Kube;
  hostName: string;
  /** The Node this agent reported on before (its name), if any. */
  lastNodeName?: string;
  log: Logger;
  retryMs?: number;
};

export function startNodeSource(opts: NodeSourceOptions): NodeSource & Controller {
  const log = opts.log.with({ controller: "node" });
  const listeners = new Set<(node: V1Node) => void>();
  let current: V1Node | undefined;
  let watch: Watcher;
  let watching = "";
  let stopped = false;
  const retry = later(() => void lookByLabel());
  let resolveFound!: (node: V1Node) => void;
  let isFound = false;
  const found = new Promise<V1Node>((resolve) => (resolveFound = resolve));

  const seen = (node: V1Node) => {
    current = node;
    if (!isFound) {
      isFound = true;
      log.info("found the Node", { node: node.metadata?.name });
      resolveFound(node);
    }
    for (const l of listeners) l(node);
  };
  const watchByName = (name: string): Watcher => {
    watching = name;
    watch = watchObjects<V1Node>({
      kube: opts.kube,
      path: "/api/v1/nodes",
      fieldSelector: `metadata.name=${name}`,
      log,
      onEvent: (e) => {
        if (e.type === "DELETED") current = undefined;
        else seen(e.object);
      },
    });
    return watch;
  };
  // kubelet derives its Node's name from the host name the same way (trimmed, lower-cased).
  const byName = opts.hostName.trim().toLowerCase();
  // The first watch's list (a Node by another name is looked for after it); a stop before it resolves it too.
  const listed = watchByName(byName).synced.then(
    () => undefined,
    () => undefined,
  );

  const lookByLabel = async () => {
    await watch.synced.catch(() => undefined);
    if (stopped || isFound) return;
    try {
      const node = await findNode(opts.kube, { hostname: opts.hostName });
      const name = node.metadata?.name as string;
      if (!isFound && name !== byName) {
        await watch.stop();
        watchByName(name);
      }
      return;
    } catch (err) {
      const notFound = err instanceof KubeError && err.reason === "not-found";
      if (!notFound) log.warn("looking for the Node by its hostname label failed", { error: describeError(err) });
      else if (opts.lastNodeName && opts.lastNodeName !== byName) {
        if (watching !== opts.lastNodeName && !isFound) {
          log.info("no Node for this hostname; keeping to the Node this agent reported on before", { hostName: opts.hostName, node: opts.lastNodeName });
          await watch.stop();
          watchByName(opts.lastNodeName);
        }
      } else log.info("the Node is not registered yet; watching for it", { hostName: opts.hostName, reason: describeError(err) });
    }
    if (!stopped) retry.in(opts.retryMs ?? 10_000);
  };
  void lookByLabel();

  return {
    current: () => current,
    subscribe: (listener) => {
      listeners.add(listener);
      return () => listeners.delete(listener);
    },
    found,
    listed,
    stop: async () => {
      stopped = true;
      retry.cancel();
      await watch.stop();
    },
  };
}
