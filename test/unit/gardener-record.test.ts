// What trellis leaves of gardener-node-agent's records after an apply (src/apply/gardener-record.ts,
// src/apply/state-store.ts): last-applied-osc.yaml as gardener-node-agent writes it — the OSC with the
// containerd.service drop-in it adds itself (operatingsystemconfig/containerd.go addContainerdEnvironmentDropIn)
// — trellis's own copy as the Secret had it, and no last-computed-osc-changes.yaml; what that record of
// gardener-node-agent's unfinished apply owes, done by trellis's plan of the same OSC. That gardener-node-agent
// then restarts nothing the next OSC does not change is tested on a real node (test/e2e/gardener-round-trip.test.ts).
import { describe, expect, test } from "bun:test";
import { mkdtempSync } from "node:fs";
import { parse, stringify } from "yaml";
import { type Desired, parseOscBytes, sha256Hex } from "../../src/api/desired.ts";
import { paths } from "../../src/api/paths.ts";
import { gardenerLastApplied, gardenerPending } from "../../src/apply/gardener-record.ts";
import { planForNode } from "../../src/apply/observe.ts";
import { createStateStore } from "../../src/apply/state-store.ts";
import { emptyOwned } from "../../src/api/state.ts";
import { createFiles } from "../../src/host/files.ts";
import { runDir } from "../harness/exec.ts";

const envContent = '[Service]\nEnvironment="PATH=/var/bin/containerruntimes:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"\n';
const envDropIn = { name: "30-env_config.conf", content: envContent };
/** What desiredForNode makes of an OSC with containerd: containerd.service carries trellis's env drop-in. */
const desired: Desired = {
  units: [{ name: "containerd.service", enable: true, dropIns: [{ ...envDropIn, sha256: sha256Hex(envContent) }], filePaths: ["/etc/containerd/config.toml"] }],
  files: [],
  unsupported: [],
  keep: [],
};
const criConfig = { name: "containerd", cgroupDriver: "systemd", containerd: { sandboxImage: "registry.k8s.io/pause:3.10" } };
const osc = (units: unknown[], cri: unknown = criConfig) => stringify({ apiVersion: "extensions.gardener.cloud/v1alpha1", kind: "OperatingSystemConfig", metadata: {}, spec: { units, files: [{ path: "/etc/a", content: { inline: { data: "x".repeat(200) } } }], ...(cri ? { criConfig: cri } : {}) }, status: {} });
const unitsOf = (out: Uint8Array | string) => parse(typeof out === "string" ? out : new TextDecoder().decode(out)).spec.units;

describe("last-applied-osc.yaml, as gardener-node-agent records the OSC it applied", () => {
  test("containerd.service of the OSC gets the env drop-in after its own; everything else is as it was", () => {
    const input = osc([{ name: "kubelet.service", content: "[Service]\n" }, { name: "containerd.service", dropIns: [{ name: "10-limits.conf", content: "[Service]\nLimitNOFILE=1\n" }], filePaths: ["/etc/a"] }]);
    const out = gardenerLastApplied(input, desired);
    expect(unitsOf(out)).toEqual([{ name: "kubelet.service", content: "[Service]\n" }, { name: "containerd.service", dropIns: [{ name: "10-limits.conf", content: "[Service]\nLimitNOFILE=1\n" }, envDropIn], filePaths: ["/etc/a"] }]);
    const { spec, ...rest } = parse(String(out));
    const { spec: inputSpec, ...inputRest } = parse(input);
    expect(rest).toEqual(inputRest);
    expect({ ...spec, units: [] }).toEqual({ ...inputSpec, units: [] });
  });

  test("read back as the OSC is read (YAML 1.1), it is the OSC it was: a string that reads as a timestamp there stays a string", async () => {
    // Written as YAML 1.2 the string came back a Date, and the next in-place update refused the OSC (e2e in-place, CA rotation).
    const rotation = { serviceAccountKey: { lastInitiationTime: "2026-11-25T12:00:00Z" } };
    const input = stringify({ ...parse(osc([{ name: "kubelet.service" }])), spec: { ...parse(osc([{ name: "kubelet.service" }])).spec, inPlaceUpdates: { operatingSystemVersion: "1", credentialsRotation: rotation } } }, { version: "1.1" });
    const out = gardenerLastApplied(input, desired);
    const read = parseOscBytes(typeof out === "string" ? new TextEncoder().encode(out) : out, "last-applied-osc.yaml");
    expect(read.ok && read.value.spec.inPlaceUpdates?.credentialsRotation).toEqual(rotation);
  });

  test("an OSC without containerd.service gets a unit of that name with only the drop-in, after its units", () => {
    expect(unitsOf(gardenerLastApplied(osc([{ name: "kubelet.service" }]), desired))).toEqual([{ name: "kubelet.service" }, { name: "containerd.service", dropIns: [envDropIn] }]);
  });

  test.each([
    ["no criConfig", null],
    ["another CRI", { name: "cri-o" }],
    ["containerd without its containerd section", { name: "containerd" }],
  ])("%s: the OSC's bytes, unchanged (gardener-node-agent adds nothing)", (_, cri) => {
    const input = new TextEncoder().encode(osc([{ name: "kubelet.service" }], cri));
    expect(gardenerLastApplied(input, desired)).toBe(input);
  });

  test("long values stay on one line: the record is read back by Go's YAML decoder, not folded", () => {
    const out = String(gardenerLastApplied(osc([]), desired));
    expect(out).toContain(`data: ${"x".repeat(200)}\n`);
  });
});

