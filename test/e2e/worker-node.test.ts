// A bare machine becomes a Ready node of the cluster and runs a Pod, with nothing faked: install.sh
// pulls trellis through the containerd mirror, bootstrap gets the agent's certificate, the agent applies
// the OperatingSystemConfig Gardener's own code renders for a worker pool (test/peer/osc-render), which
// brings kubelet from its hyperkube image; kubelet TLS-bootstraps (kube-controller-manager approves and
// signs), registers its Node, which becomes Ready as kubelet reports it, and runs a Pod bound to it.
// Then the node's life: a kubelet configuration change restarts kubelet only; an unrelated file restarts
// nothing; kubelet killed, hung, containerd stopped, a restart requested, readiness flapping.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { CoreV1Api, PatchStrategy, setHeaderOptions } from "@kubernetes/client-node";
import { nodeEvents, readNode, unitProperty } from "../harness/agent.ts";
import { waitFor } from "../harness/exec.ts";
import { cniConfigPath } from "../harness/kubelet-config.ts";
import { webPage } from "../harness/kubelet-images.ts";
import { applyToWorker, bringUpWorker, readyAgain, readyHeartbeat, runWebPod, startWorkerWorld, unitPids, webAnswer, type Worker, type WorkerWorld } from "../harness/worker.ts";

let world: WorkerWorld;
let w: Worker;
const timings: Record<string, string> = {};
const seconds = (ms: number) => `${(ms / 1000).toFixed(2)} s`;

beforeAll(async () => {
  world = await startWorkerWorld();
}, 600_000);

afterAll(async () => {
  await w?.bare.stop();
  await world?.stop();
  console.log(Object.entries(timings).map(([k, v]) => `  ${k}: ${v}`).join("\n"));
}, 60_000);

const show = (unit: string, prop: string) => unitProperty(w.bare.node, unit, prop);
const pids = () => unitPids(w);

describe("a bare machine becomes a Ready node that runs a Pod", () => {
  test("install.sh → bootstrap → Gardener's OSC applied → kubelet TLS-bootstraps → Node Ready → Pod answers", async () => {
    w = await bringUpWorker(world, "worker");
    timings["install.sh start → agent's CSR created"] = seconds(w.csrSeenMs - w.startedMs);
    timings["install.sh start → Node Ready"] = seconds(w.readyMs - w.startedMs);

    // Registered by the real kubelet, with the certificate its bootstrap got it.
    const ready = await readNode(w.bare);
    expect(ready.status?.nodeInfo?.kubeletVersion).toBe("v1.35.4");
    expect(ready.status?.addresses).toContainEqual({ type: "InternalIP", address: w.bare.node.ip as string });
    expect(ready.metadata?.labels).toMatchObject({ "worker.gardener.cloud/kubernetes-version": "1.35.4", "worker.gardener.cloud/gardener-node-agent-secret-name": w.secretName });

    const t0 = performance.now();
    const pod = await runWebPod(world, w);
    timings["Pod created → Running and Ready"] = seconds(performance.now() - t0);
    timings["install.sh start → Pod Ready"] = seconds(performance.now() - w.startedMs);
    expect(await webAnswer(w, pod)).toBe(webPage);

    // The first apply is reported once kubelet has registered the Node, though the agent restarted
    // itself at its end (Gardener's OSC changes the agent's configuration).
    const first = await waitFor("the first apply's OSCApplied event", async () => (await nodeEvents(w.bare)).find((e) => e.reason === "OSCApplied" && e.message?.includes(w.checksum.slice(0, 12))), 30_000, 250);
    expect(first.message).toMatch(/: [1-9]\d* step\(s\), restarted .*kubelet\.service.*gardener-node-agent\.service$/);

    // Every unit of Gardener's OSC runs as it should, once systemd has no job left (a unit that fails
    // does so within its restart limit), and trellis's unit health reports it so.
    await waitFor("systemd idle: no job, no unit activating or deactivating (auto-restart included)", async () => {
      const busy = await w.bare.node.execOk(["sh", "-c", "systemctl list-jobs --no-legend; systemctl list-units --all --no-legend --plain --state=activating,deactivating"]);
      return busy.trim() === "" ? true : undefined;
    }, 60_000, 500);
    expect((await w.bare.node.execOk(["systemctl", "--failed", "--plain", "--no-legend"])).trim()).toBe("");
    const units = await waitFor("SystemdUnitsReady", async () => (await readNode(w.bare)).status?.conditions?.find((c) => c.type === "SystemdUnitsReady"), 120_000, 500);
    expect(units).toMatchObject({ status: "True" });

    // kubelet has joined with its own certificate: the bootstrap credentials are gone.
    await waitFor("the bootstrap credentials removed", async () => (await w.bare.node.exec(["test", "-e", "/var/lib/kubelet/kubeconfig-bootstrap"])).code !== 0, 30_000, 200);
    expect((await w.bare.node.exec(["test", "-e", "/var/lib/gardener-node-agent/credentials/bootstrap-token"])).code).not.toBe(0);
  }, 600_000);

  test("a change of kubelet's configuration restarts kubelet only, and the node is Ready again", async () => {
    const before = await pids();
    const heartbeat = await readyHeartbeat(w);
    const since = new Date();
    await applyToWorker(world, w, { maxPods: 50 });
    expect(await w.bare.node.readFile("/var/lib/kubelet/config/kubelet")).toContain("maxPods: 50");
    const after = await pids();
    expect(after.kubelet).not.toBe(before.kubelet);
    expect({ ...after, kubelet: 0 }).toEqual({ ...before, kubelet: 0 });
    await readyAgain(w, heartbeat, since.getTime());
    await podAnswers();
  }, 180_000);

  test("a file change unrelated to kubelet restarts nothing", async () => {
    const before = await pids();
    await applyToWorker(world, w, { maxPods: 50, extraFile: "unrelated v1\n" });
    expect(await w.bare.node.readFile("/etc/e2e/unrelated")).toBe("unrelated v1\n");
    expect(await pids()).toEqual(before);
  }, 120_000);
});

