// The differential test's scenario: a sequence of OSC Secrets and node events that both twin nodes go
// through, in the scenario classes of gardener-node-agent's own integration tests
// (test/integration/nodeagent/operatingsystemconfig in gardener/gardener) and the cases of trellis
// issue 20. Each OSC step derives its OSC from the last one both agents were meant to apply; a
// one-off step (a refusal case) does not carry over, so the step after it starts from the good one.
import { CoreV1Api, PatchStrategy, setHeaderOptions } from "@kubernetes/client-node";
import type { Outcome } from "./diff.ts";
import { nodeAgentUserPrefix } from "../../src/kube/csr.ts";
import { startCsrSigner } from "../harness/bootstrap.ts";
import { clearUpdateMarks, markReadyForUpdate, updateResultLabel } from "../harness/machine-update.ts";
import { waitFor } from "../harness/exec.ts";
import { b64, containerd, emptyOsc, file, type InPlaceUpdates, inline, type Osc, render, serviceUnit, unit, withoutFile, withoutUnit } from "./osc.ts";
import { doneWhen, oscOutcome } from "./settle.ts";
import { type Env, foreignUnit, osUpdateTool, putSecret, sides, toolImage, type Twin, type World } from "./twins.ts";

export type StepClass =
  | "files"
  | "units"
  | "drop-ins"
  | "removal"
  | "extension"
  | "secretRef"
  | "imageRef"
  | "hostName"
  | "tokens"
  | "restart-annotation"
  | "criConfig"
  | "unknown-fields"
  | "refusals"
  | "readiness-probe"
  | "serial"
  | "delay"
  | "in-place"
  | "static-pods"
  | "hostname"
  | "no-op";

type StepBase = {
  id: string;
  class: StepClass;
  what: string;
  /** What must hold on each node after its agent decided, before the nodes are compared (work an agent finishes after its decision). */
  settled?: { what: string; check(w: World, t: Twin): Promise<boolean> };
  /** Done to the world once both agents decided (a stand-in the step started stops). */
  after?(w: World): Promise<void>;
};
export type OscStep = StepBase & {
  kind: "osc";
  next(prev: Osc, env: Env): Osc;
  /** The Secret's text when it is not the OSC serialised (a step about the YAML itself). */
  render?(osc: Osc, env: Env): string;
  /** Not carried over: the step after it derives from the OSC before it. */
  oneOff?: boolean;
  /** Done to the world before the Secrets are written (a Secret the OSC refers to, a file on the nodes). */
  before?(w: World): Promise<void>;
  /** Annotations of both OSC Secrets (serial rollout). */
  secretAnnotations?: Record<string, string>;
  /** How long an agent may take to decide (default settle.ts's). */
  timeoutMs?: number;
  /** The log line that is gardener-node-agent's decision to wait in this step (settle.ts). */
  gnaHold?: string;
};
export type EventStep = StepBase & {
  kind: "event";
  act(w: World): Promise<void>;
  /** What says that agent is done with the event (its own account, or what it wrote); `checksum`: the OSC both Secrets carry. */
  outcome(w: World, t: Twin, sinceMs: number, checksum: string | undefined): Promise<Outcome>;
};
export type Step = OscStep | EventStep;

const edit =
  (change: (o: Osc, env: Env) => void) =>
  (prev: Osc, env: Env): Osc => {
    const o = structuredClone(prev);
    change(o, env);
    return o;
  };

function oscStep(id: string, cls: StepClass, what: string, change: (o: Osc, env: Env) => void, opts: Partial<OscStep> = {}): OscStep {
  return { kind: "osc", id, class: cls, what, next: edit(change), ...opts };
}

/** A refusal case: the good OSC plus a file of its own (so that an agent that applies it shows), with `change` on top. */
function refusalStep(id: string, cls: StepClass, what: string, change: (o: Osc, env: Env) => void, opts: Partial<OscStep> = {}): OscStep {
  return oscStep(id, cls, what, (o, env) => {
    o.spec.files.push({ path: `/etc/parity/refusal/${id}`, permissions: 0o644, content: inline(`${id}\n`) });
    change(o, env);
  }, { oneOff: true, ...opts });
}

const readText = (t: Twin, path: string) => t.node.readFile(path).catch(() => undefined);

const restartAnnotation = "worker.gardener.cloud/restart-systemd-services";
const delayAnnotation = "node-agent.gardener.cloud/reconciliation-delay";
const serialAnnotation = "reconciliation.osc.node-agent.gardener.cloud/serial";

async function annotateNodes(w: World, annotations: Record<string, string | null>): Promise<void> {
  const core = w.cluster.admin().makeApiClient(CoreV1Api);
  await onBoth(w, (t) => core.patchNode({ name: t.name, body: { metadata: { annotations } } }, setHeaderOptions("Content-Type", PatchStrategy.MergePatch)));
}

