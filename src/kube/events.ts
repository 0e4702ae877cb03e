// Events about the agent's Node (e.g. OSCApplied), recorded the way client-go's recorder does it for
// kubelet and gardener-node-agent: a core/v1 Event in the "default" namespace (where the events of
// cluster-scoped objects go), and a repeat of the same event bumps `count` on the one already there
// instead of adding another. Recording is best effort: a failure is logged and returned, never thrown
// into the reconcile that wanted to report something.
import type { CoreV1Event, V1Node } from "@kubernetes/client-node";
import type { Logger } from "../log.ts";
import { coreV1 } from "./api.ts";
import type { Kube } from "./client.ts";
import { explainKubeError, type KubeError } from "./errors.ts";
import { metaTime } from "./node.ts";
import { serializer } from "../loops.ts";
import { monotonicMs } from "../time.ts";

export type NodeEvent = {
  node: { name: string; uid: string };
  type: "Normal" | "Warning";
  reason: string;
  message: string;
};

/** The part of a Node an event names. */
export function nodeRef(n: V1Node): NodeEvent["node"] {
  return { name: n.metadata?.name ?? "", uid: n.metadata?.uid ?? "" };
}

export type EventRecorder = {
  /** Resolves to the error when the event could not be recorded (it has been logged), else undefined. */
  record(event: NodeEvent): Promise<KubeError | undefined>;
};

const namespace = "default";
// events.k8s.io limits a note to 1 kB; core/v1 does not, but a longer message only bloats etcd.
const maxMessage = 1024;

export function createEventRecorder(opts: {
  kube: Kube;
  log: Logger;
  component?: string;
  /** How long an identical event keeps counting on the existing one (10 min, as client-go aggregates). */
  windowMs?: number;
  /** The wall clock: the events' timestamps and names. */
  now?: () => Date;
  /** The monotonic clock the window is measured by. */
  clock?: () => number;
}): EventRecorder {
  const { kube, log } = opts;
  const component = opts.component ?? "trellis";
  const windowMs = opts.windowMs ?? 10 * 60_000;
  const now = opts.now ?? (() => new Date());
  const clock = opts.clock ?? monotonicMs;
  const core = coreV1(kube);
  const recent = new Map<string, { name: string; count: number; last: number }>();
  // One at a time: two identical events recorded at once must not both find nothing and both create.
  const recording = serializer();

  async function record(e: NodeEvent): Promise<KubeError | undefined> {
    const message = truncate(e.message, maxMessage);
    const key = JSON.stringify([e.node.uid, e.type, e.reason, message]);
    const at = now();
    const t = clock();
    for (const [k, v] of recent) if (t - v.last > windowMs) recent.delete(k);
    const seen = recent.get(key);
    try {
      if (seen) {
        const patched = await bump(seen.name, seen.count + 1, at);
        if (patched) {
          recent.set(key, { name: seen.name, count: seen.count + 1, last: t });
          return undefined;
        }
      }
      const name = await create(e, message, at);
      recent.set(key, { name, count: 1, last: t });
      return undefined;
    } catch (err) {
      const ke = explainKubeError(err, { server: kube.server, caSource: kube.caSource, what: `recording event ${e.reason} for Node ${e.node.name}` });
      log.warn("could not record event", { reason: e.reason, err: ke });
      return ke;
    }
  }

  /** False when the event is gone (events expire after an hour by default): then a new one is created. */
  async function bump(name: string, count: number, at: Date): Promise<boolean> {
    try {
      await core.patchNamespacedEvent(
        { name, namespace, body: { count, lastTimestamp: metaTime(at) } },
        "merge",
      );
      return true;
    } catch (err) {
      const ke = explainKubeError(err, { server: kube.server, caSource: kube.caSource, what: `updating event ${namespace}/${name}` });
      if (ke.reason === "not-found") return false;
      throw ke;
    }
  }

  async function create(e: NodeEvent, message: string, at: Date): Promise<string> {
    // client-go's naming: <object>.<time in ns, hex>; the random low digits keep two events of one millisecond apart.
    const ns = BigInt(at.getTime()) * 1_000_000n + BigInt(Math.floor(Math.random() * 1_000_000));
    const body: CoreV1Event = {
      metadata: { name: `${e.node.name}.${ns.toString(16)}`, namespace },
      involvedObject: { apiVersion: "v1", kind: "Node", name: e.node.name, uid: e.node.uid },
      type: e.type,
      reason: e.reason,
      message,
      source: { component, host: e.node.name },
      reportingComponent: component,
      reportingInstance: e.node.name,
      firstTimestamp: at,
      lastTimestamp: at,
      count: 1,
    };
    const created = await core.createNamespacedEvent({ namespace, body });
    return created.metadata?.name ?? (body.metadata?.name as string);
  }

  return {
    record: (event) => recording.run(() => record(event)),
  };
}

/** At most `max` characters, cut on a code point boundary, marked with an ellipsis when cut. */
function truncate(s: string, max: number): string {
  const chars = Array.from(s);
  return chars.length <= max ? s : `${chars.slice(0, max - 1).join("")}…`;
}
