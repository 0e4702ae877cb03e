// Static pods on a real kubelet (issue 20 item 4): a worker brought up by the compiled trellis with the OSC
// Gardener renders, kubelet given Gardener's staticPodPath (/etc/kubernetes/manifests, what a control-plane
// pool's OSC sets), and a static pod as gardenadm writes it (label static-pod=true, its manifest's hash in
// gardener.cloud/config.mirror). As gardener-node-agent (reconciler.go, ensureStaticPodsReconciledAndReady),
// the agent sets checksum/cloud-config-data only once kubelet's mirror pod of that manifest is Running and
// Ready; until then the condition says what it waits for. agent-gates.test.ts covers the decision's cases.
import { afterAll, beforeAll, expect, test } from "bun:test";
import { CoreV1Api } from "@kubernetes/client-node";
import { parse, stringify } from "yaml";
import { oscCondition } from "../harness/machine-update.ts";
import { putOscSecret, readNode, waitApplied } from "../harness/agent.ts";
import { waitFor } from "../harness/exec.ts";
import { bringUpWorker, startWorkerWorld, type Worker, type WorkerWorld } from "../harness/worker.ts";
import { workerOsc } from "../harness/worker-osc.ts";

let world: WorkerWorld;
let w: Worker;

beforeAll(async () => {
  world = await startWorkerWorld();
  w = await bringUpWorker(world, "static-pods");
}, 600_000);
afterAll(async () => {
  await w?.bare.stop();
  await world?.stop();
}, 60_000);

test("the checksum waits until kubelet runs the static pod's manifest and its mirror pod is Ready", async () => {
  const readyFile = "/var/lib/e2e-static/ready";
  const hash = "e2e-hash-1";
  const pod = {
    apiVersion: "v1",
    kind: "Pod",
    metadata: { name: "e2e-static", namespace: "kube-system", labels: { "static-pod": "true" }, annotations: { "gardener.cloud/config.mirror": hash } },
    spec: {
      containers: [
        {
          name: "web",
          image: world.images.web,
          // Ready once the test says so: a file on the node.
          readinessProbe: { exec: { command: ["/bin/busybox", "test", "-f", "/ready-dir/ready"] }, periodSeconds: 1 },
          volumeMounts: [{ name: "ready", mountPath: "/ready-dir" }],
        },
      ],
      volumes: [{ name: "ready", hostPath: { path: "/var/lib/e2e-static", type: "DirectoryOrCreate" } }],
    },
  };
  const rendered = parse((await workerOsc({ ...w.input, kubeletConfig: { staticPodPath: "/etc/kubernetes/manifests" } })).osc);
  rendered.spec.files.push({ path: "/etc/kubernetes/manifests/e2e-static.yaml", permissions: 0o640, content: { inline: { encoding: "", data: stringify(pod) } } });
  const checksum = await putOscSecret(world.cluster, w.secretName, stringify(rendered));

  const mirrorName = `e2e-static-${w.bare.name}`;
  const waiting = await waitFor(
    "the condition waiting for the mirror pod to be Ready",
    async () => {
      const c = await oscCondition(w.bare);
      return c?.reason === "WaitingForStaticPods" && c.message?.includes(checksum.slice(0, 12)) && c.message.includes(`kube-system/${mirrorName}: not Ready`) ? c : undefined;
    },
    180_000,
    250,
  );
  console.log(`[static-pods] waiting: ${waiting.message}`);
  expect((await readNode(w.bare)).metadata?.annotations?.["checksum/cloud-config-data"]).toBe(w.checksum);
  const mirror = await world.cluster.admin().makeApiClient(CoreV1Api).readNamespacedPod({ name: mirrorName, namespace: "kube-system" });
  expect(mirror.metadata?.labels?.["static-pod"]).toBe("true");
  expect(mirror.metadata?.annotations?.["gardener.cloud/config.mirror"]).toBe(hash);
  expect(mirror.metadata?.annotations?.["kubernetes.io/config.mirror"]).toBeDefined();

  await w.bare.node.execOk(["touch", readyFile]);
  await waitApplied(w.bare, checksum, 60_000, 250);
  await waitFor("the condition Applied", async () => (await oscCondition(w.bare))?.reason === "Applied", 10_000, 100);
}, 400_000);
