// What the controllers share: the agent's Node as one watch (instead of one per controller), and a
// status board each controller reports into, which /readyz and `trellis status` read.
import type { V1Node } from "@kubernetes/client-node";
import type { StateStore } from "../apply/state-store.ts";
import type { Files } from "../host/files.ts";
import type { Systemd } from "../host/systemd.ts";
import type { Kube } from "../kube/client.ts";
import type { EventRecorder } from "../kube/events.ts";
import type { Logger } from "../log.ts";

export type Controller = { stop(): Promise<void> };

export type NodeSource = {
  /** The Node as last seen; undefined until kubelet has registered it and the agent found it. */
  current(): V1Node | undefined;
  /** Called with every update of the Node (kubelet updates it often: filter for what you need). */
  subscribe(listener: (node: V1Node) => void): () => void;
  /** Resolves once the Node has been found (it may never be, before kubelet registers it). */
  found: Promise<V1Node>;
  /** Resolves once the API server first answered for the Node (found or not); never rejects. */
  listed: Promise<void>;
};

export type ComponentStatus = {
  /** false: this component is not doing its job (readiness fails while it stays false). */
  ok: boolean;
  /** One line for a person. */
  summary: string;
  /** When this was last reported (ISO 8601). */
  at: string;
  [detail: string]: unknown;
};

export type StatusBoard = {
  set(component: string, status: Omit<ComponentStatus, "at">): void;
  snapshot(): Record<string, ComponentStatus>;
};

/** What the OSC controller and the controllers working on the same OSC (rollouts) are given alike. */
export type OscWorkDeps = {
  kube: Kube;
  files: Files;
  systemd: Systemd;
  store: StateStore;
  events: EventRecorder;
  node: NodeSource;
  status: StatusBoard;
  log: Logger;
  /** The OSC Secret (kube-system) this node applies. */
  secretName: string;
};