describe("liveness against the real kubelet and containerd", () => {
  test("kubelet killed (-9): back, and the node Ready again", async () => {
    const before = await pids();
    const heartbeat = await readyHeartbeat(w);
    const since = new Date();
    await w.bare.node.execOk(["kill", "-9", String(before.kubelet)]);
    await waitFor("a new kubelet", async () => ((await pids()).kubelet !== before.kubelet ? true : undefined), 60_000, 200);
    await readyAgain(w, heartbeat, since.getTime());
    await podAnswers();
  }, 120_000);

  test("kubelet hung (SIGSTOP): trellis restarts it after its threshold, with a Warning, and the node is Ready again", async () => {
    const before = await pids();
    const heartbeat = await readyHeartbeat(w);
    const since = new Date();
    await w.bare.node.execOk(["kill", "-STOP", String(before.kubelet)]);
    const warning = await warningSince("KubeletUnhealthy", since, 180_000);
    expect(warning).toContain("Restarted kubelet.service");
    expect((await pids()).kubelet).not.toBe(before.kubelet);
    await readyAgain(w, heartbeat, since.getTime());
    await podAnswers();
  }, 300_000);

  test("containerd stopped: trellis starts it again at once (drift), and the Pod's container kept running throughout", async () => {
    const before = await pids();
    const web = await containerPid();
    const since = new Date();
    await w.bare.node.execOk(["systemctl", "stop", "containerd.service"]);
    // Before the health check's minute is up: a stopped unit the OSC runs is drift (a hung one is the health check's).
    const warning = await warningSince("DriftRepaired", since, 20_000);
    expect(warning).toBe("containerd.service: stopped (dead), the OSC wants it running; repaired");
    expect(await show("containerd.service", "ActiveState")).toBe("active");
    expect((await pids()).containerd).not.toBe(before.containerd);
    expect(await containerPid()).toBe(web);
    await podAnswers();
  }, 300_000);

  test("the restart-systemd-services annotation restarts the real kubelet, and the annotation goes", async () => {
    const before = await pids();
    const heartbeat = await readyHeartbeat(w);
    const since = new Date();
    await world.cluster.admin().makeApiClient(CoreV1Api).patchNode(
      { name: w.bare.name, body: { metadata: { annotations: { "worker.gardener.cloud/restart-systemd-services": "kubelet" } } } },
      setHeaderOptions("Content-Type", PatchStrategy.MergePatch),
    );
    await waitFor("the annotation removed", async () => ((await readNode(w.bare)).metadata?.annotations?.["worker.gardener.cloud/restart-systemd-services"] === undefined ? true : undefined), 60_000, 200);
    const after = await pids();
    expect(after.kubelet).not.toBe(before.kubelet);
    expect({ ...after, kubelet: 0 }).toEqual({ ...before, kubelet: 0 });
    await readyAgain(w, heartbeat, since.getTime());
  }, 120_000);

  test("Ready flapping of the real kubelet is detected (its pod network taken away and back, five times)", async () => {
    const since = new Date();
    const conflist = await w.bare.node.readFile(cniConfigPath);
    for (let i = 0; i < 5; i++) {
      await w.bare.node.execOk(["rm", cniConfigPath]);
      await nodeReady(false);
      await w.bare.node.writeFile(cniConfigPath, conflist);
      await nodeReady(true);
    }
    const warning = await warningSince("KubeletReadinessFlapping", since, 60_000);
    expect(warning).toContain("went from NotReady to Ready 5 times");
  }, 600_000);
});

// ---- helpers

function nodeReady(wanted: boolean) {
  return waitFor(`the Node ${wanted ? "Ready" : "NotReady"}`, async () => {
    const ready = (await readNode(w.bare)).status?.conditions?.find((c) => c.type === "Ready");
    return (ready?.status === "True") === wanted ? true : undefined;
  }, 120_000, 250);
}

async function warningSince(reason: string, since: Date, timeoutMs: number): Promise<string> {
  return waitFor(`a ${reason} Warning`, async () => {
    const e = (await nodeEvents(w.bare)).find((x) => x.reason === reason && new Date((x.lastTimestamp ?? x.eventTime) as Date).getTime() >= since.getTime() - 1000);
    return e?.message;
  }, timeoutMs, 250);
}

/** The web Pod still Running and Ready, and its container answering. */
async function podAnswers(): Promise<void> {
  const pod = await waitFor("the web Pod Ready", async () => {
    const p = await world.cluster.admin().makeApiClient(CoreV1Api).readNamespacedPod({ namespace: "default", name: "web" });
    return p.status?.conditions?.find((c) => c.type === "Ready")?.status === "True" ? p : undefined;
  }, 120_000, 250);
  expect(await webAnswer(w, pod)).toBe(webPage);
}

/** The PID of the web container's process, as the node sees it. */
async function containerPid(): Promise<number> {
  return Number((await w.bare.node.execOk(["sh", "-c", "pgrep -f 'httpd -f -v -p' | head -1"])).trim());
}