async function onBoth(w: World, act: (t: Twin) => Promise<unknown>): Promise<void> {
  await Promise.all(sides.map((s) => act(w.twins[s])));
}

/** The event ends the hold the agents were in on the OSC both Secrets carry: its outcome is each agent's decision past that hold. */
const decidedOnOsc = (_w: World, t: Twin, sinceMs: number, checksum: string | undefined): Promise<Outcome> =>
  checksum ? oscOutcome(t, checksum, sinceMs, { pastHold: true }) : Promise.resolve({ result: "timeout", evidence: "no OSC was put before this event" });

/** machine-controller-manager drained the node: the Node condition InPlaceUpdate=ReadyForUpdate. */
function mcmReady(id: string, what: string): EventStep {
  return {
    kind: "event",
    id,
    class: "in-place",
    what: `machine-controller-manager drained the node for ${what} (condition InPlaceUpdate, reason ReadyForUpdate)`,
    act: (w) => onBoth(w, (t) => markReadyForUpdate(w.cluster, t.name)),
    outcome: decidedOnOsc,
  };
}

/** machine-controller-manager recorded the result: its condition, the result label and the failed reason go. */
function mcmResultRead(id: string): EventStep {
  return {
    kind: "event",
    id,
    class: "in-place",
    what: "machine-controller-manager recorded the result: the condition InPlaceUpdate, the update-result label and update-failed-reason go",
    act: (w) => onBoth(w, (t) => clearUpdateMarks(w.cluster, t.name)),
    outcome: doneWhen("the result label gone", async (_w, t) => (await t.core.readNode({ name: t.name })).metadata?.labels?.[updateResultLabel] === undefined),
  };
}

const inPlace = (o: Osc): InPlaceUpdates => {
  if (!o.spec.inPlaceUpdates) throw new Error("the scenario's OSC has no spec.inPlaceUpdates yet");
  return o.spec.inPlaceUpdates;
};
const osUpdate = (o: Osc): { command: string; args?: string[] } => {
  const u = o.status?.inPlaceUpdates?.osUpdate;
  if (!u) throw new Error("the scenario's OSC has no status.inPlaceUpdates.osUpdate yet");
  return u;
};

/** The twins' OS (the host image's /etc/os-release: Debian 12), and the versions the OS updates go to. */
const nodeOs = "12";
const nextOs = "13";
const failingOs = "14";
const kubeletConfigPath = "/var/lib/kubelet/config/kubelet";
const kubeletConfig = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nmaxPods: 110\n";
const hostnameCheckPeriodMs = 30_000;

const staticPodPath = "/etc/kubernetes/manifests/parity-static.yaml";
const staticPodHash = "gardener.cloud/config.mirror";
const staticPodManifest = (hash: string) =>
  `apiVersion: v1\nkind: Pod\nmetadata:\n  name: parity-static\n  namespace: kube-system\n  annotations:\n    ${staticPodHash}: ${hash}\nspec:\n  containers:\n  - name: pause\n    image: registry.k8s.io/pause:3.10\n`;

/** kubelet puts each node's mirror pod with `hash`, which ends the agents' wait for it. */
function mirrorPodStep(id: string, what: string, hash: string): EventStep {
  return { kind: "event", id, class: "static-pods", what, act: (w) => onBoth(w, (t) => putMirrorPod(w, t, hash)), outcome: decidedOnOsc };
}

/** The mirror pod kubelet makes of the manifest on node `t` (named <pod>-<node>), Running and Ready; a new hash replaces it, as kubelet does. */
async function putMirrorPod(w: World, t: Twin, hash: string): Promise<void> {
  const core = w.cluster.admin().makeApiClient(CoreV1Api);
  const name = `parity-static-${t.name}`;
  await core.deleteNamespacedPod({ name, namespace: "kube-system", gracePeriodSeconds: 0 }).catch((err: { code?: number }) => (err.code === 404 ? undefined : Promise.reject(err)));
  await waitFor(`the old mirror pod ${name} gone`, async () => (await core.readNamespacedPod({ name, namespace: "kube-system" }).then(() => false, (err: { code?: number }) => err.code === 404)) || undefined, 30_000, 100);
  await core.createNamespacedPod({
    namespace: "kube-system",
    body: {
      metadata: { name, labels: { "static-pod": "true" }, annotations: { [staticPodHash]: hash, "kubernetes.io/config.mirror": hash } },
      spec: { nodeName: t.name, containers: [{ name: "pause", image: "registry.k8s.io/pause:3.10" }] },
    },
  });
  const now = new Date();
  await core.patchNamespacedPodStatus(
    { name, namespace: "kube-system", body: { status: { phase: "Running", conditions: [{ type: "Ready", status: "True", lastTransitionTime: now }], containerStatuses: [{ name: "pause", ready: true, restartCount: 0, image: "registry.k8s.io/pause:3.10", imageID: "", started: true, state: { running: { startedAt: now } } }] } } },
    setHeaderOptions("Content-Type", PatchStrategy.MergePatch),
  );
}

