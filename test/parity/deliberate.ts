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
  /** The differences this row accounts for (any one of them). */
  match: Matcher[];
};

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
    id: "restart-on-listed-file-removal",
    gna: "Leaves a unit running when a file it lists leaves the OSC (and is deleted).",
    trellis: "Restarts the unit: the file it reads is gone.",
    reason: "The unit then runs on what is on disk, as after any other change of a file it lists; nothing outside the node sees the restart.",
    match: [{ step: "file-remove-listed", area: "restarted", key: "parity-d\\.service", gna: "not restarted", trellis: "restarted" }],
  },
  {
    id: "secret-ref-follows-secret",
    gna: "Reads a `secretRef` file's Secret only when the OSC's File entry changes: a later change of the Secret's data stays off the node.",
    trellis: "Watches the referenced Secrets and rewrites the file when their data changes.",
    reason: "The file is what the OSC says it is (the Secret's current data); gardenlet reads neither the file nor when it was written.",
    // From the step on which the Secret changed, for as long as the OSC keeps the file.
    match: [{ area: "file", key: "/etc/parity/from-secret", gna: "file 0640 .*", trellis: "file 0640 .*" }],
  },
];

const cell = (s: string) => s.replace(/\|/g, "\\|").replace(/\n/g, " ");

/** The "Deliberate differences" section of docs/gardener-fields.md, between its markers. */
export function renderDeliberate(rows: DeliberateRow[] = deliberate): string {
  return [
    "| id | what gardener-node-agent does | what trellis does | why safer, and invisible to gardenlet and machine-controller-manager | the difference it accounts for (test/parity/deliberate.ts) |",
    "|---|---|---|---|---|",
    ...rows.map((r) => `| ${cell(r.id)} | ${cell(r.gna)} | ${cell(r.trellis)} | ${cell(r.reason)} | ${cell(r.match.map((m) => `\`${JSON.stringify(m)}\``).join(" or "))} |`),
  ].join("\n");
}

export const docMarkers = { begin: "<!-- parity-deliberate:begin (rendered from test/parity/deliberate.ts) -->", end: "<!-- parity-deliberate:end -->" } as const;
