// Integration test of the node harness (not of trellis: kubelet is started directly): a real kubelet in a
// harness node booted with { kubelet: true } TLS-bootstraps against the real kube-apiserver (its CSR
// approved by kube-controller-manager's csrapproving controller, signed with the client CA), registers its
// Node, which becomes Ready as kubelet reports it, and runs a Pod bound to it by spec.nodeName from images
// pulled through a containerd mirror of the test registry; the container answers over the pod network,
// and its log comes back through kube-apiserver, which fetches it from kubelet.
// Everything the node reaches on the host goes through relays on the bridge (test/harness/bridge-relay.ts).
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { CertificatesV1Api, CoreV1Api } from "@kubernetes/client-node";
import { createBootstrapToken } from "../harness/bootstrap.ts";
import { type BridgeRelay, bridgeHostIp, startBridgeRelay } from "../harness/bridge-relay.ts";
import { type Cluster, startCluster } from "../harness/cluster.ts";
import { configureContainerd, grantKubeletBootstrapRbac, installKubeletFromImage, startKubelet, waitForNodeReady, waitForPodReady, writePodNetwork } from "../harness/kubelet.ts";
import { type KubeletImages, kubeVersion, pushKubeletImages, webPage, webPort } from "../harness/kubelet-images.ts";
import { bootNode, type Node } from "../harness/node.ts";
import { type Registry, startRegistry } from "../harness/registry.ts";

let cluster: Cluster;
let registry: Registry;
let images: KubeletImages;
let node: Node;
const relays: BridgeRelay[] = [];
const timings: Record<string, string> = {};
const since = (t0: number) => `${((performance.now() - t0) / 1000).toFixed(2)} s`;

beforeAll(async () => {
  [cluster, registry] = await Promise.all([startCluster({ servingIps: [bridgeHostIp] }), startRegistry()]);
  const t0 = performance.now();
  [images] = await Promise.all([pushKubeletImages(registry), grantKubeletBootstrapRbac(cluster)]);
  timings["images built and pushed"] = since(t0);
}, 600_000);

afterAll(async () => {
  // Relays first: their address lives on the bridge, which goes away with the last bridge node.
  for (const r of relays) await r.close();
  const t0 = performance.now();
  await node?.stop();
  timings["node with kubelet and a pod stopped"] = since(t0);
  await registry?.stop();
  await cluster?.stop();
  console.log(Object.entries(timings).map(([k, v]) => `  ${k}: ${v}`).join("\n"));
}, 60_000);

describe("node harness (integration, no trellis): a real kubelet in a kubelet node", () => {
  test("registers its Node through TLS bootstrapping, becomes Ready and runs a Pod whose container answers", async () => {
    const t0 = performance.now();
    node = await bootNode("kubelet", { net: "bridge", containerd: true, kubelet: true });
    timings["node booted"] = since(t0);
    const api = await startBridgeRelay(Number(new URL(cluster.server).port));
    const mirror = await startBridgeRelay(Number(registry.host.split(":")[1]));
    relays.push(api, mirror);

    await writePodNetwork(node);
    await configureContainerd(node, { images, mirror: mirror.address });
    const t1 = performance.now();
    await installKubeletFromImage(node, images);
    timings["kubelet pulled from the hyperkube image"] = since(t1);
    expect(await node.execOk(["/opt/bin/kubelet", "--version"])).toBe(`Kubernetes ${kubeVersion()}\n`);

    const token = await createBootstrapToken(cluster);
    const t2 = performance.now();
    await startKubelet(node, { server: `https://${api.address}`, cluster, token: token.token, labels: { "worker.gardener.cloud/kubernetes-version": kubeVersion().slice(1) } });
    const ready = await waitForNodeReady(cluster.admin(), node.name, 120_000);
    timings["kubelet started → Node Ready"] = since(t2);
    timings["boot → Node Ready"] = since(t0);

    // Registered by kubelet itself, with the client certificate its bootstrap token got it.
    expect(ready.status?.nodeInfo?.kubeletVersion).toBe(kubeVersion());
    expect(ready.status?.nodeInfo?.containerRuntimeVersion).toStartWith("containerd://");
    expect(ready.status?.addresses).toContainEqual({ type: "InternalIP", address: node.ip as string });
    const csrs = await cluster.admin().makeApiClient(CertificatesV1Api).listCertificateSigningRequest();
    const csr = csrs.items.find((c) => c.spec.username === token.user);
    expect(csr?.spec.signerName).toBe("kubernetes.io/kube-apiserver-client-kubelet");
    expect(csr?.status?.conditions?.find((c) => c.type === "Approved")?.reason).toBe("AutoApproved");
    expect(csr?.status?.certificate).toBeTruthy();

    const core = cluster.admin().makeApiClient(CoreV1Api);
    const t3 = performance.now();
    await core.createNamespacedPod({
      namespace: "default",
      body: {
        metadata: { name: "web" },
        spec: {
          nodeName: node.name,
          containers: [
            {
              name: "web",
              image: images.web,
              ports: [{ containerPort: webPort }],
              // kubelet probes the pod's address over the pod network before it calls the pod Ready.
              readinessProbe: { httpGet: { path: "/", port: webPort }, periodSeconds: 1 },
            },
          ],
        },
      },
    });
    const pod = await waitForPodReady(cluster.admin(), "default", "web", 120_000);
    timings["Pod created → Running and Ready"] = since(t3);

    const podIp = pod.status?.podIP as string;
    expect(podIp).toMatch(/^10\.244\.\d+\.\d+$/);
    expect(await node.execOk(["busybox", "wget", "-qO-", `http://${podIp}:${webPort}/`])).toBe(webPage);
    // The container's log, as kube-apiserver fetches it from kubelet at the node's address.
    expect(await core.readNamespacedPodLog({ namespace: "default", name: "web" })).toContain("response:200");
  }, 300_000);
});
