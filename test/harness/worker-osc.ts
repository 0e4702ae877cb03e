// The OperatingSystemConfig a worker node gets, as Gardener renders it: test/peer/osc-render runs
// gardenlet's own operatingsystemconfig component for a worker pool (the `original` components, node
// labels, criConfig, the pool's Secret name and content) with this cluster's values. The one change to
// Gardener's output is what a provider extension's webhook would do for this machine: kubelet's
// failCgroupV1: false (the host runs cgroup v1, which kubelet 1.35 refuses by default). A file for tests
// is added as an OS extension adds its files: in status.extensionFiles.
import { mkdtempSync, readFileSync, writeFileSync } from "node:fs";
import { Buffer } from "node:buffer";
import { parse, stringify } from "yaml";
import { runDir, runOk } from "./exec.ts";
import type { KubeletImages } from "./kubelet-images.ts";

export type WorkerOscInput = {
  /** The API server and the cluster CA as the node reaches and trusts them. */
  server: string;
  caPem: string;
  /** The CA of kube-apiserver's client certificate towards kubelets. */
  kubeletCaPem: string;
  images: KubeletImages;
  /** The node agent's image (its binary at /gardener-node-agent): what Gardener deploys as gardener-node-agent. */
  agentImage: string;
  /** The worker pool's name (Gardener's default: worker); it goes into the Secret's name. */
  pool?: string;
  /** The pool's Kubernetes version, without "v" (osc-render's default: the cluster's); images.hyperkube must hold that kubelet. */
  kubernetesVersion?: string;
  maxPods?: number;
  /** KubeletConfiguration fields set in the rendered file, as a provider's webhook would (after failCgroupV1: false). */
  kubeletConfig?: Record<string, unknown>;
  /** The pool's update strategy (AutoInPlaceUpdate: the OSC carries spec.inPlaceUpdates) and machine image version. */
  updateStrategy?: "AutoRollingUpdate" | "AutoInPlaceUpdate" | "ManualInPlaceUpdate";
  imageVersion?: string;
  /** The Shoot's status.credentials.rotation: lastInitiationTime of a CA and a service-account key rotation. */
  credentialsRotation?: { certificateAuthorities?: { lastInitiationTime: string }; serviceAccountKey?: { lastInitiationTime: string } };
  /** The OS extension's update command (status.inPlaceUpdates.osUpdate), as an extension adds it. */
  osUpdate?: { command: string; args?: string[] };
  /** A file no unit lists, at /etc/e2e/unrelated. */
  extraFile?: string;
};

/**
 * The pool's OSC Secret as gardenlet writes it: name, data["osc.yaml"] and its checksum/data-script; and the
 * pool's provisioning OSC (`init`: gardener-node-init, what machine-controller-manager gives a new machine).
 */
export type WorkerOsc = { secretName: string; osc: string; checksum: string; init: string };

const script = new URL("../peer/osc-render.sh", import.meta.url).pathname;
let built: Promise<string> | undefined;

/** The renderer's path, built once per machine and source (test/peer/osc-render.sh caches it). */
export function rendererBinary(): Promise<string> {
  built ??= runOk(["bash", script, "--path"], { timeoutMs: 30 * 60_000 }).then((out) => out.trim().split("\n").at(-1) ?? "");
  return built;
}

export async function workerOsc(i: WorkerOscInput): Promise<WorkerOsc> {
  const dir = mkdtempSync(`${runDir("worker-osc")}/render-`);
  writeFileSync(
    `${dir}/values.json`,
    JSON.stringify({
      apiServerURL: i.server,
      caBundle: i.caPem,
      kubeletCABundle: i.kubeletCaPem,
      images: { hyperkube: i.images.hyperkube, "gardener-node-agent": i.agentImage, "pause-container": i.images.pause },
      ...(i.pool ? { pool: i.pool } : {}),
      ...(i.kubernetesVersion ? { kubernetesVersion: i.kubernetesVersion } : {}),
      clusterDNS: ["10.0.0.10"],
      ...(i.maxPods ? { maxPods: i.maxPods } : {}),
      kubeletConfigPatch: { failCgroupV1: false, ...i.kubeletConfig },
      ...(i.updateStrategy ? { updateStrategy: i.updateStrategy } : {}),
      ...(i.imageVersion ? { imageVersion: i.imageVersion } : {}),
      ...(i.credentialsRotation ? { credentialsRotation: rotationStatus(i.credentialsRotation) } : {}),
    }),
  );
  await runOk([await rendererBinary(), "--values", `${dir}/values.json`, "--out", `${dir}/osc.yaml`, "--secret-out", `${dir}/secret.yaml`, "--init-out", `${dir}/init.yaml`]);
  const secret = parse(readFileSync(`${dir}/secret.yaml`, "utf8"));
  const rendered = {
    secretName: secret.metadata.name as string,
    osc: Buffer.from(secret.data["osc.yaml"], "base64").toString("utf8"),
    checksum: secret.metadata.annotations["checksum/data-script"] as string,
    init: readFileSync(`${dir}/init.yaml`, "utf8"),
  };
  if (!i.extraFile && !i.osUpdate) return rendered;
  const doc = parse(rendered.osc);
  if (i.extraFile) doc.status = { ...doc.status, extensionFiles: [{ path: "/etc/e2e/unrelated", permissions: 0o644, content: { inline: { data: i.extraFile } } }] };
  if (i.osUpdate) doc.status = { ...doc.status, inPlaceUpdates: { osUpdate: i.osUpdate } };
  return { ...rendered, osc: stringify(doc) };
}

// The Shoot's rotation status as gardenlet reads it (each rotation has a phase besides its time).
function rotationStatus(r: NonNullable<WorkerOscInput["credentialsRotation"]>) {
  return Object.fromEntries(Object.entries(r).map(([kind, v]) => [kind, { phase: "Prepared", ...v }]));
}
