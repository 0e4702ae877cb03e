// Gardener's in-place kubelet minor version update on a real worker: a node of a pool with the
// AutoInPlaceUpdate strategy runs the kubelet of the minor before the cluster's (test/cluster/k8s-prev,
// within the version skew policy), and the pool's OSC, rendered by Gardener's own code, moves it to the
// cluster's version: a new hyperkube image for /opt/bin/kubelet, spec.inPlaceUpdates.kubelet and the agent's
// kubernetesVersion change. machine-controller-manager's part (the drain, the ReadyForUpdate condition) is
// played by the test; what the drain leaves on the node (a DaemonSet's Pod, say) is a real Pod the real
// kubelet runs, which the agent deletes once the update is done, as gardener-node-agent does.
import { afterAll, beforeAll, expect, test } from "bun:test";
import { CoreV1Api, type V1Pod } from "@kubernetes/client-node";
import { nodeEvents, putOscSecret, readNode, waitApplied } from "../harness/agent.ts";
import { waitFor } from "../harness/exec.ts";
import { kubeVersion, prevKubeVersion, pushPrevHyperkube } from "../harness/kubelet-images.ts";
import { clearUpdateMarks, markReadyForUpdate, oscCondition, updateResultLabel, waitInPlacePending } from "../harness/machine-update.ts";
import { bringUpWorker, readyAgain, readyHeartbeat, runWebPod, startWorkerWorld, unitPids, type Worker, type WorkerWorld } from "../harness/worker.ts";
import { workerOsc } from "../harness/worker-osc.ts";

let world: WorkerWorld;
let w: Worker;
const [from, to] = [prevKubeVersion(), kubeVersion()];
const versionLabel = "worker.gardener.cloud/kubernetes-version";

beforeAll(async () => {
  world = await startWorkerWorld();
  const prev = await pushPrevHyperkube(world.registry);
  w = await bringUpWorker(world, "kubelet-minor", { osc: { updateStrategy: "AutoInPlaceUpdate", kubernetesVersion: from.slice(1), images: { ...world.images, ...prev } } });
}, 600_000);

afterAll(async () => {
  await w?.bare.stop();
  await world?.stop();
}, 60_000);

const core = () => world.cluster.admin().makeApiClient(CoreV1Api);
const kubeletBinary = () => w.bare.node.execOk(["/opt/bin/kubelet", "--version"]);
/** The Pod as the API server has it, or undefined once it is gone. */
const readPod = (name: string): Promise<V1Pod | undefined> => core().readNamespacedPod({ name, namespace: "default" }).catch((err: { code?: number }) => (err.code === 404 ? undefined : Promise.reject(err)));

test(`kubelet ${from} → ${to} in place: held until the node is drained, then the new kubelet restarted and Ready, the node's Pods deleted, update-result=successful, the checksum stamped`, async () => {
  const before = await readNode(w.bare);
  expect(before.status?.nodeInfo?.kubeletVersion).toBe(from);
  expect(before.metadata?.labels?.[versionLabel]).toBe(from.slice(1));
  expect(await kubeletBinary()).toBe(`Kubernetes ${from}\n`);
  // What the drain left on the node, and a Pod of another node the agent must leave alone.
  const left = await runWebPod(world, w, "left-by-drain");
  await core().createNamespacedPod({ namespace: "default", body: { metadata: { name: "elsewhere" }, spec: { nodeName: "another-node", containers: [{ name: "web", image: world.images.web }] } } });
  const pids = await unitPids(w);

  const rendered = await workerOsc({ ...w.input, kubernetesVersion: to.slice(1), images: world.images });
  expect(rendered.secretName).toBe(w.secretName); // an in-place pool keeps its Secret across versions
  const checksum = await putOscSecret(world.cluster, w.secretName, rendered.osc);
  await waitInPlacePending(w.bare, `minor version ${from.slice(1)} → ${to.slice(1)}`);
  expect((await readNode(w.bare)).metadata?.annotations?.["checksum/cloud-config-data"]).toBe(w.checksum);
  expect(await kubeletBinary()).toBe(`Kubernetes ${from}\n`);
  expect((await unitPids(w)).kubelet).toBe(pids.kubelet);
  expect((await readPod(left.metadata?.name as string))?.metadata?.deletionTimestamp).toBeUndefined();

  const heartbeat = await readyHeartbeat(w);
  const since = Date.now();
  await markReadyForUpdate(world.cluster, w.bare.name);
  const node = await waitApplied(w.bare, checksum, 120_000, 250);
  expect(node.metadata?.labels?.[updateResultLabel]).toBe("successful");
  // The Pods went before the node was reported updated: by now the Pod is being deleted, or gone.
  const leftNow = await readPod("left-by-drain");
  expect(leftNow === undefined || leftNow.metadata?.deletionTimestamp !== undefined).toBe(true);
  expect(await kubeletBinary()).toBe(`Kubernetes ${to}\n`);
  const after = await unitPids(w);
  expect(after.kubelet).not.toBe(pids.kubelet);
  expect(after.containerd).toBe(pids.containerd);
  expect(after.agent).not.toBe(pids.agent); // its configuration names the new version
  await readyAgain(w, heartbeat, since);
  const updated = await waitFor(`Node ${w.bare.name} reporting kubelet ${to} and the label ${versionLabel}=${to.slice(1)}`, async () => {
    const n = await readNode(w.bare);
    return n.status?.nodeInfo?.kubeletVersion === to && n.metadata?.labels?.[versionLabel] === to.slice(1) ? n : undefined;
  }, 60_000, 250);
  expect(updated.status?.conditions?.find((c) => c.type === "Ready")?.status).toBe("True");
  expect(await oscCondition(w.bare)).toMatchObject({ status: "True", reason: "Applied" });
  // The real kubelet stopped the deleted Pod's container and the Pod is gone; the other node's Pod is untouched.
  await waitFor("the Pod left by the drain gone", async () => ((await readPod("left-by-drain")) === undefined ? true : undefined), 60_000, 250);
  expect((await readPod("elsewhere"))?.metadata?.deletionTimestamp).toBeUndefined();
  // The agent restarted itself during the update (its configuration names the new version): the update was
  // finished by its next start, never reported as failed on the way.
  expect((await nodeEvents(w.bare)).filter((e) => e.reason === "InPlaceUpdateFailed").map((e) => e.message)).toEqual([]);
  await clearUpdateMarks(world.cluster, w.bare.name);
}, 240_000);
