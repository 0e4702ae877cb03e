// Gardener's in-place node updates on a real worker: a pool with the AutoInPlaceUpdate strategy, its OSC
// rendered by Gardener's own code (test/peer/osc-render: spec.inPlaceUpdates with the machine image's
// version, kubelet's version and the Shoot's credential rotations), applied by the compiled agent to a
// node running the real kubelet and containerd. machine-controller-manager's part — draining the node
// and setting the Node condition InPlaceUpdate=ReadyForUpdate — is played by the test, through the API.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { createHash, X509Certificate } from "node:crypto";
import { readFileSync } from "node:fs";
import { CertificatesV1Api, CoreV1Api, type V1Pod } from "@kubernetes/client-node";
import { readClientCertificate } from "../../src/kube/csr-kubeconfig.ts";
import { nodeEvents, putOscSecret, readNode, waitApplied } from "../harness/agent.ts";
import { decideCsr, waitForCsr } from "../harness/bootstrap.ts";
import { waitFor } from "../harness/exec.ts";
import { clearUpdateMarks, markReadyForUpdate, oscCondition } from "../harness/machine-update.ts";
import { bringUpWorker, readyAgain, readyHeartbeat, runWebPod, startWorkerWorld, unitPids, type Worker, type WorkerWorld } from "../harness/worker.ts";
import { type WorkerOscInput, workerOsc } from "../harness/worker-osc.ts";

let world: WorkerWorld;
/** kubelet's configuration after its in-place update. */
const kubeletConfig = { kubeReserved: { cpu: "90m", memory: "900Mi" } };
let w: Worker;

beforeAll(async () => {
  world = await startWorkerWorld();
  w = await bringUpWorker(world, "inplace", { osc: { updateStrategy: "AutoInPlaceUpdate" } });
}, 600_000);

afterAll(async () => {
  await w?.bare.stop();
  await world?.stop();
}, 60_000);

const appliedChecksum = async () => (await readNode(w.bare)).metadata?.annotations?.["checksum/cloud-config-data"];

/** Renders the pool's OSC with `changes` into its Secret; returns the checksum. */
async function putOsc(changes: Partial<WorkerOscInput>): Promise<string> {
  return putOscSecret(world.cluster, w.secretName, (await workerOsc({ ...w.input, ...changes })).osc);
}

/** The Pod as the API server has it, or undefined once it is gone. */
const readPod = (name: string): Promise<V1Pod | undefined> =>
  world.cluster.admin().makeApiClient(CoreV1Api).readNamespacedPod({ name, namespace: "default" }).catch((err: { code?: number }) => (err.code === 404 ? undefined : Promise.reject(err)));

async function warning(reason: string, containing: string): Promise<string> {
  return waitFor(`a ${reason} Warning naming ${containing}`, async () => (await nodeEvents(w.bare)).find((e) => e.reason === reason && e.message?.includes(containing))?.message, 60_000, 250);
}

