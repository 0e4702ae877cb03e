// The pool a scale run stands up in a real API server, without kubelets: Node objects shaped as kubelet
// registers them (status, conditions, addresses, capacity, nodeInfo, images: ~12 KB each as served), the
// two heartbeat Leases every node renews every 10 s (kubelet's in kube-node-lease, the node agent's in
// kube-system) and a load generator that renews them, and identities for the simulated agents.
//
// Identities: one client certificate (the admin's) with a user impersonated per node. A certificate per
// node would cost thousands of openssl runs; impersonation still gives every agent its own user, so API
// Priority and Fairness puts each node in its own flow (as distinct agents are), instead of exempting the
// whole pool as system:masters or queueing it as one flow.
import { readFileSync } from "node:fs";
import type { V1Lease } from "@kubernetes/client-node";
import { nodeAgentUserPrefix } from "../../../src/kube/csr.ts";
import type { Kube } from "../../../src/kube/client.ts";
import { microTime } from "../../../src/kube/micro-time.ts";
import type { Cluster } from "../../harness/cluster.ts";
import { testKube } from "../../harness/test-kube.ts";

export type Admin = { server: string; tls: { ca: string; cert: string; key: string } };

export function adminOf(cluster: Cluster): Admin {
  return { server: cluster.server, tls: { ca: cluster.caPem, cert: readFileSync(`${cluster.dir}/pki/admin.crt`, "utf8"), key: readFileSync(`${cluster.dir}/pki/admin.key`, "utf8") } };
}

export const agentUser = (node: string) => `${nodeAgentUserPrefix}${node}`;

/** A request of the bench's own (setup, heartbeats, metrics), as `user` when given. */
export async function call(admin: Admin, method: string, path: string, body?: unknown, user?: string): Promise<{ status: number; json: unknown; text: string }> {
  const res = await fetch(admin.server + path, {
    method,
    tls: admin.tls,
    headers: { "content-type": "application/json", accept: "application/json", ...(user ? { "impersonate-user": user } : {}) },
    ...(body === undefined ? {} : { body: JSON.stringify(body) }),
  });
  const text = await res.text();
  let json: unknown;
  try {
    json = JSON.parse(text);
  } catch {
    json = undefined;
  }
  return { status: res.status, json, text };
}

export async function callOk(admin: Admin, method: string, path: string, body?: unknown, user?: string): Promise<unknown> {
  const r = await call(admin, method, path, body, user);
  if (r.status >= 300) throw new Error(`${method} ${path}: HTTP ${r.status} ${r.text.slice(0, 300)}`);
  return r.json;
}

/** A Kube for the protocol code acting as `user`. */
export function impersonated(admin: Admin, user: string): Kube {
  return testKube({ server: admin.server, caPem: admin.tls.ca, cert: { certPem: admin.tls.cert, keyPem: admin.tls.key }, impersonate: user });
}

/** What the impersonated users may do: Leases in the two namespaces the pool's Leases live in. */
export async function grantLeases(admin: Admin): Promise<void> {
  for (const namespace of ["kube-system", "kube-node-lease"]) {
    const name = "scale-bench-leases";
    await callOk(admin, "POST", `/apis/rbac.authorization.k8s.io/v1/namespaces/${namespace}/roles`, {
      metadata: { name },
      rules: [{ apiGroups: ["coordination.k8s.io"], resources: ["leases"], verbs: ["get", "list", "watch", "create", "update"] }],
    });
    await callOk(admin, "POST", `/apis/rbac.authorization.k8s.io/v1/namespaces/${namespace}/rolebindings`, {
      metadata: { name },
      roleRef: { apiGroup: "rbac.authorization.k8s.io", kind: "Role", name },
      subjects: [{ kind: "Group", apiGroup: "rbac.authorization.k8s.io", name: "system:authenticated" }],
    });
  }
}

export const nodeName = (i: number) => `shoot--scale--worker-z${(i % 3) + 1}-${i.toString(16).padStart(5, "0")}`;