/** The signer of the CA rotation's CSRs, while its step runs. */
let caSigner: { stop(): Promise<void> } | undefined;

/**
 * kubelet as the CA rotation finds it: a unit that runs (the stand-in for its health endpoint answers), its
 * kubeconfig with its own client certificate; both agents write its bootstrap kubeconfig from them.
 */
async function kubeletWithCredentials(w: World, t: Twin): Promise<void> {
  await t.node.writeFile("/etc/systemd/system/kubelet.service", "[Unit]\nDescription=parity: kubelet's stand-in\n[Service]\nExecStart=/bin/sleep infinity\n[Install]\nWantedBy=multi-user.target\n", 0o644);
  const cert = "/var/lib/kubelet/pki/kubelet-client-current.pem";
  await t.node.writeFile(cert, "parity: kubelet's client certificate and key\n", 0o600);
  await t.node.writeFile(
    "/var/lib/kubelet/kubeconfig-real",
    `apiVersion: v1\nkind: Config\nclusters:\n- name: default-cluster\n  cluster: {server: "${w.cluster.server}", certificate-authority: /var/lib/kubelet/ca.crt}\nusers:\n- name: default-auth\n  user: {client-certificate: ${cert}, client-key: ${cert}}\ncontexts:\n- name: default-context\n  context: {cluster: default-cluster, user: default-auth}\ncurrent-context: default-context\n`,
    0o600,
  );
  await t.node.execOk(["systemctl", "daemon-reload"]);
  await t.node.execOk(["systemctl", "enable", "--now", "kubelet.service"]);
}

const mirrorRegistry = (env: Env) => ({ upstream: env.upstream, server: `https://${env.upstream}`, hosts: [{ url: `http://${env.mirror}`, capabilities: ["pull", "resolve"] }] });

