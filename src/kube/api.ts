// The API requests the agent makes, typed with client-node's types, named as client-node's generated
// API names them. Each is one kubeJson request; objects come back as the server sent them (times are
// strings: nothing here turns them into Dates).
import type {
  CoreV1Event,
  V1CertificateSigningRequest,
  V1Lease,
  V1LeaseList,
  V1Node,
  V1NodeList,
  V1Pod,
  V1PodList,
  V1Secret,
  V1SelfSubjectReview,
  VersionInfo,
} from "@kubernetes/client-node";
import { type Kube, kubeJson, type KubeRequest } from "./client.ts";

export type CallOptions = { signal?: AbortSignal; timeoutMs?: number };

/** The patch types by their content type: JSON merge patch, strategic merge patch, JSON patch. */
export const patchType = { merge: "application/merge-patch+json", strategic: "application/strategic-merge-patch+json", json: "application/json-patch+json" } as const;
export type PatchType = keyof typeof patchType;

const seg = encodeURIComponent;

function caller(kube: Kube, defaults: CallOptions) {
  return <T>(req: KubeRequest, o: CallOptions = {}): Promise<T> => {
    const signal = o.signal ?? defaults.signal;
    return kubeJson<T>(kube, { ...req, ...(signal && { signal }) }, o.timeoutMs ?? defaults.timeoutMs);
  };
}

export function coreV1(kube: Kube, defaults: CallOptions = {}) {
  const call = caller(kube, defaults);
  const node = (name: string) => `/api/v1/nodes/${seg(name)}`;
  return {
    readNode: (p: { name: string }, o?: CallOptions) => call<V1Node>({ method: "GET", path: node(p.name) }, o),
    listNode: (p: { labelSelector?: string }, o?: CallOptions) => call<V1NodeList>({ method: "GET", path: "/api/v1/nodes", query: { labelSelector: p.labelSelector } }, o),
    patchNode: (p: { name: string; body: unknown }, type: PatchType, o?: CallOptions) =>
      call<V1Node>({ method: "PATCH", path: node(p.name), body: p.body, contentType: patchType[type] }, o),
    patchNodeStatus: (p: { name: string; body: unknown }, type: PatchType, o?: CallOptions) =>
      call<V1Node>({ method: "PATCH", path: `${node(p.name)}/status`, body: p.body, contentType: patchType[type] }, o),
    readNamespacedSecret: (p: { name: string; namespace: string }, o?: CallOptions) =>
      call<V1Secret>({ method: "GET", path: `/api/v1/namespaces/${seg(p.namespace)}/secrets/${seg(p.name)}` }, o),
    listPodForAllNamespaces: (p: { fieldSelector?: string; labelSelector?: string }, o?: CallOptions) =>
      call<V1PodList>({ method: "GET", path: "/api/v1/pods", query: { fieldSelector: p.fieldSelector, labelSelector: p.labelSelector } }, o),
    deleteNamespacedPod: (p: { name: string; namespace: string }, o?: CallOptions) =>
      call<V1Pod>({ method: "DELETE", path: `/api/v1/namespaces/${seg(p.namespace)}/pods/${seg(p.name)}` }, o),
    createNamespacedEvent: (p: { namespace: string; body: CoreV1Event }, o?: CallOptions) =>
      call<CoreV1Event>({ method: "POST", path: `/api/v1/namespaces/${seg(p.namespace)}/events`, body: p.body }, o),
    patchNamespacedEvent: (p: { name: string; namespace: string; body: unknown }, type: PatchType, o?: CallOptions) =>
      call<CoreV1Event>({ method: "PATCH", path: `/api/v1/namespaces/${seg(p.namespace)}/events/${seg(p.name)}`, body: p.body, contentType: patchType[type] }, o),
  };
}

export function coordinationV1(kube: Kube, defaults: CallOptions = {}) {
  const call = caller(kube, defaults);
  const leases = (namespace: string) => `/apis/coordination.k8s.io/v1/namespaces/${seg(namespace)}/leases`;
  return {
    readNamespacedLease: (p: { name: string; namespace: string }, o?: CallOptions) => call<V1Lease>({ method: "GET", path: `${leases(p.namespace)}/${seg(p.name)}` }, o),
    listNamespacedLease: (p: { namespace: string; labelSelector?: string }, o?: CallOptions) =>
      call<V1LeaseList>({ method: "GET", path: leases(p.namespace), query: { labelSelector: p.labelSelector } }, o),
    createNamespacedLease: (p: { namespace: string; body: V1Lease }, o?: CallOptions) => call<V1Lease>({ method: "POST", path: leases(p.namespace), body: p.body }, o),
    replaceNamespacedLease: (p: { name: string; namespace: string; body: V1Lease }, o?: CallOptions) =>
      call<V1Lease>({ method: "PUT", path: `${leases(p.namespace)}/${seg(p.name)}`, body: p.body }, o),
  };
}

export function certificatesV1(kube: Kube, defaults: CallOptions = {}) {
  const call = caller(kube, defaults);
  const csrs = "/apis/certificates.k8s.io/v1/certificatesigningrequests";
  return {
    createCertificateSigningRequest: (p: { body: V1CertificateSigningRequest }, o?: CallOptions) => call<V1CertificateSigningRequest>({ method: "POST", path: csrs, body: p.body }, o),
    readCertificateSigningRequest: (p: { name: string }, o?: CallOptions) => call<V1CertificateSigningRequest>({ method: "GET", path: `${csrs}/${seg(p.name)}` }, o),
  };
}

export const serverVersion = (kube: Kube) => kubeJson<VersionInfo>(kube, { method: "GET", path: "/version" });

export const createSelfSubjectReview = (kube: Kube) =>
  kubeJson<V1SelfSubjectReview>(kube, {
    method: "POST",
    path: "/apis/authentication.k8s.io/v1/selfsubjectreviews",
    body: { apiVersion: "authentication.k8s.io/v1", kind: "SelfSubjectReview" },
  });
