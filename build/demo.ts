// bun run demo — trellis turns a bare machine into a Ready node of a real cluster, end to end:
// a real control plane (etcd, kube-apiserver, kube-controller-manager) and registry, a bare systemd machine
// on its own network; install.sh pulls trellis, bootstrap gets the agent's certificate, the agent applies
// the OSC Gardener's own code renders for the pool, kubelet comes from its image, TLS-bootstraps and
// registers the Node, which becomes Ready; a Pod runs on it and answers. Then kubelet's configuration
// changes (only kubelet restarts) and an unrelated file changes (nothing restarts). Everything is stopped
// at the end.
import { nodeEvents, readNode } from "../test/harness/agent.ts";
import { applyToWorker, bringUpWorker, readyAgain, readyHeartbeat, runWebPod, startWorkerWorld, unitPids, type UnitPids, webAnswer, type Worker } from "../test/harness/worker.ts";

const t0 = performance.now();
const since = (t: number) => `${((performance.now() - t) / 1000).toFixed(2)} s`;
const say = (msg: string) => console.log(`[${since(t0).padStart(8)}] ${msg}`);
const table = (before: UnitPids, after: UnitPids) => {
  for (const [unit, key] of [["kubelet.service", "kubelet"], ["containerd.service", "containerd"], ["gardener-node-agent.service", "agent"]] as const) {
    console.log(`  ${unit.padEnd(28)} MainPID ${before[key]} → ${after[key]}  ${before[key] === after[key] ? "untouched" : "RESTARTED"}`);
  }
};

let t = performance.now();
const world = await startWorkerWorld();
say(`control plane (etcd, kube-apiserver ${world.cluster.server}, kube-controller-manager) and registry up, images pushed, in ${since(t)}`);
let w: Worker | undefined;
let ok = false;
try {
  w = await bringUpWorker(world, "demo");
  say(`bare machine ${w.bare.name}: install.sh → agent's CSR ${((w.csrSeenMs - w.startedMs) / 1000).toFixed(2)} s → Node Ready ${((w.readyMs - w.startedMs) / 1000).toFixed(2)} s after install.sh started`);
  const node = await readNode(w.bare);
  const ready = node.status?.conditions?.find((c) => c.type === "Ready");
  say(`Node ${node.metadata?.name}: Ready=${ready?.status} (${ready?.reason}), kubelet ${node.status?.nodeInfo?.kubeletVersion}, ${node.status?.nodeInfo?.containerRuntimeVersion}, OSC Secret ${w.secretName}`);

  t = performance.now();
  const pod = await runWebPod(world, w);
  say(`Pod web Running on ${pod.spec?.nodeName} (${pod.status?.podIP}) ${since(t)} after it was created; it says: ${(await webAnswer(w, pod)).trim()}`);

  let before = await unitPids(w);
  const heartbeat = await readyHeartbeat(w);
  t = performance.now();
  await applyToWorker(world, w, { maxPods: 50 });
  say(`kubelet's configuration changed (maxPods 50): applied in ${since(t)}`);
  await readyAgain(w, heartbeat, Date.now() - (performance.now() - t));
  say(`Node Ready again, as the restarted kubelet reports it, ${since(t)} after the change`);
  let after = await unitPids(w);
  table(before, after);
  const kubeletOnly = after.kubelet !== before.kubelet && after.containerd === before.containerd && after.agent === before.agent;

  before = after;
  t = performance.now();
  await applyToWorker(world, w, { maxPods: 50, extraFile: "an unrelated file\n" });
  say(`an unrelated file changed: applied in ${since(t)}`);
  after = await unitPids(w);
  table(before, after);
  const nothing = JSON.stringify(after) === JSON.stringify(before);

  for (const e of (await nodeEvents(w.bare)).filter((x) => x.reason === "OSCApplied").sort((a, b) => String(a.lastTimestamp).localeCompare(String(b.lastTimestamp)))) {
    console.log(`  event ${e.type} ${e.reason}: ${e.message}`);
  }
  const still = await webAnswer(w, pod);
  say(`the Pod still answers: ${still.trim()}`);
  ok = kubeletOnly && nothing;
  say(ok ? "kubelet's change restarted kubelet only; the unrelated file restarted nothing" : "unexpected restarts (see the table above)");
} finally {
  await w?.bare.stop();
  await world.stop();
}
if (!ok) process.exitCode = 1;