export const steps: Step[] = [
  // ------------------------------------------------------------ files and units, first apply
  oscStep("first-apply", "files", "first OSC: inline files (plain, b64, no permissions, 0755), hostName files for each node and another host, four units (start, stop, drop-in, no command)", (o, env) => {
    o.spec.files.push(
      { path: "/etc/parity/plain.conf", permissions: 0o644, content: inline("plain v1\n") },
      { path: "/etc/parity/secret.b64", content: b64("b64 v1\n") },
      { path: "/etc/parity/run.sh", permissions: 0o755, content: inline("#!/bin/sh\necho run v1\n") },
      ...sides.map((s) => ({ path: `/etc/parity/host-${env.nodeNames[s]}.conf`, permissions: 0o644, hostName: env.nodeNames[s], content: inline("for this host only\n") })),
      { path: "/etc/parity/host-other.conf", permissions: 0o644, hostName: "some-other-host", content: inline("for another host\n") },
    );
    o.spec.units.push(
      { name: "parity-a.service", enable: true, command: "start", content: serviceUnit("a"), filePaths: ["/etc/parity/plain.conf"] },
      { name: "parity-b.service", enable: true, command: "start", content: serviceUnit("b"), dropIns: [{ name: "10-env.conf", content: "[Service]\nEnvironment=B=1\n" }] },
      { name: "parity-c.service", enable: false, command: "stop", content: serviceUnit("c") },
      { name: "parity-d.service", enable: true, content: serviceUnit("d") },
    );
  }),
  oscStep("file-content", "files", "a file a unit lists in filePaths changes: that unit restarts", (o) => {
    file(o, "/etc/parity/plain.conf").content = inline("plain v2\n");
  }),
  oscStep("file-mode", "files", "only a file's permissions change (0755 → 0700)", (o) => {
    file(o, "/etc/parity/run.sh").permissions = 0o700;
  }),
  oscStep("file-nested", "files", "a new file in new nested directories (0640)", (o) => {
    o.spec.files.push({ path: "/etc/parity/deep/er/nested.conf", permissions: 0o640, content: inline("nested v1\n") });
  }),
  oscStep("file-encoding-only", "files", "a listed file's encoding changes from plain to b64, its bytes stay the same", (o) => {
    file(o, "/etc/parity/plain.conf").content = b64("plain v2\n");
  }),
  oscStep("file-remove", "removal", "a file leaves the OSC", (o) => {
    withoutFile(o, "/etc/parity/run.sh");
  }),
  oscStep("unit-filepaths-add", "units", "a unit gets a filePaths entry, nothing else of it changes", (o) => {
    unit(o, "parity-d.service").filePaths = ["/etc/parity/deep/er/nested.conf"];
  }),
  oscStep("file-remove-listed", "removal", "a file a unit lists leaves the OSC (the unit keeps listing it)", (o) => {
    withoutFile(o, "/etc/parity/deep/er/nested.conf");
  }),
  oscStep("unit-content", "units", "a unit's content changes", (o) => {
    unit(o, "parity-b.service").content = serviceUnit("b, second version");
  }),
  // ------------------------------------------------------------ drop-ins
  oscStep("dropin-add", "drop-ins", "a unit gets a drop-in", (o) => {
    unit(o, "parity-a.service").dropIns = [{ name: "20-a.conf", content: "[Service]\nEnvironment=A=1\n" }];
  }),
  oscStep("dropin-change", "drop-ins", "a drop-in's content changes", (o) => {
    unit(o, "parity-a.service").dropIns = [{ name: "20-a.conf", content: "[Service]\nEnvironment=A=2\n" }];
  }),
  oscStep("dropin-second", "drop-ins", "a second drop-in", (o) => {
    unit(o, "parity-a.service").dropIns?.push({ name: "30-a.conf", content: "[Service]\nEnvironment=A3=1\n" });
  }),
  oscStep("dropin-remove-one", "drop-ins", "one of two drop-ins leaves", (o) => {
    unit(o, "parity-a.service").dropIns = [{ name: "30-a.conf", content: "[Service]\nEnvironment=A3=1\n" }];
  }),
  oscStep("dropin-remove-all", "drop-ins", "a unit's last drop-in leaves (dropIns: [])", (o) => {
    unit(o, "parity-a.service").dropIns = [];
  }),
  // ------------------------------------------------------------ command and enable
  oscStep("command-stop", "units", "command: stop for a running unit", (o) => {
    unit(o, "parity-b.service").command = "stop";
  }),
  oscStep("command-start", "units", "command: start again", (o) => {
    unit(o, "parity-b.service").command = "start";
  }),
  oscStep("command-restart", "units", "command: restart with a changed content", (o) => {
    const d = unit(o, "parity-d.service");
    d.command = "restart";
    d.content = serviceUnit("d, second version");
  }),
  oscStep("enable-false", "units", "enable: false for a started unit (command start stays)", (o) => {
    unit(o, "parity-a.service").enable = false;
  }),
  oscStep("enable-true", "units", "enable: true again", (o) => {
    unit(o, "parity-a.service").enable = true;
  }),
  oscStep("stopped-unit-started", "units", "the stopped, disabled unit gets enable: true and command: start", (o) => {
    const c = unit(o, "parity-c.service");
    c.enable = true;
    c.command = "start";
  }),
  // ------------------------------------------------------------ a unit the OSC does not own, extension units and files
  oscStep("foreign-dropin", "drop-ins", `a drop-in (only) for a unit on the node that no OSC wrote (${foreignUnit}, which has a drop-in of its own)`, (o) => {
    o.spec.units.push({ name: foreignUnit, dropIns: [{ name: "50-parity.conf", content: "[Service]\nEnvironment=PARITY=1\n" }] });
  }),
  oscStep("foreign-dropin-remove", "removal", "that unit leaves the OSC: its OSC drop-in goes, its own file and drop-in stay", (o) => {
    withoutUnit(o, foreignUnit);
  }),
  oscStep("extension-units-files", "extension", "status.extensionUnits (a new unit, and a drop-in only for a spec unit) and status.extensionFiles", (o) => {
    o.status = {
      extensionUnits: [
        { name: "parity-e.service", enable: true, command: "start", content: serviceUnit("e"), filePaths: ["/etc/parity/ext.conf"] },
        { name: "parity-b.service", dropIns: [{ name: "40-ext.conf", content: "[Service]\nEnvironment=EXT=1\n" }] },
      ],
      extensionFiles: [{ path: "/etc/parity/ext.conf", permissions: 0o600, content: inline("extension v1\n") }],
    };
  }),
  oscStep("extension-file-change", "extension", "an extension file a unit lists changes", (o) => {
    const f = o.status?.extensionFiles?.[0];
    if (f) f.content = inline("extension v2\n");
  }),
  oscStep("unit-remove", "removal", "a stopped-then-started unit and a running unit leave the OSC", (o) => {
    withoutUnit(o, "parity-c.service");
    withoutUnit(o, "parity-d.service");
  }),
  // ------------------------------------------------------------ secretRef
  oscStep("secretref-add", "secretRef", "a file whose content comes from a Secret (secretRef)", (o, env) => {
    o.spec.files.push({ path: "/etc/parity/from-secret", permissions: 0o640, content: { secretRef: { name: env.secretRefName, dataKey: "content" } } });
  }),
  oscStep(
    "secretref-data-change",
    "secretRef",
    "the referenced Secret's data changes, then an OSC change elsewhere (a metadata annotation)",
    (o) => {
      o.metadata.annotations = { "parity.example/touch": "secret-ref" };
    },
    { before: async (w) => putSecret(w.cluster.admin().makeApiClient(CoreV1Api), w.env.secretRefName, { content: "from the secret, v2\n" }) },
  ),
  // ------------------------------------------------------------ node events
  {
    kind: "event",
    id: "restart-annotation",
    class: "restart-annotation",
    what: `the Node annotation ${restartAnnotation}: "parity-a.service,parity-b" (one name without .service)`,
    act: (w) => annotateNodes(w, { [restartAnnotation]: "parity-a.service,parity-b" }),
    outcome: doneWhen("the restart annotation removed", async (_w, t) => (await t.core.readNode({ name: t.name })).metadata?.annotations?.[restartAnnotation] === undefined),
  },
  {
    kind: "event",
    id: "token-change",
    class: "tokens",
    what: "the token Secret of controllers.token.syncConfigs changes (both agents sync every 15 s, trellis also watches)",
    act: (w) => putSecret(w.cluster.admin().makeApiClient(CoreV1Api), w.env.tokenSecretName, { token: "token-v2" }),
    outcome: doneWhen("the new token on disk", async (w, t) => (await readText(t, w.env.tokenPath)) === "token-v2"),
  },
  oscStep("no-op", "no-op", "only the OSC's metadata changes: nothing on the node", (o) => {
    o.metadata.annotations = { "parity.example/touch": "no-op" };
  }),
  // ------------------------------------------------------------ criConfig and imageRef
  oscStep("cri-first", "criConfig", "criConfig containerd: cgroupDriver systemd, a sandbox image, a mirror for the image registry", (o, env) => {
    o.spec.criConfig = { name: "containerd", cgroupDriver: "systemd", containerd: { sandboxImage: "registry.k8s.io/pause:3.10", registries: [mirrorRegistry(env)] } };
  }),
  oscStep("imageref-add", "imageRef", "a file from an image (imageRef) that a unit lists", (o) => {
    o.spec.files.push({ path: "/opt/parity/tool", permissions: 0o755, content: { imageRef: { image: toolImage("v1"), filePathInImage: "/tool" } } });
    const e = o.status?.extensionUnits?.find((u) => u.name === "parity-e.service");
    if (e) e.filePaths = ["/etc/parity/ext.conf", "/opt/parity/tool"];
  }),
  oscStep("imageref-change", "imageRef", "the image's tag changes", (o) => {
    file(o, "/opt/parity/tool").content = { imageRef: { image: toolImage("v2"), filePathInImage: "/tool" } };
  }),
  oscStep("cri-registry-add", "criConfig", "a second registry (pull only, override_path)", (o) => {
    containerd(o).registries?.push({ upstream: "registry.k8s.io", server: "https://registry.k8s.io", hosts: [{ url: "https://10.10.10.101:8080", capabilities: ["pull"], overridePath: true }] });
  }),
  oscStep("cri-registry-remove", "criConfig", "that registry leaves", (o, env) => {
    containerd(o).registries = [mirrorRegistry(env)];
  }),
  // A plugin table containerd itself reads (an unknown plugin's table stops containerd 1.6 from starting):
  // CRI's registry headers, a table whose keys an extension may drop.
  oscStep("cri-plugins", "criConfig", "containerd plugins: CRI's registry headers, two of them (a nested table)", (o) => {
    containerd(o).plugins = [{ path: ["io.containerd.grpc.v1.cri", "registry"], values: { headers: { "X-Parity": ["1"], "X-Other": ["2"] } } }];
  }),
  oscStep("cri-plugins-replace", "criConfig", "the plugin's values keep one of the two headers", (o) => {
    containerd(o).plugins = [{ path: ["io.containerd.grpc.v1.cri", "registry"], values: { headers: { "X-Parity": ["1"] } } }];
  }),
  oscStep("cri-plugins-remove", "criConfig", "op: remove of the headers table", (o) => {
    containerd(o).plugins = [{ path: ["io.containerd.grpc.v1.cri", "registry", "headers"], op: "remove" }];
  }),
  oscStep("cri-cgroupfs", "criConfig", "cgroupDriver cgroupfs", (o) => {
    if (o.spec.criConfig) o.spec.criConfig.cgroupDriver = "cgroupfs";
  }),
  oscStep("cri-sandbox", "criConfig", "another sandbox image", (o) => {
    containerd(o).sandboxImage = "registry.k8s.io/pause:3.9";
  }),
  oscStep("cri-sandbox-empty", "criConfig", "sandboxImage empty", (o) => {
    containerd(o).sandboxImage = "";
  }),
  oscStep("readiness-probe", "readiness-probe", "a registry with readinessProbe whose host answers", (o, env) => {
    containerd(o).registries?.push({ upstream: "probe.example.invalid", server: "https://probe.example.invalid", hosts: [{ url: `http://${env.mirror}`, capabilities: ["pull", "resolve"] }], readinessProbe: true });
  }),
  oscStep(
    "readiness-probe-unreachable",
    "readiness-probe",
    "a registry with readinessProbe whose host refuses connections",
    (o) => {
      containerd(o).registries?.push({ upstream: "down.example.invalid", server: "https://down.example.invalid", hosts: [{ url: "http://127.0.0.1:9" }], readinessProbe: true });
    },
    { gnaHold: "Waiting for registries with readiness probes to finish" },
  ),
  oscStep(
    "readiness-probe-unreachable-removed",
    "readiness-probe",
    "that registry leaves, with a change of its own (the OSC before it was that of readiness-probe, whose checksum gardener-node-agent, still waiting for the probe, carries; its reconcile waits up to its 3 min timeout)",
    (o, env) => {
      containerd(o).registries = containerd(o).registries?.filter((r) => r.upstream !== "down.example.invalid") ?? [mirrorRegistry(env)];
      o.metadata.annotations = { "parity.example/touch": "probe-removed" };
    },
    { timeoutMs: 240_000 },
  ),
  // ------------------------------------------------------------ serial and delay
  oscStep("serial", "serial", "the OSC Secret says serial (reconciliation.osc.node-agent.gardener.cloud/serial)", (o) => {
    o.metadata.annotations = { "parity.example/touch": "serial" };
  }, { secretAnnotations: { [serialAnnotation]: "true" } }),
  {
    kind: "event",
    id: "delay-annotation",
    class: "delay",
    what: `the Node annotation ${delayAnnotation}: 3s (as gardener-resource-manager sets it)`,
    act: (w) => annotateNodes(w, { [delayAnnotation]: "3s" }),
    outcome: async () => ({ result: "done", evidence: "an annotation only; the next OSC shows what each agent makes of it" }),
  },
  oscStep("delayed", "delay", "an OSC change under the reconciliation delay (the Secret not serial)", (o) => {
    o.metadata.annotations = { "parity.example/touch": "delayed" };
  }),
  oscStep("delayed-serial", "delay", "an OSC change under the delay with the Secret serial", (o) => {
    o.metadata.annotations = { "parity.example/touch": "delayed-serial" };
  }, { secretAnnotations: { [serialAnnotation]: "true" } }),
  // ------------------------------------------------------------ what gardener-node-agent accepts (issue 20 item 1)
  refusalStep("unknown-field-content", "unknown-fields", "an unknown key under a file's content", (o) => {
    file(o, "/etc/parity/plain.conf").content.transmitCompressed = true;
  }),
  refusalStep("unknown-field-spec", "unknown-fields", "an unknown key under spec", (o) => {
    o.spec.futureField = { enabled: true };
  }),
  refusalStep("unknown-top-level-anchor", "unknown-fields", "a top-level key holding a YAML anchor, and an alias of it", () => {}, {
    render: (o) => `x-defaults: &defaults\n  permissions: 420\n${render(o)}x-use: *defaults\n`,
  }),
  refusalStep("dropin-repeated", "refusals", "the same drop-in name in spec.units and status.extensionUnits for one unit", (o) => {
    unit(o, "parity-a.service").dropIns = [{ name: "60-dup.conf", content: "[Service]\nEnvironment=DUP=spec\n" }];
    o.status?.extensionUnits?.push({ name: "parity-a.service", dropIns: [{ name: "60-dup.conf", content: "[Service]\nEnvironment=DUP=status\n" }] });
  }),
  refusalStep("dropin-not-conf", "refusals", "a drop-in name not ending in .conf", (o) => {
    unit(o, "parity-a.service").dropIns = [{ name: "70-noext", content: "[Service]\nEnvironment=NOEXT=1\n" }];
  }),
  refusalStep("same-path-spec-status", "refusals", "the same path in spec.files and status.extensionFiles", (o) => {
    o.status?.extensionFiles?.push({ path: "/etc/parity/plain.conf", permissions: 0o644, content: inline("from status\n") });
  }),
  refusalStep("registry-cacert-missing", "refusals", "a registry host whose caCerts file does not exist", (o) => {
    containerd(o).registries?.push({ upstream: "ca.example.invalid", server: "https://ca.example.invalid", hosts: [{ url: "https://10.10.10.102:8080", caCerts: ["/etc/parity/missing-ca.crt"] }] });
  }),
  refusalStep("big-osc", "refusals", "an OSC of about 750 KB with more than 300,000 YAML tokens (60,000 metadata annotations)", (o) => {
    o.metadata.annotations = Object.fromEntries(Array.from({ length: 60_000 }, (_, i) => [`p${i}`, "x"]));
  }),
  refusalStep("invalid-yaml", "refusals", "YAML that does not parse (both refuse)", () => {}, { render: () => "spec: [unclosed\n" }),
  oscStep("recover", "no-op", "the last good OSC again, with a change of its own", (o) => {
    o.metadata.annotations = { "parity.example/touch": "recover" };
  }),
  // ------------------------------------------------------------ tokens on disk
  {
    kind: "event",
    id: "token-file-deleted",
    class: "tokens",
    what: "the synced token file is deleted on the node (both agents sync every 15 s)",
    act: (w) => onBoth(w, (t) => t.node.execOk(["rm", "-f", w.env.tokenPath])),
    outcome: doneWhen("the token back on disk", async (w, t) => (await readText(t, w.env.tokenPath)) === "token-v2"),
  },
  oscStep("token-path-in-osc", "tokens", "an OSC file at the token's path, with the token's own bytes", (o, env) => {
    o.spec.files.push({ path: env.tokenPath, permissions: 0o640, content: inline("token-v2") });
  }),
  oscStep(
    "token-path-leaves-osc",
    "tokens",
    "that file leaves the OSC: the agent removes it, and the token sync puts the token back",
    (o, env) => {
      withoutFile(o, env.tokenPath);
    },
    { settled: { what: "the token back on disk", check: async (w, t) => (await readText(t, w.env.tokenPath)) === "token-v2" } },
  ),
  // ------------------------------------------------------------ static pods (gardenadm's control-plane pools)
  oscStep("static-pod-add", "static-pods", "a static pod manifest under /etc/kubernetes/manifests: the checksum waits for its mirror pod, rolled out and Ready", (o) => {
    o.spec.files.push({ path: staticPodPath, permissions: 0o600, content: inline(staticPodManifest("h1")) });
  }),
  mirrorPodStep("mirror-pod-ready", "kubelet's part, played through the API: the mirror pod of each node, with the manifest's hash, Running and Ready", "h1"),
  oscStep("static-pod-change", "static-pods", "the manifest changes (a new hash): the checksum waits again", (o) => {
    file(o, staticPodPath).content = inline(staticPodManifest("h2"));
  }),
  mirrorPodStep("mirror-pod-rolled", "kubelet rolls the mirror pod to the new hash (deleted and created again, as kubelet does)", "h2"),
  oscStep("static-pod-remove", "static-pods", "the manifest leaves the OSC", (o) => {
    withoutFile(o, staticPodPath);
  }),
  // ------------------------------------------------------------ in-place updates (machine-controller-manager played through the API)
  oscStep("inplace-first", "in-place", `spec.inPlaceUpdates (OS ${nodeOs}, kubelet 1.35.4, earlier credential rotations) and kubelet's configuration inline, the OS update command in status: applied as any OSC`, (o) => {
    // Rotations done before: a rotation is a changed lastInitiationTime (gardener-node-agent sees none in one that appears).
    o.spec.inPlaceUpdates = { operatingSystemVersion: nodeOs, kubelet: "1.35.4", credentialsRotation: { certificateAuthorities: { lastInitiationTime: "2026-11-01T10:00:00Z" }, serviceAccountKey: { lastInitiationTime: "2026-11-01T10:00:00Z" } } };
    o.spec.files.push({ path: kubeletConfigPath, permissions: 0o600, content: b64(kubeletConfig) });
    o.status = { ...o.status, inPlaceUpdates: { osUpdate: { command: osUpdateTool, args: [nodeOs] } } };
  }),
  oscStep("inplace-kubelet-minor", "in-place", "kubelet 1.35.4 → 1.36.0 in place: held until the node is drained", (o) => {
    inPlace(o).kubelet = "1.36.0";
  }),
  mcmReady("mcm-ready-kubelet", "kubelet's minor version"),
  mcmResultRead("mcm-read-kubelet"),
  oscStep("inplace-os-update", "in-place", `the OS in place: version ${nextOs}, an update command that succeeds (it updates /etc/os-release)`, (o) => {
    inPlace(o).operatingSystemVersion = nextOs;
    osUpdate(o).args = [nextOs];
  }),
  mcmReady("mcm-ready-os", "the OS update"),
  mcmResultRead("mcm-read-os"),
  oscStep("inplace-os-failing", "in-place", `the OS in place to ${failingOs}, an update command that fails`, (o) => {
    inPlace(o).operatingSystemVersion = failingOs;
    osUpdate(o).args = [failingOs, "--fail"];
  }),
  mcmReady("mcm-ready-os-failing", "the failing OS update"),
  oscStep("inplace-os-reverted", "in-place", `the operator reverts the OS version to ${nextOs} (the node runs it): the failed update ends successful`, (o) => {
    inPlace(o).operatingSystemVersion = nextOs;
    osUpdate(o).args = [nextOs];
  }),
  mcmResultRead("mcm-read-reverted"),
  oscStep("inplace-sa-rotation", "in-place", "the service-account key rotation starts (a new credentialsRotation.serviceAccountKey.lastInitiationTime, unquoted: a YAML timestamp)", (o) => {
    inPlace(o).credentialsRotation = { ...inPlace(o).credentialsRotation, serviceAccountKey: { lastInitiationTime: "2026-11-27T10:00:00Z" } };
  }),
  mcmReady("mcm-ready-sa", "the service-account key rotation"),
  mcmResultRead("mcm-read-sa"),
  oscStep(
    "inplace-ca-rotation",
    "in-place",
    "the certificate authorities' rotation starts (a new credentialsRotation.certificateAuthorities.lastInitiationTime); kubelet has its own credentials (kubeconfig-real and its client certificate)",
    (o) => {
      inPlace(o).credentialsRotation = { ...inPlace(o).credentialsRotation, certificateAuthorities: { lastInitiationTime: "2026-11-27T11:00:00Z" } };
    },
    { before: (w) => onBoth(w, (t) => kubeletWithCredentials(w, t)) },
  ),
  {
    ...mcmReady("mcm-ready-ca", "the CA rotation (the test signs the agents' CSRs, as kube-controller-manager would)"),
    act: async (w) => {
      caSigner = startCsrSigner(w.cluster, (csr) => (csr.spec.username ?? "").startsWith(nodeAgentUserPrefix));
      await onBoth(w, (t) => markReadyForUpdate(w.cluster, t.name));
    },
    after: async () => caSigner?.stop(),
  },
  mcmResultRead("mcm-read-ca"),
  // ------------------------------------------------------------ the hostname
  {
    kind: "event",
    id: "hostname-case",
    class: "hostname",
    what: "the node's hostname changes case only (PAR-…): neither agent restarts (both check every 30 s; the comparison sees a restart as a new invocation of gardener-node-agent.service)",
    act: (w) => onBoth(w, (t) => t.node.execOk(["hostname", t.name.toUpperCase()])),
    outcome: async (_w, t) => {
      // An absence has no event: what proves it is one whole period of both agents' hostname checks.
      await waitFor(`${t.label}: the hostname in capitals`, async () => (await t.node.execOk(["hostname"])).trim() === t.name.toUpperCase(), 5_000, 100);
      await new Promise((r) => setTimeout(r, hostnameCheckPeriodMs + 5_000));
      return { result: "done", evidence: `${(hostnameCheckPeriodMs + 5_000) / 1000} s with the hostname ${t.name.toUpperCase()}` };
    },
  },
  oscStep("hostname-case-files", "hostname", "files for the node's name in capitals and in lower case: only the lower-case one is for this host (both compare as the OSC spells it)", (o, env) => {
    o.spec.files.push(
      ...sides.map((s) => ({ path: `/etc/parity/upper-${env.nodeNames[s]}.conf`, permissions: 0o644, hostName: env.nodeNames[s].toUpperCase(), content: inline("for the capitalised name\n") })),
      ...sides.map((s) => ({ path: `/etc/parity/lower-${env.nodeNames[s]}.conf`, permissions: 0o644, hostName: env.nodeNames[s], content: inline("for the lower-case name\n") })),
    );
  }),
];

