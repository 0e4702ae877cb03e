// Where trellis deliberately differs from gardener-node-agent, as the differential test sees it: a
// difference that no row matches fails the test; a row that matches nothing in a full run is reported.
// docs/gardener-fields.md renders these rows (renderDeliberate; test/unit/parity-deliberate.test.ts keeps
// the two in sync). Only behaviour trellis keeps on purpose belongs here, never a known defect.
import type { Matcher } from "./match.ts";

export type DeliberateRow = {
  id: string;
  gna: string;
  trellis: string;
  /** Why it is safer, and why gardenlet and machine-controller-manager cannot tell. */
  reason: string;
  /** The differences this row accounts for in the differential run (any one of them); none when the run cannot see it. */
  match: Matcher[];
  /** The test that asserts the difference where the differential run does not see it (the path of the test file and the test's name). */
  assertedBy?: string;
};

/** The runtime_type trellis gives runc in config.toml (row containerd-runtime-type), as it reads in the compared JSON. */
const runcType = ',\\s*"runtime_type":\\s*"io\\.containerd\\.runc\\.v2"';

export const deliberate: DeliberateRow[] = [
  {
    id: "osc-condition",
    gna: "Sets no Node condition about the OSC; an operator reads its log.",
    trellis: "Sets its own Node condition `OperatingSystemConfigApplied` (True/Applied, False/Invalid, ApplyFailed, InPlaceUpdatePending …) naming the OSC's checksum.",
    reason:
      "An operator sees on the Node why an OSC is not applied. A condition of its own type is additive: gardenlet reads the checksum annotation, and machine-controller-manager only the condition types it is configured with (Ready and its `--node-conditions`).",
    match: [{ area: "condition", key: "OperatingSystemConfigApplied", gna: "absent" }],
  },
  {
    id: "warning-events",
    gna: "Logs a failed reconcile (`Reconciler error`) and records no event for it.",
    trellis: "Records a Warning event once per problem (`OSCInvalid`, `OSCApplyFailed`, `OSCUnsupported`, `InPlaceUpdateFailed`) besides its log.",
    reason: "Events are informational: neither gardenlet nor machine-controller-manager reads a Node's events.",
    match: [{ area: "event", key: "Warning/(OSCInvalid|OSCApplyFailed|OSCUnsupported|InPlaceUpdateFailed)", gna: "absent" }],
  },
  {
    id: "unit-events",
    gna: "Records an event for every unit it starts, stops or restarts (`SystemDUnitRestart`, `SystemDUnitStop`, …).",
    trellis: "Records one `OSCApplied` event per applied OSC that names the units it restarted.",
    reason: "The same facts in one event per apply instead of one per unit (fewer API writes on a node with many units); neither gardenlet nor machine-controller-manager reads a Node's events.",
    match: [{ area: "event", key: "Normal/SystemDUnit(Restart|Stop|Start)", trellis: "absent" }],
  },
  {
    id: "first-osc-containerd-restart",
    gna: "Restarts containerd.service on the first OSC it applies, even one without `criConfig` (changes.go: `ConfigFileChanged = true` for a node with no last-applied OSC).",
    trellis: "Restarts containerd only when its configuration, its unit or a drop-in of it changed (or its filePaths).",
    reason: "Restarting the container runtime for nothing interrupts every container's pulls and exec sessions; nothing outside the node sees whether it was restarted.",
    match: [{ step: "first-apply", area: "restarted", key: "containerd\\.service", gna: "restarted", trellis: "not restarted" }],
  },
  {
    id: "token-parent-dir",
    gna: "Fails to sync a token whose path's directory does not exist (afero WriteFile without MkdirAll), every sync period, and logs a reconcile error.",
    trellis: "Creates the missing directories (0755) and writes the token (0640).",
    reason: "The token is where the configuration says; Gardener's own token paths exist already, so on a Gardener node both write the same files, and nothing outside the node reads them.",
    match: [{ area: "file", key: "/var/lib/parity-token-nodir(/token)?", gna: "absent" }],
  },
  {
    id: "restart-on-bytes",
    gna: "Restarts a unit when a file it lists changes in the OSC in any way, even only its encoding (same bytes on disk), and when the unit's own filePaths list changes.",
    trellis: "Restarts a unit when what is on disk for it changes: its unit file or drop-ins, its enablement, or the bytes of a file it lists.",
    reason: "A restart for bytes that did not change interrupts a service for nothing; nothing outside the node sees whether a unit restarted.",
    match: [
      { step: "file-encoding-only", area: "restarted", key: "parity-a\\.service", gna: "restarted", trellis: "not restarted" },
      { step: "unit-filepaths-add", area: "restarted", key: "parity-d\\.service", gna: "restarted", trellis: "not restarted" },
    ],
  },
  {
    id: "secret-ref-follows-secret",
    gna: "Reads a `secretRef` file's Secret only when the OSC's File entry changes: a later change of the Secret's data stays off the node.",
    trellis: "Watches the referenced Secrets and rewrites the file when their data changes.",
    reason: "The file is what the OSC says it is (the Secret's current data); gardenlet reads neither the file nor when it was written.",
    // From the step on which the Secret changed, for as long as the OSC keeps the file.
    match: [{ area: "file", key: "/etc/parity/from-secret", gna: "file 0640 .*", trellis: "file 0640 .*" }],
  },
  {
    id: "containerd-conf-d",
    gna: "Creates /etc/containerd/conf.d (0755), the directory config.toml's `imports` names, when it writes config.toml.",
    trellis: "Leaves it to whoever puts a file there.",
    reason: "containerd's import of `/etc/containerd/conf.d/*.toml` matches nothing either way; an empty directory changes nothing containerd or gardenlet sees.",
    match: [{ area: "file", key: "/etc/containerd/conf\\.d", gna: "dir 0755", trellis: "absent" }],
  },
  {
    id: "containerd-runtime-type",
    gna: "Sets `SystemdCgroup` under `runtimes.runc.options` and nothing else of the runtime.",
    trellis: "Also writes `runtime_type = \"io.containerd.runc.v2\"` for runc when it sets the cgroup driver.",
    reason: "containerd decodes its runtimes entry by entry: a runc table holding only `options` replaces the built-in runc runtime and leaves it without a type, and every Pod fails (\"container.Runtime.Name must be set\"; Debian's config.toml names only the CNI directories). The value is containerd's own default, so a node where gardener-node-agent works behaves the same.",
    match: [{ area: "file", key: "/etc/containerd/config\\.toml", ignoring: runcType }],
  },
  {
    id: "sandbox-image-empty",
    gna: "Writes `sandbox_image = \"\"` when `sandboxImage` is empty, and restarts containerd.",
    trellis: "Keeps the sandbox image config.toml has (an empty `sandboxImage` sets nothing).",
    reason: "An empty pause image leaves containerd unable to start any Pod sandbox; Gardener always renders one, so on a Gardener node both write the same.",
    match: [
      { step: "cri-sandbox-empty", area: "restarted", key: "containerd\\.service", gna: "restarted", trellis: "not restarted" },
      // From then on the two config.toml differ in the sandbox image (and runc's type, row containerd-runtime-type).
      { since: "cri-sandbox-empty", area: "file", key: "/etc/containerd/config\\.toml", ignoring: `${runcType}|"sandbox_image":\\s*"[^"]*"` },
    ],
  },
  {
    id: "certs-d-before-probe",
    gna: "Creates a probed registry's certs.d directory before its readiness probe answers (hosts.toml is written after).",
    trellis: "Creates the directory with its hosts.toml, once the probe answered.",
    reason: "containerd reads an empty certs.d/<registry> directory as no configuration, as a missing one; the checksum waits for the probe on both.",
    match: [{ area: "file", key: "/etc/containerd/certs\\.d/down\\.example\\.invalid", gna: "dir 0755", trellis: "absent" }],
  },
  {
    id: "serial-lease-release",
    gna: "Releases the serial lease by clearing its holder, duration and times.",
    trellis: "Clears the holder and keeps the duration and the times as the record of the last turn.",
    reason: "A lease without a holder is free to both agents whatever its times say (gardener-node-agent takes it when no other holder has renewed it in time); gardenlet does not read it.",
    match: [{ area: "lease", key: "<osc-secret>", gna: "holder= duration=", trellis: "holder= duration=600" }],
  },
  {
    id: "file-of-a-path-given-twice",
    gna: "Writes the entries of a path given twice (spec.files and status.extensionFiles) in turn, so the later one is on disk; when that later entry leaves the OSC and the earlier one stays unchanged, it writes nothing and leaves the later entry's content there.",
    trellis: "Writes the later entry too, and when it leaves, the OSC's remaining entry: the file has what the OSC now says (a unit listing it restarts).",
    reason: "The node converges on the OSC instead of keeping content no OSC has any more; gardenlet reads the checksum, written by both.",
    match: [
      { since: "registry-cacert-missing", area: "file", key: "/etc/parity/plain\\.conf" },
      { step: "registry-cacert-missing", area: "restarted", key: "parity-a\\.service", gna: "not restarted", trellis: "restarted" },
    ],
  },
  {
    id: "in-place-no-restart",
    gna: "After a CA rotation gets a new kubeconfig and restarts itself (reconciler.go ~945–1048).",
    trellis: "Renews its client certificate and switches its client to it in place; no restart.",
    reason: "The same CSR, Lease, checksum and update-result; no Lease gap and no relist of every watch. The old CA stays trusted until the rotation completes.",
    match: [
      { step: "mcm-ready-ca", area: "restarted", key: "gardener-node-agent\\.service", gna: "restarted", trellis: "not restarted" },
      // gardener-node-agent's restart runs its unit check at once; trellis's comes at its period.
      { step: "mcm-ready-ca|mcm-read-ca", area: "condition", key: "SystemdUnitsReady", trellis: "absent" },
    ],
    assertedBy: "test/e2e/in-place.test.ts: the CA rotation test (agent PID unchanged, the audit log shows the new certificate's credential-id)",
  },
  {
    id: "bootstrap-cleanup-after-report",
    gna: "Deletes kubelet's bootstrap kubeconfig and the bootstrap token at each changed-OSC reconcile once the Node exists, before the checksum patch.",
    trellis: "Looks after every reconcile (no-op ones too), between reconciles, once an OSC is applied, the Node exists and kubelet has its own credentials: after the checksum report.",
    reason: "A kubelet without its certificate yet keeps its bootstrap credential; gardenlet and machine-controller-manager read neither file.",
    // After the CA rotation kubelet (a stand-in in the differential run) has not bootstrapped again yet.
    match: [{ area: "file", key: "/var/lib/kubelet/kubeconfig-bootstrap", gna: "absent" }],
    assertedBy: "test/unit/bootstrap-credentials.test.ts; test/e2e/agent.test.ts \"stay until…\"",
  },
  {
    id: "sa-rotation-awaits-resync",
    gna: "Sends its token controller an event and completes the update at once.",
    trellis: "Awaits the token resync (Secrets read again, files written), warns about problems, never fails the update for them.",
    reason: "Token files are fresh before Pods are deleted and `successful` is set; machine-controller-manager sees the same result.",
    match: [],
    assertedBy: "test/unit/in-place-updater.test.ts: the SA-key rotation test",
  },
  {
    id: "in-place-carry",
    gna: "Diffs a new OSC against the last completed one (last-applied is written after the in-place work).",
    trellis: "Diffs against the last applied OSC plus the parts an unfinished update left undone; the OS part from the node's version.",
    reason: "The same parts in practice; where they differ (a setting changed and changed back mid-update) trellis does one more health check, never less work.",
    match: [],
    assertedBy: "test/unit/in-place.test.ts: carryOver",
  },
  {
    id: "in-place-fresh-node",
    gna: "Decides on its cached Node whether machine-controller-manager waits for a result.",
    trellis: "Confirms the wait on a fresh GET of the Node before deleting Pods.",
    reason: "A watch copy behind the agent's own report would otherwise delete Pods that just restarted; the same outcome otherwise.",
    match: [],
    assertedBy: "test/unit/in-place-updater.test.ts: the lagging watch copy",
  },
  {
    id: "cpu-manager-state-after-writes",
    gna: "Removes `cpu_manager_state` right after kubelet's unit is written, inside its units loop.",
    trellis: "Removes it after all of the plan's writes, before any unit is stopped or restarted.",
    reason: "The same window before kubelet restarts under the new policy.",
    match: [],
    assertedBy: "test/unit/in-place.test.ts: removingCpuManagerState",
  },
  {
    id: "internal-ip-events",
    gna: "Records InternalIP recovery under reason `kubelet` (events.k8s.io) and updates the whole Node status.",
    trellis: "Records `NodeAddressesMissing`, `NodeInternalIPRestored`, `NodeInternalIPRestoreFailed` (core/v1) and merge-patches `status.addresses` with a resourceVersion precondition.",
    reason: "Neither gardenlet nor machine-controller-manager reads these events; the same resulting object and the same conflict behaviour.",
    match: [],
    assertedBy: "test/integration/health.test.ts: the InternalIP tests",
  },
  {
    id: "labels-no-empty-patch",
    gna: "Sends a `{}` patch of the role and zone labels at every reconcile.",
    trellis: "Patches them only when they differ.",
    reason: "No API load for nothing; the same labels.",
    match: [],
    assertedBy: "test/e2e/agent.test.ts: an OSC whose unit fails still sets role and zone",
  },
  {
    id: "containerd-empty-config",
    gna: "Patches an empty config.toml as config version 1.",
    trellis: "Patches containerd's default configuration instead.",
    reason: "On containerd 1.x none of the version-1 settings would take effect; gardenlet only reads the checksum.",
    match: [],
    assertedBy: "test/unit/containerd-config.test.ts: an empty current file",
  },
  {
    id: "containerd-integers",
    gna: "Writes every JSON number of a plugin's values as a float (`3.0`).",
    trellis: "Writes whole numbers as TOML integers.",
    reason: "containerd 1.6 refuses to start on `3.0` for an integer setting.",
    match: [],
    assertedBy: "test/unit/containerd-config.test.ts: whole numbers become integers",
  },
  {
    id: "containerd-legacy-registry",
    gna: "Writes `registry.mirrors` or `registry.configs.<host>.tls` next to `config_path`.",
    trellis: "Refuses the OSC, naming the field.",
    reason: "Unsafe: containerd's CRI plugin does not start with both, and the node runs no pods; gardenlet sees a missing checksum either way.",
    match: [],
    assertedBy: "test/unit/containerd-config.test.ts: legacy registry next to config_path",
  },
  {
    id: "containerd-version-asked-when-needed",
    gna: "Asks containerd's version at every reconcile and fails while it does not answer.",
    trellis: "Asks only for a config of version 3 or more (where bin_dirs depends on it).",
    reason: "The same result whenever gardener-node-agent succeeds; a version-2 node is not blocked by a stopped containerd.",
    match: [],
    assertedBy: "test/unit/containerd-version.test.ts: a version 2 config",
  },
  {
    id: "dropin-dir-spares-osc-files",
    gna: "Removes a changed unit's whole `.d` after the files are written, deleting an OSC file inside it, never rewritten.",
    trellis: "Spares a `.d` that holds, or is, a path the OSC writes.",
    reason: "The OSC's file stays on disk; an edge case nothing outside the node sees.",
    match: [],
    assertedBy: "test/unit/plan.test.ts: a drop-in that becomes a plain file is kept",
  },
  {
    id: "dropin-dir-hostile",
    gna: "Removes the `.d` tree with `os.RemoveAll`.",
    trellis: "Refuses to empty directories other users can write in, other mounts, trees deeper than 32 (the apply fails and is retried).",
    reason: "Root never deletes what another user moved in; pathological cases only.",
    match: [],
    assertedBy: "test/unit/files.test.ts: removeTree; test/integration/files-crash.test.ts: the mount test",
  },
  {
    id: "registry-probe-on-disk",
    gna: "Probes a registry again when its configuration differs from the last applied OSC's.",
    trellis: "Probes when the hosts.toml on disk differs from the one rendered.",
    reason: "The same for added or changed registries; a hand-edited or deleted hosts.toml is probed before it is written again.",
    match: [],
    assertedBy: "test/unit/registry-probe-ca.test.ts: which registries are probed",
  },
  {
    id: "report-waits-between-reconciles",
    gna: "Blocks its worker inside the reconcile on the registry probes and static pods, then errors with backoff.",
    trellis: "Applies, returns, and looks again every 2 s / 5 s as separate reconciles, saying what it waits for in its condition.",
    reason: "The checksum appears under the same conditions; a newer OSC is never held up behind the wait.",
    match: [],
    assertedBy: "test/e2e/agent-gates.test.ts",
  },
  {
    id: "serial-lease-node-missing",
    gna: "Holds the serial lease while the Node is missing and renews it every 5 s.",
    trellis: "Holds it and renews it at reconciles only (periodic, or when the Node appears).",
    reason: "A node whose kubelet never registers stops blocking the pool after the lease's 600 s.",
    match: [],
    assertedBy: "test/unit/osc-gates.test.ts: kubelet has not registered the Node yet",
  },
  {
    id: "foreign-agent-binary",
    gna: "Installs whatever binary the OSC names for itself and restarts into it.",
    trellis: "Installs a binary that is not trellis only if it starts on this machine (`--version`); otherwise refuses the OSC with a Warning.",
    reason: "A binary for another architecture or libc would leave the node without a working agent; gardenlet sees no new checksum either way.",
    match: [],
    assertedBy: "test/unit/self-update.test.ts: another agent that does not start here is refused",
  },
  {
    id: "adopt-running-units",
    gna: "With no record of the last applied OSC, restarts every unit.",
    trellis: "Adopts a unit with no unit file that systemd already runs as asked, nothing of it written, without a restart.",
    reason: "A takeover restarts nothing the OSC did not change; the checksum is written as before.",
    match: [],
    assertedBy: "test/unit/plan.test.ts: taking over a node; test/e2e/gardener-round-trip.test.ts",
  },
  {
    id: "osc-checker-events",
    gna: "At each start compares the last-applied OSC with the disk and emits Warning events (FileMissing, FileMismatch, UnitMismatch, DropInMismatch, UnitEnableMismatch, DependencyMissing …; bootstrappers/file_consistency_bootstrapper.go), repairing nothing; a file whose hostName names another host, never written here, is reported FileMissing.",
    trellis: "Watches the OSC's files and units all the time (controllers/drift.ts): a change is repaired and reported (DriftRepaired; DriftDetected in mode report), at start (the node's check right after the first reconcile, which trusts the Node and its record as gardener-node-agent's trusts the Node) and after; files for another host are not looked at.",
    reason: "The node converges where gardener-node-agent only warns, and no false warning for another host's files; events are for people, gardenlet and machine-controller-manager read none of them.",
    match: [{ area: "event", key: "Warning/(FileMissing|FileMismatch|FileReadError|FileDecodeError|FileUnsupportedEncoding|UnitFileMissing|UnitMismatch|DropInMissing|DropInMismatch|UnitEnableMismatch|DependencyMissing)", gna: "present", trellis: "absent" }],
    assertedBy: "test/e2e/drift.test.ts",
  },
  {
    id: "os-update-reason-bounded",
    gna: "Puts the OS update command's whole output into the Node annotation node.machine.sapcloud.io/update-failed-reason.",
    trellis: "The same text with the output's last 2,000 characters.",
    reason: "A Node's annotations are bounded (256 KiB in all): a chatty update tool must not make the failure's report fail; machine-controller-manager shows the reason, and the end of the output is where a tool says why it failed.",
    match: [],
    assertedBy: "test/unit/os-update.test.ts: only the output's last 2,000 characters are kept",
  },
  {
    id: "agent-config-rate-limit",
    gna: "Applies clientConnection.qps/burst only to a client built from clientConnection.kubeconfig or $KUBECONFIG, and to its bootstrap-token client; with its own credentials kubeconfig it runs at client-go's defaults (5/s, burst 10, per resource kind's client).",
    trellis: "Keeps one token bucket of the configured qps/burst (Gardener's defaults 50/100 for 0) on every request, watch starts included.",
    reason: "The limit an operator writes holds on every connection; gardenlet and machine-controller-manager see objects, never the pacing of one node's few requests.",
    match: [],
    assertedBy: "test/e2e/agent-config-fields.test.ts: its requests keep clientConnection's rate limit; test/unit/rate-limit.test.ts",
  },
  {
    id: "agent-config-json-only",
    gna: "Speaks protobuf (its default) or what contentType/acceptContentTypes name.",
    trellis: "Speaks JSON whatever they say; a value asking for another encoding is accepted and named as not acted on (journal at every start, check-config, trellis_config_not_acted_on).",
    reason: "The same objects and semantics over the wire; only the bytes differ.",
    match: [],
    assertedBy: "test/unit/agent-config.test.ts: protobuf; test/e2e/agent-config-fields.test.ts: it starts, applies an OSC, and its journal names each value it does not act on",
  },
  {
    id: "agent-config-no-pprof",
    gna: "Serves /debug/pprof on its metrics port when debugging.enableProfiling is true (and the block profile with enableContentionProfiling).",
    trellis: "Serves no profiling endpoint; the values are accepted and named as not acted on.",
    reason: "An operator's tool that neither gardenlet nor machine-controller-manager calls; one endpoint fewer exposing the process's internals.",
    match: [],
    assertedBy: "test/unit/agent-config.test.ts: profiling, profiling with contention; test/e2e/agent-config-fields.test.ts",
  },
  {
    id: "agent-config-text-log-format",
    gna: "logFormat text: zap's console line (local time, level, logger name, message, the fields as JSON).",
    trellis: "logFormat text: UTC time, level, message, the fields as compact JSON, tab-separated; a line break in the message escaped (one journal record per entry).",
    reason: "Read by people and journald only.",
    match: [],
    assertedBy: "test/unit/log.test.ts: logFormat text; test/e2e/agent-config-fields.test.ts",
  },
  {
    id: "unit-jobs-in-order",
    gna: "Starts all unit commands of an apply at once (`flow.Parallel` in executeUnitCommands); systemd orders their jobs by the units' own dependencies.",
    trellis: "Runs the plan's unit jobs one after another, each to its end, its progress persisted after each.",
    reason:
      "A kill -9 during an apply resumes at the job it interrupted, restarting nothing twice, and a failed job is known before the next one starts. systemd's ordering decides what starts first in both: with Gardener's worker OSC kubelet starts right after the CA update (its `Before=kubelet.service`) under either agent (bench:boot-timeline). Nothing outside the node sees the order; the end state is the same.",
    match: [],
    assertedBy: "test/chaos/scenarios/agent-kill9.ts: no unit restarted that was not owed",
  },
  {
    id: "unit-check-after-first-reconcile",
    gna: "Checks the managed units at its start (the Node's create event) and every syncPeriod after; on a fresh node that first check finds no last-applied OSC, so `SystemdUnitsReady` appears up to a syncPeriod after the first apply.",
    trellis: "Runs its first unit check once its first reconcile ended (10 s after its start at the latest), then every syncPeriod: on a fresh node `SystemdUnitsReady` appears right after the first apply.",
    reason:
      "The same check, reported sooner: gardenlet's care controller reads `SystemdUnitsReady` (and skips a node without it), so a unit that failed in the first apply is seen a syncPeriod earlier. Checking after the first reconcile keeps the units' D-Bus queries off a slow CPU while the reconcile a start or a first boot waits for runs (issue 21).",
    match: [{ step: "first-apply", area: "condition", key: "SystemdUnitsReady", gna: "absent" }],
  },
  {
    id: "glibc",
    gna: "A static Go binary: runs on any Linux.",
    trellis: "Needs glibc 2.17 or newer; install.sh refuses a machine without it before installing anything.",
    reason: "Not safer, a requirement of Bun's executable; only a musl or very old machine image sees it, at install time.",
    match: [],
    assertedBy: "test/e2e/glibc.test.ts; test/unit/install-script.test.ts",
  },
];

const cell = (s: string) => s.replace(/\|/g, "\\|").replace(/\n/g, " ");

/** The "Deliberate differences" section of docs/gardener-fields.md, between its markers. */
export function renderDeliberate(rows: DeliberateRow[] = deliberate): string {
  return [
    "| id | what gardener-node-agent does | what trellis does | why safer, and invisible to gardenlet and machine-controller-manager | asserted by: the differences it accounts for in the differential run (test/parity/deliberate.ts), or the test named |",
    "|---|---|---|---|---|",
    ...rows.map((r) => `| ${cell(r.id)} | ${cell(r.gna)} | ${cell(r.trellis)} | ${cell(r.reason)} | ${cell([...r.match.map((m) => `\`${JSON.stringify(m)}\``), ...(r.assertedBy ? [r.assertedBy] : [])].join(" or "))} |`),
  ].join("\n");
}

export const docMarkers = { begin: "<!-- parity-deliberate:begin (rendered from test/parity/deliberate.ts) -->", end: "<!-- parity-deliberate:end -->" } as const;