describe("an apply's record", () => {
  test("trellis's copy is the Secret's bytes, gardener-node-agent's is its own shape, and its unfinished apply is gone", async () => {
    const files = createFiles(mkdtempSync(`${runDir("gardener-record")}/root-`));
    await files.writeAtomic(paths.lastComputedOscChanges, "operatingSystemConfigChecksum: abc\nmustRestartNodeAgent: false\n", 0o600);
    const input = osc([{ name: "containerd.service" }]);
    await createStateStore(files).recordApplied(input, desired);
    expect(new TextDecoder().decode(await files.read(paths.appliedOsc))).toBe(input);
    expect(unitsOf(new TextDecoder().decode(await files.read(paths.lastAppliedOsc)))).toEqual([{ name: "containerd.service", dropIns: [envDropIn] }]);
    expect(await files.read(paths.lastComputedOscChanges)).toBeUndefined();
  });
});

// gardener-node-agent's record after it wrote the OSC's files and restarted itself, the other units still owed
// (as it persisted one in test/e2e/gardener-round-trip.test.ts, with work left).
const changesOf = (checksum: string) => `containerd:
  configFileChanged: true
  registries: {}
files:
  deleted:
  - content:
      inline:
        data: old
    path: /etc/old.conf
inPlaceUpdates:
  kubelet:
    config: false
mustRestartNodeAgent: false
operatingSystemConfigChecksum: ${checksum}
units:
  commands:
  - command: restart
    name: kubelet.service
  - command: stop
    name: valitail.service
  - command: ""
    name: gardener-user.path
`;

describe("gardener-node-agent's unfinished apply of the same OSC", () => {
  const checksum = "c".repeat(64);
  const kubelet = "[Service]\nExecStart=/opt/bin/kubelet\n";
  const node = async (changes?: string) => {
    const files = createFiles(mkdtempSync(`${runDir("gardener-record")}/root-`));
    if (changes) await files.writeAtomic(paths.lastComputedOscChanges, changes, 0o600);
    await files.writeAtomic("/etc/old.conf", "old", 0o644);
    await files.writeAtomic("/etc/systemd/system/kubelet.service", kubelet, 0o600);
    return files;
  };
  const kubeletDesired: Desired = {
    units: [{ name: "kubelet.service", enable: true, content: kubelet, sha256: sha256Hex(kubelet), dropIns: [], filePaths: [] }, desired.units[0] as Desired["units"][number]],
    files: [],
    unsupported: [],
    keep: [],
  };

  test("what it owes: the restarts (containerd's for its changed configuration too), and the files it would remove", async () => {
    expect(await gardenerPending(await node(changesOf(checksum)), checksum)).toEqual({ restarts: ["kubelet.service", "containerd.service"], removals: ["/etc/old.conf"] });
  });

  test.each([
    ["of another OSC", changesOf("d".repeat(64))],
    ["unreadable", "units: [not a record"],
    ["none", undefined],
  ])("a record %s owes nothing", async (_, changes) => {
    expect(await gardenerPending(await node(changes), checksum)).toBeUndefined();
  });

  test("trellis's plan of that OSC restarts the units it owes, though their files are in place, and removes the files it dropped", async () => {
    const files = await node(changesOf(checksum));
    const { plan } = await planForNode({ desired: kubeletDesired, checksum, owned: emptyOwned(), files, systemd: undefined, selfUnit: "gardener-node-agent.service" });
    const steps = plan.steps.map((s) => `${s.kind} ${"unit" in s ? s.unit : "path" in s ? s.path : ""}: ${s.reason}`);
    expect(steps).toContain("remove /etc/old.conf: removed from the OSC");
    expect(steps).toContain("restart kubelet.service: gardener-node-agent changed it and restarted itself before restarting it (owed by an unfinished apply)");
    expect(steps.filter((s) => s.startsWith("write"))).toEqual(["write /etc/systemd/system/containerd.service.d/30-env_config.conf: new"]);
    // Without the record, kubelet's unit file (in place) is adopted and nothing restarts it.
    const alone = await planForNode({ desired: kubeletDesired, checksum, owned: emptyOwned(), files: await node(), systemd: undefined, selfUnit: "gardener-node-agent.service" });
    expect(alone.plan.steps.filter((s) => s.kind === "restart" && s.unit === "kubelet.service")).toEqual([]);
  });
});
