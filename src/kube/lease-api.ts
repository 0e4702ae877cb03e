// The Lease operations the fleet rollout protocol needs, as a small port: the agent uses the API server
// through src/kube/api.ts (`leaseApi` below); the model-based test (test/model) runs the same protocol code
// against an in-memory API with the same optimistic concurrency. Every write carries the resourceVersion
// it was decided on; a lost race is a KubeError with reason "conflict", a missing object "not-found".
import type { V1Lease } from "@kubernetes/client-node";
import type { Logger } from "../log.ts";
import { coordinationV1 } from "./api.ts";
import type { Kube } from "./client.ts";
import { explainKubeError } from "./errors.ts";
import { watchObjects, type WatchEvent } from "./watch.ts";

export type LeaseWatch = {
  /** Resolves once the first list has been delivered. */
  synced: Promise<void>;
  stop(): Promise<void>;
};

export type LeaseApi = {
  /** undefined: no such Lease. */
  get(name: string): Promise<V1Lease | undefined>;
  /** Throws KubeError "conflict" when it exists already. */
  create(body: V1Lease): Promise<V1Lease>;
  /** body.metadata.resourceVersion is the precondition: "conflict" when the Lease changed, "not-found" when it is gone. */
  replace(body: V1Lease): Promise<V1Lease>;
  /**
   * Delivers the Leases named `name`, or labelled `labelSelector`, as a list and then as changes, in
   * order, each handler call awaited; resumes after a broken connection and relists after 410.
   */
  watch(selector: { name: string } | { labelSelector: string }, onEvent: (e: WatchEvent<V1Lease>) => void | Promise<void>): LeaseWatch;
};

export function leaseApi(kube: Kube, namespace: string, log: Logger): LeaseApi {
  const api = coordinationV1(kube);
  const explain = (err: unknown, what: string) => explainKubeError(err, { server: kube.server, caSource: kube.caSource, what });
  return {
    async get(name) {
      try {
        return await api.readNamespacedLease({ name, namespace });
      } catch (err) {
        const e = explain(err, `reading Lease ${namespace}/${name}`);
        if (e.reason === "not-found") return undefined;
        throw e;
      }
    },
    async create(body) {
      try {
        return await api.createNamespacedLease({ namespace, body });
      } catch (err) {
        throw explain(err, `creating Lease ${namespace}/${body.metadata?.name}`);
      }
    },
    async replace(body) {
      const name = body.metadata?.name as string;
      try {
        return await api.replaceNamespacedLease({ name, namespace, body });
      } catch (err) {
        throw explain(err, `updating Lease ${namespace}/${name}`);
      }
    },
    watch(selector, onEvent) {
      return watchObjects<V1Lease>({
        kube,
        path: `/apis/coordination.k8s.io/v1/namespaces/${namespace}/leases`,
        ...("name" in selector ? { fieldSelector: `metadata.name=${selector.name}` } : { labelSelector: selector.labelSelector }),
        log,
        onEvent,
      });
    },
  };
}
