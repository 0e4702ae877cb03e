// The differential test's scenario: a sequence of OSC Secrets and node events that both twin nodes go
// through, in the scenario classes of gardener-node-agent's own integration tests
// (test/integration/nodeagent/operatingsystemconfig in gardener/gardener) and the cases of trellis
// issue 20. Each OSC step derives its OSC from the last one both agents were meant to apply; a
// one-off step (a refusal case) does not carry over, so the step after it starts from the good one.
import { CoreV1Api, PatchStrategy, setHeaderOptions } from "@kubernetes/client-node";
import type { Outcome } from "./diff.ts";
import { b64, containerd, emptyOsc, file, inline, type Osc, render, serviceUnit, unit, withoutFile, withoutUnit } from "./osc.ts";
import { settle } from "./settle.ts";
import { type Env, foreignUnit, putSecret, sides, toolImage, type Twin, type World } from "./twins.ts";

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
  | "no-op";

type StepBase = { id: string; class: StepClass; what: string };
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
  /** What says that agent is done with the event (its own account, or what it wrote). */
  outcome(w: World, t: Twin, sinceMs: number): Promise<Outcome>;
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

/** Waits until `read` of each node's own view says the event is handled. */
const doneWhen = (what: string, check: (w: World, t: Twin) => Promise<boolean>) => (w: World, t: Twin) =>
  settle(t, what, async () => ((await check(w, t)) ? { result: "done" as const, evidence: what } : undefined));

const readText = (t: Twin, path: string) => t.node.readFile(path).catch(() => undefined);

const restartAnnotation = "worker.gardener.cloud/restart-systemd-services";
const delayAnnotation = "node-agent.gardener.cloud/reconciliation-delay";
const serialAnnotation = "reconciliation.osc.node-agent.gardener.cloud/serial";

async function annotateNodes(w: World, annotations: Record<string, string | null>): Promise<void> {
  const core = w.cluster.admin().makeApiClient(CoreV1Api);
  await Promise.all(
    sides.map((s) => core.patchNode({ name: w.twins[s].name, body: { metadata: { annotations } } }, setHeaderOptions("Content-Type", PatchStrategy.MergePatch))),
  );
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
];

export function selectSteps(ids: readonly string[]): Step[] {
  const unknown = ids.filter((id) => !steps.some((s) => s.id === id));
  if (unknown.length) throw new Error(`no such parity step: ${unknown.join(", ")}`);
  return steps.filter((s) => ids.includes(s.id));
}