/** Hex digits that look like a digest and differ per node and purpose. */
function hex(seed: string, length: number): string {
  let out = "";
  for (let i = 0; out.length < length; i++) out += new Bun.CryptoHasher("sha256").update(`${seed}/${i}`).digest("hex");
  return out.slice(0, length);
}

const images: [string, string, number][] = [
  ["europe-docker.pkg.dev/gardener-project/releases/gardener/node-agent", "v1.150.0", 61_234_112],
  ["registry.k8s.io/kube-proxy", "v1.35.4", 30_712_832],
  ["quay.io/calico/node", "v3.30.2", 156_301_312],
  ["quay.io/calico/cni", "v3.30.2", 94_117_888],
  ["quay.io/calico/typha", "v3.30.2", 31_485_952],
  ["registry.k8s.io/coredns/coredns", "v1.12.1", 22_384_640],
  ["registry.k8s.io/dns/k8s-dns-node-cache", "1.26.4", 34_660_352],
  ["europe-docker.pkg.dev/gardener-project/releases/gardener/apiserver-proxy", "v0.19.0", 14_352_384],
  ["registry.k8s.io/sig-storage/csi-node-driver-registrar", "v2.14.0", 11_149_312],
  ["registry.k8s.io/sig-storage/livenessprobe", "v2.16.0", 10_813_440],
  ["registry.k8s.io/provider-aws/aws-ebs-csi-driver", "v1.45.0", 48_431_104],
  ["europe-docker.pkg.dev/gardener-project/releases/gardener/network-problem-detector", "v0.27.0", 25_378_816],
  ["registry.k8s.io/node-problem-detector/node-problem-detector", "v0.8.21", 46_727_168],
  ["quay.io/prometheus/node-exporter", "v1.9.1", 11_943_936],
  ["europe-docker.pkg.dev/gardener-project/releases/3rd/fluent-bit", "4.0.3", 35_815_424],
  ["europe-docker.pkg.dev/gardener-project/releases/gardener/egress-filter-refresher", "v0.36.0", 9_191_424],
  ["registry.k8s.io/pause", "3.10", 320_368],
  ["docker.io/library/nginx", "1.29.0", 72_187_904],
  ["ghcr.io/example/shop/checkout-service", "2025.11.3", 203_145_216],
  ["ghcr.io/example/shop/recommendations", "2025.11.1", 318_767_104],
  ["ghcr.io/example/shop/frontend", "2025.11.7", 98_566_144],
  ["ghcr.io/example/shop/cart-service", "2025.10.12", 121_634_816],
];

