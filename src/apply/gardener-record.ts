// What gardener-node-agent keeps on the node about the OSC it applied, as trellis leaves it after an apply,
// so that gardener-node-agent — when an operator goes back to it — changes exactly what its next OSC changes
// against the one trellis applied (docs/gardener-landscape.md):
// - last-applied-osc.yaml: the OSC as gardener-node-agent applies it, that is with the drop-in it adds to
//   containerd.service itself when the OSC configures containerd (30-env_config.conf, its PATH; trellis writes
//   the same drop-in). It diffs the next OSC against this record; without the drop-in there it takes
//   containerd.service for changed and restarts containerd at its first apply after trellis.
// - last-computed-osc-changes.yaml: its own record of an apply it began and had not finished (it restarts
//   itself halfway through the apply that installs trellis, before it restarts the other units that apply
//   changed and removes the files it dropped), resumed when the same OSC comes to it again. trellis, taking
//   the node over in that apply, does what the record still owes (gardenerPending); once trellis completed
//   an apply it describes nothing left to do and is removed: left there, gardener-node-agent would take that
//   OSC, should it come back, for applied already and keep trellis's binary out.
import * as v from "valibot";
import { stringify } from "yaml";
import type { Desired } from "../api/desired.ts";
import { paths } from "../api/paths.ts";
import { looseObject } from "../api/shapes.ts";
import { parseYaml } from "../api/yaml.ts";
import type { Files } from "../host/files.ts";
import { containerdEnvDropIn } from "../plan/containerd.ts";

type Unit = { name?: unknown; dropIns?: unknown[] };
type Doc = { spec?: { units?: Unit[]; criConfig?: { name?: unknown; containerd?: unknown } } };

/** last-applied-osc.yaml for `oscYaml` applied as `desired`: gardener-node-agent's own record of it. */
export function gardenerLastApplied(oscYaml: Uint8Array | string, desired: Desired): Uint8Array | string {
  // Without the drop-in the record is the OSC as it came: no parse (100 ms of CPU for a 1 MiB OSC, at every new checksum).
  const dropIn = desired.units.find((u) => u.name === containerdEnvDropIn.unit)?.dropIns.find((d) => d.name === containerdEnvDropIn.name);
  if (!dropIn) return oscYaml;
  const text = typeof oscYaml === "string" ? oscYaml : new TextDecoder().decode(oscYaml);
  const parsed = parseYaml(text, "last-applied-osc.yaml");
  if (!parsed.ok || typeof parsed.value !== "object" || parsed.value === null) return oscYaml;
  const doc = parsed.value as Doc;
  // HasContainerdConfiguration, then addContainerdEnvironmentDropIn (operatingsystemconfig/containerd.go):
  // appended to the first containerd.service of spec.units, else a unit of its own at their end.
  const cri = doc.spec?.criConfig;
  if (cri?.name !== "containerd" || cri.containerd === undefined || cri.containerd === null) return oscYaml;
  const added = { name: dropIn.name, content: dropIn.content };
  const units = doc.spec?.units ?? [];
  const unit = units.find((u) => u.name === containerdEnvDropIn.unit);
  if (unit) unit.dropIns = [...(unit.dropIns ?? []), added];
  else units.push({ name: containerdEnvDropIn.unit, dropIns: [added] });
  doc.spec = { ...doc.spec, units };
  // YAML 1.1, as the OSC is read back (and as go-yaml writes it): a string that reads as a timestamp there
  // (credentialsRotation.*.lastInitiationTime) is quoted, else it came back a Date and the OSC was refused.
  return stringify(doc, { lineWidth: 0, version: "1.1" });
}

// The part of gardener-node-agent's operatingSystemConfigChanges (osc_changes.go) that says what it still owes.
const ChangesSchema = looseObject({
  operatingSystemConfigChecksum: v.string(),
  units: v.optional(looseObject({ commands: v.optional(v.nullable(v.array(looseObject({ name: v.string(), command: v.string() })))) })),
  files: v.optional(looseObject({ deleted: v.optional(v.nullable(v.array(looseObject({ path: v.string() })))) })),
  containerd: v.optional(looseObject({ configFileChanged: v.optional(v.boolean()) })),
});

/** What gardener-node-agent's unfinished apply of this very OSC still owes the node: units to restart, files to remove. */
export type GardenerPending = { restarts: string[]; removals: string[] };

/**
 * The work gardener-node-agent left undone in its apply of the OSC with `checksum` (last-computed-osc-changes.yaml),
 * or undefined: no such record, one of another OSC, or one that cannot be read (then nothing is owed that
 * trellis's own plan would not see).
 */
export async function gardenerPending(files: Files, checksum: string): Promise<GardenerPending | undefined> {
  const bytes = await files.read(paths.lastComputedOscChanges).catch(() => undefined);
  if (!bytes) return undefined;
  const parsed = parseYaml(new TextDecoder().decode(bytes), paths.lastComputedOscChanges);
  const changes = parsed.ok ? v.safeParse(ChangesSchema, parsed.value) : undefined;
  if (!changes?.success || changes.output.operatingSystemConfigChecksum !== checksum) return undefined;
  const { units, files: changed, containerd } = changes.output;
  const restarts = (units?.commands ?? []).filter((c) => c.command === "restart").map((c) => c.name);
  if (containerd?.configFileChanged && !restarts.includes(containerdEnvDropIn.unit)) restarts.push(containerdEnvDropIn.unit);
  return { restarts, removals: (changed?.deleted ?? []).map((f) => f.path) };
}