/** The empty OSC the scenario starts from. */
export const startOsc = emptyOsc;

/** The steps of the bounded run in `bun run test` (the full list in `bun run parity`): ids, in the scenario's order. */
export const boundedIds = [
  "first-apply",
  "file-content",
  "file-mode",
  "file-nested",
  "file-remove",
  "unit-content",
  "dropin-add",
  "dropin-remove-all",
  "command-stop",
  "command-start",
  "enable-false",
  "enable-true",
  "foreign-dropin",
  "foreign-dropin-remove",
  "extension-units-files",
  "unit-remove",
  "secretref-add",
  "restart-annotation",
  "token-change",
  "no-op",
  "cri-first",
  "imageref-add",
  "cri-cgroupfs",
  "unknown-field-spec",
  "invalid-yaml",
  "recover",
  "token-file-deleted",
  "static-pod-add",
  "mirror-pod-ready",
  "static-pod-remove",
  "inplace-first",
  "inplace-os-update",
  "mcm-ready-os",
  "mcm-read-os",
  "inplace-os-failing",
  "mcm-ready-os-failing",
  "inplace-os-reverted",
];

export function selectSteps(ids: readonly string[]): Step[] {
  const unknown = ids.filter((id) => !steps.some((s) => s.id === id));
  if (unknown.length) throw new Error(`no such parity step: ${unknown.join(", ")}`);
  return steps.filter((s) => ids.includes(s.id));
}

