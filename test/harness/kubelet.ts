// A real kubelet in a harness node booted with { net: "bridge", containerd: true, kubelet: true }: the
// cluster's RBAC for kubelet TLS bootstrapping, a CNI network, containerd configured for the CRI with a
// mirror of the test registry, kubelet from the hyperkube image, its files (test/harness/kubelet-config.ts)
// and unit; then the Node it registers and the pods it runs, watched until they reach a state.
// docs/testing.md ("A real kubelet in a node") says what each adaptation is for.
import { type KubeConfig, RbacAuthorizationV1Api, type V1Node, type V1Pod } from "@kubernetes/client-node";
import { upstream } from "./bare-node.ts";
import type { Cluster } from "./cluster.ts";
import {
  bootstrapKubeconfig,
  cniConfigPath,
  cniConflist,
  containerdConfig,
  kubeletConfiguration,
  kubeletPaths,
  kubeletUnit,
  mirrorHostsToml,
} from "./kubelet-config.ts";
import type { KubeletImages } from "./kubelet-images.ts";
import type { Node } from "./node.ts";
import { watchUntil } from "./watch.ts";

const granted = new WeakMap<Cluster, Promise<void>>();

/**
 * The ClusterRoleBindings every cluster has for kubelet TLS bootstrapping (kubeadm and Gardener create
 * the same), once per cluster: bootstrap tokens (group system:bootstrappers) may create CSRs, and
 * kube-controller-manager's csrapproving controller approves a kubelet's client CSR because its
 * requester may create `certificatesigningrequests/nodeclient` (a new kubelet) or `selfnodeclient` (a
 * kubelet renewing its own certificate, group system:nodes). kube-controller-manager then signs it with
 * the client CA.
 */
export function grantKubeletBootstrapRbac(cluster: Cluster): Promise<void> {
  const done = granted.get(cluster);
  if (done) return done;
  const grant = (async () => {
    const rbac = cluster.admin().makeApiClient(RbacAuthorizationV1Api);
    const ref = (kind: string, name: string) => ({ apiGroup: "rbac.authorization.k8s.io", kind, name });
    const bindings = [
      ["trellis:kubelet-bootstrap", "system:node-bootstrapper", "system:bootstrappers"],
      ["trellis:node-autoapprove-bootstrap", "system:certificates.k8s.io:certificatesigningrequests:nodeclient", "system:bootstrappers"],
      ["trellis:node-autoapprove-certificate-rotation", "system:certificates.k8s.io:certificatesigningrequests:selfnodeclient", "system:nodes"],
    ] as const;
    for (const [name, role, group] of bindings) {
      await rbac.createClusterRoleBinding({ body: { metadata: { name }, roleRef: ref("ClusterRole", role), subjects: [ref("Group", group)] } });
    }
  })();
  granted.set(cluster, grant);
  return grant;
}

/** The node's pod subnet: one /24 per bridge address, so that nodes never hand out the same pod IPs. */
function podSubnet(node: Node): string {
  const host = node.ip?.split(".")[3];
  if (!host) throw new Error(`node ${node.name} has no bridge address: a kubelet node needs net "bridge"`);
  return `10.244.${host}.0/24`;
}

/**
 * Writes the node's pod network (containerd reads it when it changes). In Gardener a network extension's
 * DaemonSet installs the CNI; a harness node gets it from the test.
 */
export async function writePodNetwork(node: Node): Promise<void> {
  await node.writeFile(cniConfigPath, cniConflist(podSubnet(node)));
}

/**
 * Configures the node's containerd for the CRI (sandbox image, runc with systemd cgroups, the CNI directories, the
 * registry mirror `mirror` ("host:port" the node reaches) for `upstream`) and restarts it.
 */
export async function configureContainerd(node: Node, o: { images: KubeletImages; mirror: string }): Promise<void> {
  await node.writeFile(`/etc/containerd/certs.d/${upstream}/hosts.toml`, mirrorHostsToml(upstream, o.mirror));
  await node.writeFile("/etc/containerd/config.toml", containerdConfig({ sandboxImage: o.images.pause }));
  await node.execOk(["systemctl", "restart", "containerd.service"]);
}

/**
 * Installs kubelet from the hyperkube image as the node would get it: pulled by containerd through the
 * mirror (content only, nothing unpacked), /kubelet taken from its layer.
 */
export async function installKubeletFromImage(node: Node, images: KubeletImages): Promise<void> {
  await node.execOk(["ctr", "--namespace", "trellis", "content", "fetch", "--hosts-dir", "/etc/containerd/certs.d", images.hyperkube], { timeoutMs: 120_000 });
  const dir = kubeletPaths.binary.slice(0, kubeletPaths.binary.lastIndexOf("/"));
  await node.execOk([
    "sh", "-c",
    `set -e; mkdir -p ${dir}; ctr --namespace trellis content get ${images.hyperkubeLayer} | tar -xzO kubelet > ${kubeletPaths.binary}.tmp; chmod 755 ${kubeletPaths.binary}.tmp; mv ${kubeletPaths.binary}.tmp ${kubeletPaths.binary}`,
  ]);
}

/**
 * Writes kubelet's unit, configuration, client CA and bootstrap kubeconfig (`server` as the node reaches
 * the API server, a bootstrap token) and starts kubelet.
 */
export async function startKubelet(node: Node, o: { server: string; cluster: Cluster; token: string; labels?: Record<string, string> }): Promise<void> {
  await node.writeFile(kubeletPaths.config, kubeletConfiguration(), 0o600);
  await node.writeFile(kubeletPaths.clientCa, await Bun.file(o.cluster.clientCaFile).text());
  await node.writeFile(kubeletPaths.bootstrapKubeconfig, bootstrapKubeconfig({ server: o.server, caPem: o.cluster.caPem, token: o.token }), 0o600);
  await node.writeFile(kubeletPaths.unit, kubeletUnit({ labels: o.labels }));
  await node.execOk(["systemctl", "daemon-reload"]);
  await node.execOk(["systemctl", "enable", "--now", "kubelet.service"]);
}

const condition = (obj: V1Node | V1Pod, type: string) => obj.status?.conditions?.find((c) => c.type === type);

/** Waits for Node `name` to be Ready (as kubelet reports it); returns the Node. */
export function waitForNodeReady(kc: KubeConfig, name: string, timeoutMs: number): Promise<V1Node> {
  return watchUntil<V1Node, V1Node>(kc, `Node ${name} Ready`, "/api/v1/nodes", name, (n) => (condition(n, "Ready")?.status === "True" ? n : undefined), {
    timeoutMs,
    describe: (n) => JSON.stringify(n.status?.conditions?.map((c) => `${c.type}=${c.status} ${c.reason ?? ""}: ${c.message ?? ""}`)),
  });
}

/** Waits for the Pod to be Running and Ready (its containers started and their readiness probes pass). */
export function waitForPodReady(kc: KubeConfig, namespace: string, name: string, timeoutMs: number): Promise<V1Pod> {
  return watchUntil<V1Pod, V1Pod>(
    kc,
    `Pod ${namespace}/${name} Running and Ready`,
    `/api/v1/namespaces/${namespace}/pods`,
    name,
    (p) => (p.status?.phase === "Running" && condition(p, "Ready")?.status === "True" ? p : undefined),
    { timeoutMs, describe: (p) => JSON.stringify({ phase: p.status?.phase, conditions: p.status?.conditions, containers: p.status?.containerStatuses?.map((c) => c.state) }) },
  );
}