/** A Node as kubelet registers it and keeps its status (the conditions as kubelet words them). */
export function nodeBody(i: number, secret: string): unknown {
  const name = nodeName(i);
  const zone = `eu-west-1${"abc"[i % 3]}`;
  const ip = `10.250.${(i >> 8) & 255}.${i & 255}`;
  const instance = `i-0${hex(`${name}/instance`, 16)}`;
  const at = new Date(Date.now() - 86_400_000).toISOString().replace(/\.\d+Z$/, "Z");
  const now = new Date().toISOString().replace(/\.\d+Z$/, "Z");
  const condition = (type: string, status: string, reason: string, message: string) => ({ type, status, lastHeartbeatTime: now, lastTransitionTime: at, reason, message });
  const resources = { cpu: "8", "ephemeral-storage": "52416492Ki", "hugepages-1Gi": "0", "hugepages-2Mi": "0", memory: "32408852Ki", pods: "110", "attachable-volumes-aws-ebs": "25" };
  return {
    apiVersion: "v1",
    kind: "Node",
    metadata: {
      name,
      labels: {
        "beta.kubernetes.io/arch": "amd64",
        "beta.kubernetes.io/instance-type": "m5.2xlarge",
        "beta.kubernetes.io/os": "linux",
        "failure-domain.beta.kubernetes.io/region": "eu-west-1",
        "failure-domain.beta.kubernetes.io/zone": zone,
        "kubernetes.io/arch": "amd64",
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "networking.gardener.cloud/node-local-dns-enabled": "true",
        "node.kubernetes.io/instance-type": "m5.2xlarge",
        "node.kubernetes.io/role": "node",
        "node-role.kubernetes.io/worker": "",
        "topology.ebs.csi.aws.com/zone": zone,
        "topology.kubernetes.io/region": "eu-west-1",
        "topology.kubernetes.io/zone": zone,
        "worker.garden.sapcloud.io/group": "worker",
        "worker.gardener.cloud/cri-name": "containerd",
        "worker.gardener.cloud/gardener-node-agent-secret-name": secret,
        "worker.gardener.cloud/kubernetes-version": "1.35.4",
        "worker.gardener.cloud/pool": "worker",
        "worker.gardener.cloud/system-components": "true",
      },
      annotations: {
        "checksum/cloud-config-data": hex("osc", 64),
        "csi.volume.kubernetes.io/nodeid": JSON.stringify({ "ebs.csi.aws.com": instance }),
        "node.alpha.kubernetes.io/ttl": "0",
        "node.machine.sapcloud.io/last-applied-anno-labels-taints": JSON.stringify({ metadata: { labels: { "node.kubernetes.io/role": "node", "worker.gardener.cloud/pool": "worker" } } }),
        "projectcalico.org/IPv4Address": `${ip}/19`,
        "projectcalico.org/IPv4IPIPTunnelAddr": `100.96.${i % 256}.1`,
        "volumes.kubernetes.io/controller-managed-attach-detach": "true",
      },
    },
    spec: { podCIDR: `100.96.${i % 256}.0/24`, podCIDRs: [`100.96.${i % 256}.0/24`], providerID: `aws:///${zone}/${instance}` },
    status: {
      capacity: resources,
      allocatable: { ...resources, cpu: "7910m", "ephemeral-storage": "50977832941", memory: "30213652Ki" },
      conditions: [
        condition("NetworkUnavailable", "False", "CalicoIsUp", "Calico is running on this node"),
        condition("MemoryPressure", "False", "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
        condition("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
        condition("PIDPressure", "False", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
        condition("Ready", "True", "KubeletReady", "kubelet is posting ready status"),
        // node-problem-detector's, which Gardener deploys on every worker.
        condition("KernelDeadlock", "False", "KernelHasNoDeadlock", "kernel has no deadlock"),
        condition("ReadonlyFilesystem", "False", "FilesystemIsNotReadOnly", "Filesystem is not read-only"),
        condition("FrequentKubeletRestart", "False", "NoFrequentKubeletRestart", "kubelet is functioning properly"),
        condition("FrequentContainerdRestart", "False", "NoFrequentContainerdRestart", "containerd is functioning properly"),
        condition("FrequentUnregisterNetDevice", "False", "NoFrequentUnregisterNetDevice", "node is functioning properly"),
      ],
      addresses: [
        { type: "InternalIP", address: ip },
        { type: "InternalDNS", address: `ip-${ip.replaceAll(".", "-")}.eu-west-1.compute.internal` },
        { type: "Hostname", address: `ip-${ip.replaceAll(".", "-")}.eu-west-1.compute.internal` },
      ],
      daemonEndpoints: { kubeletEndpoint: { Port: 10250 } },
      nodeInfo: {
        machineID: hex(`${name}/machine`, 32),
        systemUUID: `ec2${hex(`${name}/uuid`, 5)}-${hex(`${name}/uuid2`, 4)}-${hex(`${name}/uuid3`, 4)}-${hex(`${name}/uuid4`, 4)}-${hex(`${name}/uuid5`, 12)}`,
        bootID: `${hex(`${name}/boot`, 8)}-${hex(`${name}/boot2`, 4)}-${hex(`${name}/boot3`, 4)}-${hex(`${name}/boot4`, 4)}-${hex(`${name}/boot5`, 12)}`,
        kernelVersion: "6.12.40-cloud-amd64",
        osImage: "Garden Linux 1877.3",
        containerRuntimeVersion: "containerd://2.0.5",
        kubeletVersion: "v1.35.4",
        operatingSystem: "linux",
        architecture: "amd64",
      },
      images: images.map(([repo, tag, size]) => ({ names: [`${repo}@sha256:${hex(`${repo}:${tag}`, 64)}`, `${repo}:${tag}`], sizeBytes: size })),
    },
  };
}

export type Heartbeat = { namespace: string; name: string; user: string };

/** kubelet's Lease (kube-node-lease/<node>) and the node agent's (kube-system/gardener-node-agent-<node>), as each creates it. */
export function heartbeatLeases(node: string, nodeUid: string): { beat: Heartbeat; body: V1Lease }[] {
  const owner = { apiVersion: "v1", kind: "Node", name: node, uid: nodeUid };
  const spec = (holder: string) => ({ holderIdentity: holder, leaseDurationSeconds: 40, renewTime: microTime(new Date()) });
  return [
    { beat: { namespace: "kube-node-lease", name: node, user: `system:node:${node}` }, body: { metadata: { name: node, namespace: "kube-node-lease", ownerReferences: [owner] }, spec: spec(node) } },
    {
      beat: { namespace: "kube-system", name: `gardener-node-agent-${node}`, user: agentUser(node) },
      body: { metadata: { name: `gardener-node-agent-${node}`, namespace: "kube-system", ownerReferences: [owner] }, spec: spec(`gardener-node-agent-${node}`) },
    },
  ];
}

const leasePath = (namespace: string, name?: string) => `/apis/coordination.k8s.io/v1/namespaces/${namespace}/leases${name ? `/${name}` : ""}`;

export async function createLease(admin: Admin, h: Heartbeat, body: V1Lease): Promise<void> {
  await callOk(admin, "POST", leasePath(h.namespace), body);
}

/**
 * Renews every heartbeat Lease once per `periodMs`, spread evenly over the period, each with one PUT of
 * the Lease as last written (kubelet and the node agent's lease controller keep theirs and do not read
 * it first). Resolves on stop() with what was sent.
 */
export function startHeartbeats(admin: Admin, beats: Heartbeat[], periodMs = 10_000): { measure(): void; stop(): Promise<{ sent: number; failed: number; lateMs: number; answerBytes: number; seconds: number }> } {
  const last = new Map<string, unknown>();
  let stopped = false;
  let sent = 0;
  let failed = 0;
  let lateMs = 0;
  let answerBytes = 0;
  let from = performance.now();
  const inflight = new Set<Promise<void>>();
  const renew = async (h: Heartbeat) => {
    const key = `${h.namespace}/${h.name}`;
    const current = (last.get(key) ?? (await callOk(admin, "GET", leasePath(h.namespace, h.name), undefined, h.user))) as V1Lease;
    const r = await call(admin, "PUT", leasePath(h.namespace, h.name), { ...current, spec: { ...current.spec, renewTime: microTime(new Date()) } }, h.user);
    sent++;
    answerBytes += r.text.length;
    if (r.status === 200) last.set(key, r.json);
    else {
      failed++;
      last.delete(key);
    }
  };
  const loop = (async () => {
    const start = performance.now();
    for (let i = 0; !stopped; i++) {
      const due = start + (i * periodMs) / beats.length;
      const wait = due - performance.now();
      if (wait > 0) await Bun.sleep(wait);
      else lateMs = Math.max(lateMs, -wait);
      const h = beats[i % beats.length] as Heartbeat;
      const p = renew(h).catch(() => void failed++);
      inflight.add(p);
      void p.finally(() => inflight.delete(p));
    }
  })();
  return {
    /** Counts from now on (after a warm-up). */
    measure() {
      sent = failed = answerBytes = lateMs = 0;
      from = performance.now();
    },
    async stop() {
      const seconds = (performance.now() - from) / 1000;
      stopped = true;
      await loop;
      await Promise.all(inflight);
      return { sent, failed, lateMs: Math.round(lateMs), answerBytes, seconds };
    },
  };
}

/** Runs `fn` over `items`, `width` at a time. */
export async function inBatches<T, R>(items: readonly T[], width: number, fn: (item: T, index: number) => Promise<R>): Promise<R[]> {
  const out: R[] = new Array(items.length);
  let next = 0;
  const worker = async () => {
    while (next < items.length) {
      const i = next++;
      out[i] = await fn(items[i] as T, i);
    }
  };
  await Promise.all(Array.from({ length: Math.min(width, items.length) }, worker));
  return out;
}