describe("in-place updates (a pool with the AutoInPlaceUpdate strategy)", () => {
  test("the pool's first OSC carries spec.inPlaceUpdates and is applied as any first OSC", async () => {
    const rendered = await workerOsc(w.input);
    expect(rendered.osc).toMatch(/inPlaceUpdates:\n\s+kubelet: 1\.35\.4\n\s+operatingSystemVersion: "12"/);
    expect(await appliedChecksum()).toBe(w.checksum);
  });

  test("kubelet's kubeReserved in place: held until the node is drained, then applied, kubelet healthy, update-result=successful, the checksum stamped", async () => {
    const before = await unitPids(w);
    const config = "/var/lib/kubelet/config/kubelet";
    const checksum = await putOsc({ kubeletConfig });
    await waitFor("the condition InPlaceUpdatePending", async () => ((await oscCondition(w.bare))?.reason === "InPlaceUpdatePending" ? true : undefined), 60_000, 250);
    expect((await oscCondition(w.bare))?.message).toContain("kubeReserved/evictionHard");
    expect(await appliedChecksum()).toBe(w.checksum);
    expect(await w.bare.node.readFile(config)).not.toContain("cpu: 90m");
    expect((await unitPids(w)).kubelet).toBe(before.kubelet);

    const heartbeat = await readyHeartbeat(w);
    const since = Date.now();
    await markReadyForUpdate(world.cluster, w.bare.name);
    const node = await waitApplied(w.bare, checksum, 120_000, 250);
    expect(node.metadata?.labels?.["node.machine.sapcloud.io/update-result"]).toBe("successful");
    expect(await w.bare.node.readFile(config)).toContain("cpu: 90m");
    const after = await unitPids(w);
    expect(after.kubelet).not.toBe(before.kubelet);
    expect(after.containerd).toBe(before.containerd);
    await readyAgain(w, heartbeat, since);
    // The condition follows the checksum in the same report: wait for it, not read it at the checksum.
    await waitFor("the condition Applied", async () => ((await oscCondition(w.bare))?.reason === "Applied" ? true : undefined), 30_000, 250);
    expect(await oscCondition(w.bare)).toMatchObject({ status: "True", reason: "Applied" });
    await clearUpdateMarks(world.cluster, w.bare.name);
  }, 240_000);

  test("a change without in-place work on a drained node (machine-controller-manager waits for a result): applied at once, the Pods left on the node deleted, update-result=successful, as gardener-node-agent", async () => {
    const left = await runWebPod(world, w, "left-by-drain");
    await markReadyForUpdate(world.cluster, w.bare.name);
    const checksum = await putOsc({ kubeletConfig, extraFile: "no in-place work\n" });
    const node = await waitApplied(w.bare, checksum, 60_000, 250);
    expect(node.metadata?.labels?.["node.machine.sapcloud.io/update-result"]).toBe("successful");
    expect(await w.bare.node.readFile("/etc/e2e/unrelated")).toBe("no in-place work\n");
    // The Pods went before the node was reported updated: by now the Pod is being deleted, or gone.
    const leftNow = await readPod(left.metadata?.name as string);
    expect(leftNow === undefined || leftNow.metadata?.deletionTimestamp !== undefined).toBe(true);
    await clearUpdateMarks(world.cluster, w.bare.name);
  }, 180_000);

  test("a service-account key rotation in place: held until the node is drained, then the token files read afresh, update-result=successful, nothing restarted", async () => {
    const before = await unitPids(w);
    const checksum = await putOsc({ kubeletConfig, credentialsRotation: { serviceAccountKey: { lastInitiationTime: "2026-11-25T12:00:00Z" } } });
    await waitFor("the condition InPlaceUpdatePending", async () => ((await oscCondition(w.bare))?.message?.includes("a service-account key rotation") ? true : undefined), 60_000, 250);
    expect(await oscCondition(w.bare)).toMatchObject({ status: "False", reason: "InPlaceUpdatePending" });
    await markReadyForUpdate(world.cluster, w.bare.name);
    const node = await waitApplied(w.bare, checksum, 60_000, 250);
    expect(node.metadata?.labels?.["node.machine.sapcloud.io/update-result"]).toBe("successful");
    expect(await unitPids(w)).toEqual(before);
    await clearUpdateMarks(world.cluster, w.bare.name);
  }, 180_000);

  test("a CA rotation in place: the agent's and kubelet's client certificates requested anew (the agent uses its new one without restarting; kubelet's bootstrap kubeconfig goes afterwards), kubelet healthy and the node Ready, update-result=successful", async () => {
    const agentKubeconfig = "/var/lib/gardener-node-agent/credentials/kubeconfig";
    const kubeletCert = "/var/lib/kubelet/pki/kubelet-client-current.pem";
    const [agentBefore, kubeletBefore, before] = [await w.bare.node.readFile(agentKubeconfig), await w.bare.node.readFile(kubeletCert), await unitPids(w)];
    const checksum = await putOsc({
      kubeletConfig,
      credentialsRotation: { serviceAccountKey: { lastInitiationTime: "2026-11-25T12:00:00Z" }, certificateAuthorities: { lastInitiationTime: "2026-11-25T13:00:00Z" } },
    });
    await waitFor("the condition InPlaceUpdatePending", async () => ((await oscCondition(w.bare))?.message?.includes("a certificate authority rotation") ? true : undefined), 60_000, 250);
    const heartbeat = await readyHeartbeat(w);
    const since = Date.now();
    await markReadyForUpdate(world.cluster, w.bare.name);
    // The agent's renewal, authenticated with its current certificate, approved as Gardener's approver does it.
    const csr = await waitForCsr(world.cluster, "the agent's CSR", (c) => (c.spec.username ?? "").startsWith("gardener.cloud:node-agent:machine:") && !c.status?.conditions?.length, 60_000);
    await decideCsr(world.cluster, csr.metadata?.name as string, "Approved", "E2E", "approved by the test");
    const node = await waitApplied(w.bare, checksum, 120_000, 250).catch(async (err) => {
      console.error((await w.bare.node.exec(["journalctl", "--no-pager", "-n", "150", "-u", "kubelet", "-u", "gardener-node-agent"])).stdout);
      throw err;
    });
    expect(node.metadata?.labels?.["node.machine.sapcloud.io/update-result"]).toBe("successful");
    expect(await w.bare.node.readFile(agentKubeconfig)).not.toBe(agentBefore);
    expect(await w.bare.node.readFile(kubeletCert)).not.toBe(kubeletBefore);
    const after = await unitPids(w);
    expect(after.kubelet).not.toBe(before.kubelet);
    // Unlike gardener-node-agent, the agent does not restart itself with its new certificate: it uses it in place.
    expect({ containerd: after.containerd, agent: after.agent }).toEqual({ containerd: before.containerd, agent: before.agent });
    const user = readClientCertificate(await w.bare.node.readFile(agentKubeconfig));
    const credentialId = `X509SHA256=${createHash("sha256").update(new X509Certificate(user?.certPem ?? "").raw).digest("hex")}`;
    await waitFor(`a request of ${user?.commonName} authenticated with its new certificate`, () => {
      const lines = readFileSync(world.cluster.auditLog, "utf8").split("\n");
      return lines.some((l) => l.includes(`"username":"${user?.commonName}"`) && l.includes(credentialId)) ? true : undefined;
    }, 60_000, 500);
    // kubelet's bootstrap kubeconfig, holding its old key, does not stay once kubelet has its new certificate (as gardener-node-agent deletes it at every reconcile).
    await waitFor("kubelet's bootstrap kubeconfig removed", async () => ((await w.bare.node.exec(["test", "-e", "/var/lib/kubelet/kubeconfig-bootstrap"])).code !== 0 ? true : undefined), 30_000, 250);
    await readyAgain(w, heartbeat, since);
    // kubelet's new certificate was asked for as itself, and approved as a renewal (selfnodeclient).
    const csrs = await world.cluster.admin().makeApiClient(CertificatesV1Api).listCertificateSigningRequest();
    expect(csrs.items.some((c) => c.spec.username === `system:node:${w.bare.name}` && new Date(c.metadata?.creationTimestamp ?? 0).getTime() >= since - 1000)).toBe(true);
    await clearUpdateMarks(world.cluster, w.bare.name);
  }, 240_000);

  test("an OS update without the OS extension's command is an error naming the field (a Warning, the condition), retried; as gardener-node-agent, machine-controller-manager is told nothing; the checksum not stamped", async () => {
    const applied = await appliedChecksum();
    const checksum = await putOsc({ kubeletConfig, imageVersion: "13" });
    await waitFor("the condition InPlaceUpdatePending", async () => ((await oscCondition(w.bare))?.message?.includes("an OS update from 12 to 13") ? true : undefined), 60_000, 250);
    await markReadyForUpdate(world.cluster, w.bare.name);
    await warning("InPlaceUpdateFailed", "status.inPlaceUpdates.osUpdate.command");
    await waitFor("the condition InPlaceUpdateFailed", async () => ((await oscCondition(w.bare))?.reason === "InPlaceUpdateFailed" ? true : undefined), 30_000, 250);
    // The Warning follows the outcome: a label or annotation for machine-controller-manager would be there by now.
    const node = await readNode(w.bare);
    expect(node.metadata?.labels?.["node.machine.sapcloud.io/update-result"]).toBeUndefined();
    expect(node.metadata?.annotations?.["node.machine.sapcloud.io/update-failed-reason"]).toBeUndefined();
    expect(await appliedChecksum()).toBe(applied);
    expect(applied).not.toBe(checksum);
    await clearUpdateMarks(world.cluster, w.bare.name);
  }, 180_000);

  test("an OS update with the OS extension's command: run once the node is drained, os-release names 13, update-result=successful, the checksum stamped", async () => {
    const osUpdate = { command: "/bin/sh", args: ["-c", "sed -i 's/Linux 12 (bookworm)/Linux 13 (trixie)/' /etc/os-release"] };
    const checksum = await putOsc({ kubeletConfig, imageVersion: "13", osUpdate });
    await waitFor("the condition InPlaceUpdatePending", async () => ((await oscCondition(w.bare))?.reason === "InPlaceUpdatePending" ? true : undefined), 60_000, 250);
    expect(await w.bare.node.readFile("/etc/os-release")).toContain("Linux 12 (bookworm)");
    await markReadyForUpdate(world.cluster, w.bare.name);
    const node = await waitApplied(w.bare, checksum, 120_000, 250);
    expect(node.metadata?.labels?.["node.machine.sapcloud.io/update-result"]).toBe("successful");
    expect(node.metadata?.annotations?.["node.machine.sapcloud.io/update-failed-reason"]).toBeUndefined();
    expect(node.metadata?.annotations?.["node-agent.gardener.cloud/updating-operating-system-version"]).toBeUndefined();
    expect(await w.bare.node.readFile("/etc/os-release")).toContain("Linux 13 (trixie)");
    // The condition follows the checksum in the same report: wait for it, not read it at the checksum.
    await waitFor("the condition Applied", async () => ((await oscCondition(w.bare))?.reason === "Applied" ? true : undefined), 30_000, 250);
    expect(await oscCondition(w.bare)).toMatchObject({ status: "True", reason: "Applied" });
    await clearUpdateMarks(world.cluster, w.bare.name);
  }, 180_000);
});
