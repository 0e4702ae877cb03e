// The rules of makePlan (src/plan/plan.ts): desired state + what trellis owns + what is on the node →
// the steps of an apply. Inputs are built from small desired states; "before" states are what a
// complete apply of an earlier OSC left on the node (ownedFrom + diskFrom + unitsFrom).
import { describe, expect, test } from "bun:test";
import * as v from "valibot";
import { driftInSteps } from "../../src/plan/drift.ts";
import { type Desired, type DesiredFile, type DesiredUnit, sha256Hex, type UnitCommand } from "../../src/api/desired.ts";
import { dropInPath, unitFilePath } from "../../src/api/paths.ts";
import { emptyOwned, type Owned, type OwnedUnit } from "../../src/api/state.ts";
import { adoptMatching, ownedAfter, settleOwned, unitSpecDigest } from "../../src/plan/owned.ts";
import { makePlan, unitFileMode } from "../../src/plan/plan.ts";
import { type Plan, PlanSchema, type Step } from "../../src/api/plan.ts";
import type { Observed } from "../../src/plan/types.ts";
import { prng } from "../harness/prng.ts";

const SELF = "gardener-node-agent.service";
const CHECKSUM = "5e1f0000000000000000000000000000000000000000000000000000000000ab";

// ---------------------------------------------------------------------------------------------
// Builders

type UnitSpec = { content?: string; enable?: boolean; command?: UnitCommand; dropIns?: Record<string, string>; filePaths?: string[] };

function unit(name: string, s: UnitSpec = {}): DesiredUnit {
  return {
    name,
    ...(s.content !== undefined ? { content: s.content, sha256: sha256Hex(s.content) } : {}),
    enable: s.enable ?? true,
    ...(s.command ? { command: s.command } : {}),
    dropIns: Object.entries(s.dropIns ?? {}).map(([n, c]) => ({ name: n, content: c, sha256: sha256Hex(c) })),
    filePaths: s.filePaths ?? [],
  };
}

function file(path: string, content: string, mode = 0o600): DesiredFile {
  const bytes = new TextEncoder().encode(content);
  return { path, mode, content: bytes, sha256: sha256Hex(bytes), origin: `spec.files (${path})` };
}

const desired = (units: DesiredUnit[] = [], files: DesiredFile[] = []): Desired => ({ units, files, unsupported: [], keep: [] });

type OnDisk = { sha256: string; mode: number };
type Disk = Map<string, OnDisk>;
type UnitState = { unitFileState: string; activeState: string };
type Units = Map<string, UnitState>;

/** What a successful apply of `d` owns afterwards. */
function ownedFrom(d: Desired): Owned {
  const owned = emptyOwned();
  for (const f of d.files) owned.files[f.path] = { sha256: f.sha256, mode: f.mode };
  for (const u of d.units) {
    owned.units[u.name] = {
      ...(u.sha256 !== undefined ? { sha256: u.sha256 } : {}),
      enable: u.enable,
      ...(u.command ? { command: u.command } : {}),
      dropIns: Object.fromEntries(u.dropIns.map((x) => [x.name, x.sha256])),
      spec: unitSpecDigest(u),
    };
  }
  return owned;
}

/** What a successful apply of `d` leaves on disk (plus `extra` paths written by others). */
function diskFrom(d: Desired, extra: Record<string, string | null> = {}): Disk {
  const disk: Disk = new Map();
  for (const f of d.files) disk.set(f.path, { sha256: f.sha256, mode: f.mode });
  for (const u of d.units) {
    if (u.sha256 !== undefined) disk.set(unitFilePath(u.name), { sha256: u.sha256, mode: unitFileMode });
    for (const x of u.dropIns) disk.set(dropInPath(u.name, x.name), { sha256: x.sha256, mode: unitFileMode });
  }
  for (const [path, content] of Object.entries(extra)) {
    if (content === null) disk.delete(path);
    else disk.set(path, { sha256: sha256Hex(content), mode: 0o644 });
  }
  return disk;
}

/** systemd after a successful apply of `d`: enabled units are running, stopped or disabled ones are not. */
function unitsFrom(d: Desired, override: Record<string, Partial<UnitState>> = {}): Units {
  const units: Units = new Map();
  for (const u of d.units) {
    const running = u.enable && u.command !== "stop";
    units.set(u.name, { unitFileState: u.enable ? "enabled" : "disabled", activeState: running ? "active" : "inactive", ...override[u.name] });
  }
  for (const [name, s] of Object.entries(override)) if (!units.has(name)) units.set(name, { unitFileState: "", activeState: "inactive", ...s });
  return units;
}

const observed = (disk: Disk, units?: Units): Observed => (units ? { files: disk, units } : { files: disk });

const plan = (d: Desired, owned: Owned, obs: Observed, selfUnit = SELF): Plan => makePlan({ checksum: CHECKSUM, desired: d, owned, observed: obs, selfUnit });

/** The node after a complete apply of `before`, planning `after`. */
/** `dropInDirs`: units whose drop-in directory exists on the node. */
function change(before: Desired, after: Desired, opts: { disk?: Record<string, string | null>; units?: Record<string, Partial<UnitState>>; noSystemd?: boolean; dropInDirs?: string[] } = {}): Plan {
  const obs = observed(diskFrom(before, opts.disk), opts.noSystemd ? undefined : unitsFrom(before, opts.units));
  return plan(after, ownedFrom(before), opts.dropInDirs ? { ...obs, dropInDirs: new Set(opts.dropInDirs) } : obs);
}

/** "write /etc/x", "remove /etc/y", "daemon-reload", "restart a.service" … */
function show(s: Step): string {
  switch (s.kind) {
    case "write":
    case "remove":
      return `${s.kind} ${s.path}`;
    case "daemon-reload":
      return "daemon-reload";
    default:
      return `${s.kind} ${s.unit}`;
  }
}
const shown = (p: Plan) => p.steps.map(show);
const stepFor = (p: Plan, shownAs: string): Step => {
  const s = p.steps.find((x) => show(x) === shownAs);
  if (!s) throw new Error(`no step "${shownAs}" in:\n${shown(p).join("\n")}`);
  return s;
};
const reasonOf = (p: Plan, shownAs: string) => stepFor(p, shownAs).reason;
const indexOf = (p: Plan, shownAs: string) => shown(p).indexOf(shownAs);

const U = unitFilePath;
const D = dropInPath;

// A small node: two files, a unit listing each, a unit listing none, a host unit with a drop-in.
const kubeletConf = file("/var/lib/kubelet/config", "kubelet v1");
const sysctl = file("/etc/sysctl.d/99-k8s.conf", "net.ipv4.ip_forward = 1", 0o644);
const base = {
  kubelet: unit("kubelet.service", { content: "[Service]\nExecStart=/opt/bin/kubelet\n", dropIns: { "10-env.conf": "[Service]\nEnvironment=A=1\n" }, filePaths: [kubeletConf.path] }),
  sysctlUnit: unit("sysctl-apply.service", { content: "[Service]\nType=oneshot\n", filePaths: [sysctl.path] }),
  valitail: unit("valitail.service", { content: "[Service]\nExecStart=/opt/bin/valitail\n" }),
  containerd: unit("containerd.service", { dropIns: { "30-env_config.conf": "[Service]\nEnvironment=PATH=/var/bin/containerruntimes\n" } }),
};
const node = (over: Partial<Record<keyof typeof base, DesiredUnit | null>> = {}, files: DesiredFile[] = [kubeletConf, sysctl]): Desired =>
  desired(
    Object.entries({ ...base, ...over }).flatMap(([, u]) => (u ? [u] : [])),
    files,
  );

// ---------------------------------------------------------------------------------------------

describe("first apply (nothing owned, nothing on disk)", () => {
  const d = node();
  const p = plan(d, emptyOwned(), observed(new Map(), new Map()));

  test("writes every file, unit file and drop-in, enables every unit, reloads once, restarts every unit, in that order", () => {
    expect(shown(p)).toEqual([
      `write ${kubeletConf.path}`,
      `write ${sysctl.path}`,
      `write ${U("kubelet.service")}`,
      `write ${D("kubelet.service", "10-env.conf")}`,
      `write ${U("sysctl-apply.service")}`,
      `write ${U("valitail.service")}`,
      `write ${D("containerd.service", "30-env_config.conf")}`,
      "enable kubelet.service",
      "enable sysctl-apply.service",
      "enable valitail.service",
      "enable containerd.service",
      "daemon-reload",
      "restart kubelet.service",
      "restart sysctl-apply.service",
      "restart valitail.service",
      "restart containerd.service",
    ]);
  });

  test("every write is new, with the desired hash and mode", () => {
    for (const s of p.steps) if (s.kind === "write") expect(s.reason).toBe("new");
    expect(stepFor(p, `write ${sysctl.path}`)).toMatchObject({ mode: 0o644, sha256: sysctl.sha256, target: { type: "file" } });
    expect(stepFor(p, `write ${U("kubelet.service")}`)).toMatchObject({ mode: 0o600, sha256: base.kubelet.sha256, target: { type: "unit", unit: "kubelet.service" } });
    expect(stepFor(p, `write ${D("kubelet.service", "10-env.conf")}`)).toMatchObject({ mode: 0o600, target: { type: "drop-in", unit: "kubelet.service", name: "10-env.conf" } });
    expect(reasonOf(p, "restart kubelet.service")).toBe("new unit");
    expect(p.checksum).toBe(CHECKSUM);
  });

  test("the same without systemd (plan --root)", () => {
    expect(shown(plan(d, emptyOwned(), observed(new Map())))).toEqual(shown(p));
  });

  test("a new unit with enable: false is disabled and stopped, not restarted", () => {
    const q = plan(desired([unit("a.service", { content: "x", enable: false })]), emptyOwned(), observed(new Map()));
    expect(shown(q)).toEqual([`write ${U("a.service")}`, "disable a.service", "daemon-reload", "stop a.service"]);
  });

  test("everything in place but nothing owned nor adopted (makePlan alone; planForNode adopts first, below) gets no writes, but every unit is enabled and restarted once", () => {
    const q = plan(d, emptyOwned(), observed(diskFrom(d), unitsFrom(d)));
    expect(shown(q).filter((s) => s.startsWith("write") || s === "daemon-reload")).toEqual([]);
    expect(shown(q).filter((s) => s.startsWith("restart"))).toHaveLength(d.units.length);
  });
});

// What planForNode does on a node another agent set up: adoptMatching (the disk and systemd, as they are),
// then the plan.
describe("taking over a node gardener-node-agent set up (adoptMatching, then the plan)", () => {
  // Gardener's OSC gives containerd.service and systemd-sysctl.service no unit file: only a command, the
  // enablement and the files they read.
  const sysctlRestart = unit("systemd-sysctl.service", { command: "restart", filePaths: [sysctl.path] });
  const d = node({ sysctlUnit: null, containerd: unit("containerd.service"), valitail: sysctlRestart });
  const takeOver = (disk: Disk, units: Units | undefined) => {
    const obs = observed(disk, units);
    return plan(d, adoptMatching(emptyOwned(), d, obs), obs);
  };

  test("everything in place and running as the OSC asks: nothing is written, nothing restarts", () => {
    const p = takeOver(diskFrom(d), unitsFrom(d));
    expect(shown(p).filter((x) => !x.startsWith("enable"))).toEqual([]);
  });

  test("a file a unit without a unit file lists differs: it is written and that unit restarts, only it", () => {
    const p = takeOver(diskFrom(d, { [sysctl.path]: "net.ipv4.ip_forward = 0" }), unitsFrom(d));
    expect(shown(p).filter((x) => !x.startsWith("enable"))).toEqual([`write ${sysctl.path}`, "restart systemd-sysctl.service"]);
    expect(reasonOf(p, "restart systemd-sysctl.service")).toBe(`file ${sysctl.path} changed`);
  });

  test.each([
    ["inactive though it is to run", { activeState: "inactive" }],
    ["disabled though the OSC enables it", { unitFileState: "disabled" }],
    ["unknown to systemd", { unitFileState: "", activeState: "inactive" }],
  ])("a unit without a unit file that is %s is not adopted: it is started as a new unit", (_, state) => {
    const p = takeOver(diskFrom(d), unitsFrom(d, { "containerd.service": state }));
    expect(reasonOf(p, "restart containerd.service")).toBe("new unit");
    expect(shown(p).filter((x) => x.startsWith("restart"))).toEqual(["restart containerd.service"]);
  });

  test("without systemd (plan --root) nothing tells how a unit runs: units without a unit file are new", () => {
    const p = takeOver(diskFrom(d), undefined);
    expect(shown(p).filter((x) => x.startsWith("restart"))).toEqual(["restart systemd-sysctl.service", "restart containerd.service"]);
  });

  test("adopted as the OSC has it: the next OSC that stops the unit stops it, and one that changes nothing keeps it", () => {
    const obs = observed(diskFrom(d), unitsFrom(d));
    const owned = adoptMatching(emptyOwned(), d, obs);
    expect(owned.units["systemd-sysctl.service"]).toEqual({ dropIns: {}, enable: true, command: "restart" });
    const stopped = node({ sysctlUnit: null, containerd: unit("containerd.service", { command: "stop" }), valitail: sysctlRestart });
    expect(shown(plan(stopped, owned, obs))).toContain("stop containerd.service");
  });
});

describe("nothing changed", () => {
  test.each([
    ["with systemd", false],
    ["without systemd (plan --root)", true],
  ])("disk == desired and owned == desired gives an empty plan (%s)", (_, noSystemd) => {
    expect(change(node(), node(), { noSystemd }).steps).toEqual([]);
  });

  test("units with enable: false and command: stop that are already down need nothing", () => {
    const d = node({ valitail: unit("valitail.service", { content: "x", enable: false }), sysctlUnit: unit("sysctl-apply.service", { content: "y", command: "stop" }) });
    expect(change(d, d).steps).toEqual([]);
    expect(change(d, d, { noSystemd: true }).steps).toEqual([]);
  });

  test("a file someone else wrote with exactly the OSC's content and mode is not rewritten", () => {
    const d = desired([], [file("/etc/a", "same")]);
    expect(plan(d, emptyOwned(), observed(new Map([["/etc/a", { sha256: d.files[0]?.sha256 ?? "", mode: 0o600 }]]))).steps).toEqual([]);
  });
});

describe("files", () => {
  test("a changed file is written and only the units listing it restart", () => {
    const p = change(node(), node({}, [file(kubeletConf.path, "kubelet v2"), sysctl]));
    expect(shown(p)).toEqual([`write ${kubeletConf.path}`, "restart kubelet.service"]);
    expect(reasonOf(p, `write ${kubeletConf.path}`)).toBe("content changed");
    expect(reasonOf(p, "restart kubelet.service")).toContain(kubeletConf.path);
  });

  test("a file listed by two units restarts both", () => {
    const both = node({ valitail: unit("valitail.service", { content: base.valitail.content ?? "", filePaths: [kubeletConf.path] }) });
    const after = desired(both.units, [file(kubeletConf.path, "kubelet v2"), sysctl]);
    expect(shown(change(both, after))).toEqual([`write ${kubeletConf.path}`, "restart kubelet.service", "restart valitail.service"]);
  });

  test("a changed mode alone rewrites the file, naming both modes, and restarts the units listing it", () => {
    const p = change(node(), node({}, [kubeletConf, file(sysctl.path, "net.ipv4.ip_forward = 1", 0o600)]));
    expect(shown(p)).toEqual([`write ${sysctl.path}`, "restart sysctl-apply.service"]);
    expect(reasonOf(p, `write ${sysctl.path}`)).toContain("0644");
    expect(reasonOf(p, `write ${sysctl.path}`)).toContain("0600");
  });

  test.each([
    ["content changed on disk", { [kubeletConf.path]: "edited by hand" }, /drift/],
    ["deleted from disk", { [kubeletConf.path]: null }, /missing on disk \(drift\)/],
  ])("drift: a file %s while the OSC is unchanged is written back and its units restart", (_, disk, reason) => {
    const p = change(node(), node(), { disk });
    expect(shown(p)).toEqual([`write ${kubeletConf.path}`, "restart kubelet.service"]);
    expect(reasonOf(p, `write ${kubeletConf.path}`)).toMatch(reason);
  });

  test("drift: a mode changed on disk is put back", () => {
    const disk = diskFrom(node());
    disk.set(kubeletConf.path, { sha256: kubeletConf.sha256, mode: 0o666 });
    const p = plan(node(), ownedFrom(node()), observed(disk, unitsFrom(node())));
    expect(shown(p)).toEqual([`write ${kubeletConf.path}`, "restart kubelet.service"]);
    expect(reasonOf(p, `write ${kubeletConf.path}`)).toContain("0666");
    // Told apart from a mode the OSC changes: a repair the drift controller reports (driftInSteps).
    expect(reasonOf(p, `write ${kubeletConf.path}`)).toBe("mode 0666 → 0600 (drift)");
    expect(driftInSteps(p.steps)).toEqual([{ target: kubeletConf.path, kind: "mode", detail: `${kubeletConf.path}: mode 0666, applied 0600` }]);
    const byOsc = change(node(), node({}, [kubeletConf, file(sysctl.path, "net.ipv4.ip_forward = 1", 0o600)]));
    expect(driftInSteps(byOsc.steps)).toEqual([]);
  });

  test("a file that differs from the OSC but was never written by trellis says so", () => {
    const d = desired([], [file("/etc/a", "osc")]);
    const p = plan(d, emptyOwned(), observed(diskFrom(desired(), { "/etc/a": "theirs" })));
    expect(reasonOf(p, "write /etc/a")).toBe("content differs from the OSC");
  });

  test("a file removed from the OSC is removed when trellis wrote it; a unit that still lists it is not restarted (gardener-node-agent)", () => {
    const p = change(node(), node({}, [sysctl]));
    expect(shown(p)).toEqual([`remove ${kubeletConf.path}`]);
    expect(reasonOf(p, `remove ${kubeletConf.path}`)).toBe("removed from the OSC");
    expect(stepFor(p, `remove ${kubeletConf.path}`)).toMatchObject({ target: { type: "file" } });
  });

  test("a file removed from the OSC with the unit's filePaths: the unit changed, and restarts", () => {
    const kubelet = unit("kubelet.service", { content: base.kubelet.content ?? "", dropIns: { "10-env.conf": "[Service]\nEnvironment=A=1\n" } });
    const p = change(node(), node({ kubelet }, [sysctl]));
    expect(shown(p)).toEqual([`remove ${kubeletConf.path}`, "restart kubelet.service"]);
    expect(reasonOf(p, "restart kubelet.service")).toBe("changed in the OSC");
  });

  test("a file removed from the OSC that trellis never wrote is left alone", () => {
    const before = node();
    const owned = ownedFrom(before);
    delete owned.files[kubeletConf.path]; // e.g. written by gardener-node-agent before trellis took over
    const p = plan(node({}, [sysctl]), owned, observed(diskFrom(before), unitsFrom(before)));
    expect(shown(p)).toEqual([]);
  });

  test("a file that moved to a path it is reached through by a symlink (/var/run → /run) is written, never removed", () => {
    const before = file("/var/run/x.conf", "x");
    const after = file("/run/x.conf", "x v2");
    const disk: Disk = new Map([[before.path, { sha256: before.sha256, mode: before.mode }], [after.path, { sha256: before.sha256, mode: before.mode }]]);
    const p = plan(desired([], [after]), ownedFrom(desired([], [before])), { files: disk, landsAt: new Map([[before.path, after.path]]) });
    expect(shown(p)).toEqual([`write ${after.path}`]);
  });

  test("a file removed from the OSC and already gone from disk needs no step", () => {
    const p = change(node({ kubelet: unit("kubelet.service", { content: "k" }) }), node({ kubelet: unit("kubelet.service", { content: "k" }) }, [sysctl]), { disk: { [kubeletConf.path]: null } });
    expect(shown(p)).toEqual([]);
  });

  test("only plain files changed: no daemon-reload", () => {
    const p = change(node(), node({}, [file(kubeletConf.path, "v2"), file(sysctl.path, "v2", 0o644)]));
    expect(shown(p)).not.toContain("daemon-reload");
  });
});

describe("unit files and drop-ins", () => {
  test("a changed unit file: write, daemon-reload, enable (re-reads [Install]), restart that unit only", () => {
    const p = change(node(), node({ valitail: unit("valitail.service", { content: "[Service]\nExecStart=/opt/bin/valitail --v2\n" }) }));
    expect(shown(p)).toEqual([`write ${U("valitail.service")}`, "enable valitail.service", "daemon-reload", "restart valitail.service"]);
    expect(reasonOf(p, "restart valitail.service")).toContain("unit file");
    expect(reasonOf(p, "daemon-reload")).toContain("valitail.service");
  });

  test("drift: a unit file edited on disk is written back and the unit restarts", () => {
    const p = change(node(), node(), { disk: { [U("valitail.service")]: "edited" } });
    expect(shown(p)).toEqual([`write ${U("valitail.service")}`, "enable valitail.service", "daemon-reload", "restart valitail.service"]);
    expect(reasonOf(p, `write ${U("valitail.service")}`)).toContain("drift");
  });

  test("a unit file with the right content but another mode is fixed without restarting the unit", () => {
    const p = change(node(), node(), { disk: { [U("valitail.service")]: "[Service]\nExecStart=/opt/bin/valitail\n" } });
    expect(shown(p)).toEqual([`write ${U("valitail.service")}`, "enable valitail.service", "daemon-reload"]);
    expect(reasonOf(p, `write ${U("valitail.service")}`)).toBe("mode 0644 → 0600");
  });

  test.each<[string, UnitSpec, string[]]>([
    ["changed", { dropIns: { "30-env_config.conf": "[Service]\nEnvironment=PATH=/other\n" } }, [`write ${D("containerd.service", "30-env_config.conf")}`]],
    [
      "added",
      { dropIns: { "30-env_config.conf": "[Service]\nEnvironment=PATH=/var/bin/containerruntimes\n", "40-limits.conf": "[Service]\nLimitNOFILE=1048576\n" } },
      [`write ${D("containerd.service", "40-limits.conf")}`],
    ],
    ["removed", {}, [`remove ${D("containerd.service", "30-env_config.conf")}`]],
  ])("a drop-in %s: that step, daemon-reload, and a restart of that unit only", (_, spec, writes) => {
    const p = change(node(), node({ containerd: unit("containerd.service", spec) }));
    expect(shown(p)).toEqual([...writes, "daemon-reload", "restart containerd.service"]);
    expect(reasonOf(p, "restart containerd.service")).toContain("drop-in");
  });

  test("drift: an owned drop-in deleted from disk is written back", () => {
    const p = change(node(), node(), { disk: { [D("containerd.service", "30-env_config.conf")]: null } });
    expect(shown(p)).toEqual([`write ${D("containerd.service", "30-env_config.conf")}`, "daemon-reload", "restart containerd.service"]);
  });

  test("foreign drop-ins of a unit that keeps drop-ins in the OSC are never removed", () => {
    const foreign = { [D("containerd.service", "99-admin.conf")]: "[Service]\nNice=5\n" };
    const p = change(node(), node({ containerd: unit("containerd.service", { dropIns: { "40-limits.conf": "[Service]\nLimitNOFILE=1048576\n" } }) }), { disk: foreign });
    expect(shown(p)).toEqual([`write ${D("containerd.service", "40-limits.conf")}`, `remove ${D("containerd.service", "30-env_config.conf")}`, "daemon-reload", "restart containerd.service"]);
  });
});

describe("a unit the OSC gives no drop-ins: its whole drop-in directory goes when the unit changes (gardener-node-agent)", () => {
  const dir = (name: string) => `${U(name)}.d`;
  const foreign = { [D("containerd.service", "99-admin.conf")]: "[Service]\nNice=5\n", [D("kubelet.service", "99-admin.conf")]: "x" };
  const noDropIns = node({ containerd: unit("containerd.service"), kubelet: unit("kubelet.service", { content: base.kubelet.content ?? "", filePaths: [kubeletConf.path] }) });

  test("its last drop-ins left the OSC: trellis's are removed, then the directory with what others put there", () => {
    const p = change(node(), noDropIns, { disk: foreign, dropInDirs: ["kubelet.service", "containerd.service"] });
    expect(shown(p)).toEqual([
      `remove ${D("kubelet.service", "10-env.conf")}`,
      `remove ${dir("kubelet.service")}`,
      `remove ${D("containerd.service", "30-env_config.conf")}`,
      `remove ${dir("containerd.service")}`,
      "daemon-reload",
      "restart kubelet.service",
      "restart containerd.service",
    ]);
    expect(stepFor(p, `remove ${dir("kubelet.service")}`)).toEqual({
      kind: "remove",
      target: { type: "drop-ins", unit: "kubelet.service" },
      path: dir("kubelet.service"),
      reason: "the OSC gives this unit no drop-ins",
    });
    expect(v.parse(PlanSchema, JSON.parse(JSON.stringify(p)))).toEqual(p);
  });

  test("an unchanged unit keeps whatever drop-ins others put there since (gardener-node-agent looks only at changed units)", () => {
    expect(change(noDropIns, noDropIns, { disk: foreign, dropInDirs: ["kubelet.service", "containerd.service"] }).steps).toEqual([]);
  });

  const valitail = (s: UnitSpec) => node({ valitail: unit("valitail.service", { content: base.valitail.content ?? "", ...s }) });
  test.each<[string, Desired, Desired, string]>([
    ["new to the node", node({ valitail: null }), node(), "new unit"],
    ["whose unit file changed", node(), valitail({ content: "v2" }), "unit file: content changed"],
    ["whose filePaths alone changed", node(), valitail({ filePaths: [sysctl.path] }), "changed in the OSC"],
    ["whose command alone changed", node(), valitail({ command: "restart" }), "changed in the OSC"],
  ])("a unit %s, with a drop-in directory on the node: removed, daemon-reload, restart", (_, from, after, cause) => {
    const p = change(from, after, { dropInDirs: ["valitail.service"] });
    expect(shown(p).filter((s) => !s.startsWith("write") && !s.startsWith("enable"))).toEqual([`remove ${dir("valitail.service")}`, "daemon-reload", "restart valitail.service"]);
    expect(reasonOf(p, "restart valitail.service")).toBe(cause);
  });

  test("a changed unit that is to be stopped loses the directory too, and is stopped, not restarted", () => {
    const p = change(node(), node({ valitail: unit("valitail.service", { content: "v2", command: "stop" }) }), { dropInDirs: ["valitail.service"] });
    expect(shown(p)).toEqual([`write ${U("valitail.service")}`, `remove ${dir("valitail.service")}`, "enable valitail.service", "daemon-reload", "stop valitail.service"]);
  });

  test("no directory on the node: no step", () => {
    expect(shown(change(node(), node({ valitail: unit("valitail.service", { content: "v2" }) })))).not.toContain(`remove ${dir("valitail.service")}`);
  });

  test("a unit that leaves the OSC keeps others' drop-ins: only trellis's go (the directory only if empty, gardener-node-agent's removeDeletedUnits)", () => {
    const p = change(node(), node({ kubelet: null }), { disk: foreign, dropInDirs: ["kubelet.service"] });
    expect(shown(p)).not.toContain(`remove ${dir("kubelet.service")}`);
    expect(shown(p)).toContain(`remove ${D("kubelet.service", "10-env.conf")}`);
  });

  test("removing the directory forgets every drop-in trellis owned of that unit", () => {
    const owned = ownedFrom(node());
    const after = ownedAfter(owned, { kind: "remove", target: { type: "drop-ins", unit: "kubelet.service" }, path: dir("kubelet.service"), reason: "r" });
    expect(after.units["kubelet.service"]?.dropIns).toEqual({});
    expect(owned.units["kubelet.service"]?.dropIns).toEqual({ "10-env.conf": sha256Hex("[Service]\nEnvironment=A=1\n") });
  });
});

describe("enable and command", () => {
  test("enable: true → false on a running unit: disable and stop, no restart", () => {
    const p = change(node(), node({ valitail: unit("valitail.service", { content: base.valitail.content ?? "", enable: false }) }));
    expect(shown(p)).toEqual(["disable valitail.service", "daemon-reload", "stop valitail.service"]);
    expect(reasonOf(p, "disable valitail.service")).toContain("was enabled");
    expect(reasonOf(p, "stop valitail.service")).toBe("enable: false");
  });

  test("enable: false on a unit that is already inactive: disable only", () => {
    const p = change(node(), node({ valitail: unit("valitail.service", { content: base.valitail.content ?? "", enable: false }) }), { units: { "valitail.service": { activeState: "inactive" } } });
    expect(shown(p)).toEqual(["disable valitail.service", "daemon-reload"]);
  });

  test("enable: false without systemd (plan --root): disable and stop because the enablement changed", () => {
    const p = change(node(), node({ valitail: unit("valitail.service", { content: base.valitail.content ?? "", enable: false }) }), { noSystemd: true });
    expect(shown(p)).toEqual(["disable valitail.service", "daemon-reload", "stop valitail.service"]);
  });

  test("command: stop on a running unit: stop, no restart", () => {
    const p = change(node(), node({ valitail: unit("valitail.service", { content: base.valitail.content ?? "", command: "stop" }) }));
    expect(shown(p)).toEqual(["stop valitail.service"]);
    expect(reasonOf(p, "stop valitail.service")).toBe("command: stop");
  });

  test("command: stop with a changed unit file: written, reloaded, enabled, stopped, never restarted", () => {
    const p = change(node(), node({ valitail: unit("valitail.service", { content: "new", command: "stop" }) }));
    expect(shown(p)).toEqual([`write ${U("valitail.service")}`, "enable valitail.service", "daemon-reload", "stop valitail.service"]);
  });

  test("command: stop, unit observed inactive, nothing changed: no step", () => {
    const d = node({ valitail: unit("valitail.service", { content: "x", command: "stop" }) });
    expect(change(d, d).steps).toEqual([]);
  });

  test("command: stop, unit observed active again (someone started it): stopped again", () => {
    const d = node({ valitail: unit("valitail.service", { content: "x", command: "stop" }) });
    expect(shown(change(d, d, { units: { "valitail.service": { activeState: "active" } } }))).toEqual(["stop valitail.service"]);
  });

  test("enable: false with a changed file it lists, unit inactive: file written, no stop, no restart", () => {
    const d = node({ kubelet: unit("kubelet.service", { content: "k", enable: false, filePaths: [kubeletConf.path] }) });
    const after = desired(d.units, [file(kubeletConf.path, "v2"), sysctl]);
    expect(shown(change(d, after))).toEqual([`write ${kubeletConf.path}`]);
  });

  test.each(["start", "restart"] as const)("command: %s restarts like no command", (command) => {
    const p = change(node(), node({ valitail: unit("valitail.service", { content: "new", command }) }));
    expect(shown(p)).toContain("restart valitail.service");
  });

  test.each(["static", "indirect", "generated", "enabled", "enabled-runtime", "linked", "alias", "transient", "masked"])(
    "enable: true, observed %p, nothing changed: no step, no restart",
    (unitFileState) => {
      expect(change(node(), node(), { units: { "kubelet.service": { unitFileState } } }).steps).toEqual([]);
    },
  );

  test("enable: true, observed \"disabled\": enable and restart, saying why", () => {
    const p = change(node(), node(), { units: { "kubelet.service": { unitFileState: "disabled" } } });
    expect(shown(p)).toEqual(["enable kubelet.service", "daemon-reload", "restart kubelet.service"]);
    expect(reasonOf(p, "enable kubelet.service")).toBe("was disabled");
    expect(reasonOf(p, "restart kubelet.service")).toBe("enabled");
  });

  test.each(["enabled", "linked"])("enable: false, observed %p: disable and stop", (unitFileState) => {
    const d = node({ valitail: unit("valitail.service", { content: "x", enable: false }) });
    const p = change(d, d, { units: { "valitail.service": { unitFileState, activeState: "active" } } });
    expect(shown(p)).toEqual(["disable valitail.service", "daemon-reload", "stop valitail.service"]);
  });

  // DisableUnitFiles(runtime=false) cannot clear runtime enablement: disabling again on every apply
  // would change nothing, so only the stop remains.
  test.each(["enabled-runtime", "linked-runtime"])("enable: false, observed %p: stop only", (unitFileState) => {
    const d = node({ valitail: unit("valitail.service", { content: "x", enable: false }) });
    const p = change(d, d, { units: { "valitail.service": { unitFileState, activeState: "active" } } });
    expect(shown(p)).toEqual(["stop valitail.service"]);
  });

  test("command: stop → start with nothing else changed starts the unit again", () => {
    const stopped = node({ valitail: unit("valitail.service", { content: "x", command: "stop" }) });
    const started = node({ valitail: unit("valitail.service", { content: "x", command: "start" }) });
    const p = change(stopped, started, { units: { "valitail.service": { unitFileState: "enabled", activeState: "inactive" } } });
    expect(shown(p)).toEqual(["restart valitail.service"]);
    expect(reasonOf(p, "restart valitail.service")).toBe("was command: stop before");
  });

  test.each(["disabled", "static", "masked", "indirect"])("enable: false, observed %p and inactive: no step", (unitFileState) => {
    const d = node({ valitail: unit("valitail.service", { content: "x", enable: false }) });
    expect(change(d, d, { units: { "valitail.service": { unitFileState, activeState: "inactive" } } }).steps).toEqual([]);
  });

  test.each(["active", "activating", "reloading", "deactivating"])("command: stop, observed %p: stop", (activeState) => {
    const d = node({ valitail: unit("valitail.service", { content: "x", command: "stop" }) });
    expect(shown(change(d, d, { units: { "valitail.service": { activeState } } }))).toEqual(["stop valitail.service"]);
  });

  test("command: stop, observed failed: no stop", () => {
    const d = node({ valitail: unit("valitail.service", { content: "x", command: "stop" }) });
    expect(change(d, d, { units: { "valitail.service": { activeState: "failed" } } }).steps).toEqual([]);
  });
});

describe("units removed from the OSC", () => {
  test("a unit trellis wrote: stop, disable, remove its unit file and drop-ins, daemon-reload", () => {
    const before = node({ valitail: unit("valitail.service", { content: "x", dropIns: { "10-a.conf": "a" } }) });
    const p = change(before, node({ valitail: null }));
    expect(shown(p)).toEqual(["stop valitail.service", "disable valitail.service", `remove ${U("valitail.service")}`, `remove ${D("valitail.service", "10-a.conf")}`, "daemon-reload"]);
    for (const s of p.steps) if (s.kind !== "daemon-reload") expect(s.reason).toContain("removed from the OSC");
    expect(stepFor(p, `remove ${U("valitail.service")}`)).toMatchObject({ target: { type: "unit", unit: "valitail.service" } });
  });

  test("stop and disable of removed units come after every write and before every removal (a failed write leaves them running)", () => {
    const p = change(node(), node({ valitail: null, kubelet: unit("kubelet.service", { content: "k2", filePaths: [kubeletConf.path] }) }, [file(kubeletConf.path, "v2")]));
    expect(shown(p).slice(0, 4)).toEqual([`write ${kubeletConf.path}`, `write ${U("kubelet.service")}`, "stop valitail.service", "disable valitail.service"]);
    expect(indexOf(p, `remove ${U("valitail.service")}`)).toBeGreaterThan(indexOf(p, "disable valitail.service"));
    expect(indexOf(p, "daemon-reload")).toBeGreaterThan(indexOf(p, `remove ${U("valitail.service")}`));
  });

  test("a removed unit observed inactive is disabled, not stopped", () => {
    const p = change(node(), node({ valitail: null }), { units: { "valitail.service": { activeState: "inactive" } } });
    expect(shown(p)).toEqual(["disable valitail.service", `remove ${U("valitail.service")}`, "daemon-reload"]);
  });

  test("a removed unit without systemd (plan --root): stopped and disabled to be safe", () => {
    expect(shown(change(node(), node({ valitail: null }), { noSystemd: true }))).toEqual(["stop valitail.service", "disable valitail.service", `remove ${U("valitail.service")}`, "daemon-reload"]);
  });

  test("a removed unit whose unit file is already gone: stop and disable, nothing to remove, no reload", () => {
    expect(shown(change(node(), node({ valitail: null }), { disk: { [U("valitail.service")]: null } }))).toEqual(["stop valitail.service", "disable valitail.service"]);
  });

  test("a host unit (no content) removed with owned drop-ins: drop-ins removed and unit restarted; its unit file never touched", () => {
    const hostUnitFile = { [U("containerd.service")]: "[Unit]\nDescription=from the OS image\n", [D("containerd.service", "99-admin.conf")]: "x" };
    const p = change(node(), node({ containerd: null }), { disk: hostUnitFile });
    expect(shown(p)).toEqual([`remove ${D("containerd.service", "30-env_config.conf")}`, "daemon-reload", "restart containerd.service"]);
    expect(reasonOf(p, "restart containerd.service")).toContain("drop-ins");
  });

  test("a host unit removed whose drop-ins are already gone: nothing at all", () => {
    expect(change(node(), node({ containerd: null }), { disk: { [D("containerd.service", "30-env_config.conf")]: null } }).steps).toEqual([]);
  });

  test("a host unit trellis only enabled, removed from the OSC: not disabled, not stopped", () => {
    const before = desired([unit("chronyd.service")]);
    expect(change(before, desired()).steps).toEqual([]);
  });
});

describe("the agent's own unit", () => {
  test("restarts last even when listed first", () => {
    const before = desired([unit(SELF, { content: "gna v1" }), unit("a.service", { content: "a1" }), unit("b.service", { content: "b1" })]);
    const after = desired([unit(SELF, { content: "gna v2" }), unit("a.service", { content: "a2" }), unit("b.service", { content: "b2" })]);
    const p = change(before, after);
    expect(shown(p).at(-1)).toBe(`restart ${SELF}`);
    expect(shown(p).filter((s) => s.startsWith("restart"))).toEqual(["restart a.service", "restart b.service", `restart ${SELF}`]);
  });

  test("restarts last on the first apply, after the restart of a host unit losing its drop-ins and after stops", () => {
    const before = desired([unit("host.service", { dropIns: { "a.conf": "x" } }), unit("s.service", { content: "s" })]);
    const after = desired([unit(SELF, { content: "gna" }), unit("s.service", { content: "s", command: "stop" })]);
    const p = change(before, after);
    expect(shown(p).at(-1)).toBe(`restart ${SELF}`);
    expect(indexOf(p, "restart host.service")).toBeLessThan(indexOf(p, `restart ${SELF}`));
    expect(indexOf(p, "stop s.service")).toBeLessThan(indexOf(p, `restart ${SELF}`));
  });

  test.each<[string, UnitSpec]>([
    ["enable: false", { enable: false }],
    ["command: stop", { command: "stop" }],
  ])("an OSC with %s for the agent's own unit does not make the agent stop or disable itself", (_, spec) => {
    const running = desired([unit(SELF, { content: "gna v1" }), unit("a.service", { content: "a" })]);
    // Its unit changed in the OSC: gardener-node-agent restarts itself for that too.
    expect(shown(change(running, desired([unit(SELF, { content: "gna v1", ...spec }), unit("a.service", { content: "a" })])))).toEqual([`restart ${SELF}`]);
    const p = change(running, desired([unit(SELF, { content: "gna v2", ...spec }), unit("a.service", { content: "a2" })]));
    expect(shown(p)).toEqual([`write ${U(SELF)}`, `write ${U("a.service")}`, `enable ${SELF}`, "enable a.service", "daemon-reload", "restart a.service", `restart ${SELF}`]);
  });

  test("a different selfUnit is honoured", () => {
    const d = desired([unit("trellis.service", { content: "t" }), unit("z.service", { content: "z" })]);
    const p = plan(d, emptyOwned(), observed(new Map()), "trellis.service");
    expect(shown(p).at(-1)).toBe("restart trellis.service");
  });
});

describe("a path that changes role between two OSCs", () => {
  test.each([
    ["the same content", "[Service]\nExecStart=/x\n", []],
    ["new content", "other", [`write ${U("a.service")}`]],
  ])("a unit file that becomes a plain file with %s is kept, not removed after being written", (_, content, writes) => {
    const before = desired([unit("a.service", { content: "[Service]\nExecStart=/x\n" })]);
    const p = change(before, desired([], [file(U("a.service"), content)]));
    expect(shown(p)).toEqual([...writes, "stop a.service", "disable a.service"]);
  });

  test("a drop-in that becomes a plain file is kept, not removed after being written", () => {
    const before = desired([unit("containerd.service", { dropIns: { "10-x.conf": "x" } })]);
    const p = change(before, desired([unit("containerd.service")], [file(D("containerd.service", "10-x.conf"), "y")]), { dropInDirs: ["containerd.service"] });
    // The unit changed (its drop-ins did); its drop-in directory, which holds a file of the OSC, stays.
    expect(shown(p)).toEqual([`write ${D("containerd.service", "10-x.conf")}`, "restart containerd.service"]);
  });

  test("a drop-in of a unit leaving the OSC that becomes a plain file is kept", () => {
    const before = desired([unit("a.service", { content: "a", dropIns: { "10-x.conf": "x" } })]);
    const p = change(before, desired([], [file(D("a.service", "10-x.conf"), "x")]));
    expect(shown(p)).toEqual(["stop a.service", "disable a.service", `remove ${U("a.service")}`, "daemon-reload"]);
  });

  test.each([
    ["unit file", desired([unit("a.service", { content: "same" })]), U("a.service")],
    ["drop-in", desired([unit("a.service", { dropIns: { "10-x.conf": "same" } })]), D("a.service", "10-x.conf")],
  ])("a plain file that becomes a %s with the same content is not removed", (_, after, path) => {
    const p = change(desired([], [file(path, "same")]), after);
    expect(shown(p).filter((s) => s.includes(path))).toEqual([]);
  });
});

describe("a file that left the OSC while already gone from disk", () => {
  test("restarts nothing, on this apply or any later one", () => {
    const p = change(node(), node({}, [sysctl]), { disk: { [kubeletConf.path]: null } });
    expect(shown(p)).toEqual([]);
  });
});

describe("daemon-reload", () => {
  test("exactly one, whatever the number of unit changes", () => {
    const before = desired([
      unit("a.service", { content: "a1", dropIns: { "x.conf": "1" } }),
      unit("b.service", { content: "b1" }),
      unit("c.service", { dropIns: { "y.conf": "1" } }),
      unit("gone.service", { content: "g" }),
      unit("host-gone.service", { dropIns: { "z.conf": "1" } }),
    ]);
    const after = desired([
      unit("a.service", { content: "a2", dropIns: { "x.conf": "2", "x2.conf": "2" } }),
      unit("b.service", { content: "b2" }),
      unit("c.service", { dropIns: {} }),
      unit("new.service", { content: "n" }),
    ]);
    const p = change(before, after);
    expect(shown(p).filter((s) => s === "daemon-reload")).toHaveLength(1);
    const reload = indexOf(p, "daemon-reload");
    p.steps.forEach((s, i) => {
      if (s.kind === "write" || s.kind === "remove") expect(i).toBeLessThan(reload);
      if (s.kind === "restart") expect(i).toBeGreaterThan(reload);
    });
    for (const u of ["a.service", "b.service", "gone.service", "host-gone.service", "new.service"]) expect(reasonOf(p, "daemon-reload")).toContain(u);
  });

  test("none when nothing changed in units", () => {
    expect(shown(change(node(), node({}, [file(kubeletConf.path, "x")])))).not.toContain("daemon-reload");
  });
});

describe("without systemd (Observed.units undefined, plan --root)", () => {
  test("enablement falls back to what trellis recorded: a recorded enable: true needs nothing", () => {
    expect(change(node(), node(), { noSystemd: true }).steps).toEqual([]);
  });

  test("an enablement trellis never recorded is (re)applied, without a restart", () => {
    const owned = ownedFrom(node());
    const { enable: _, ...rest } = owned.units["valitail.service"] as OwnedUnit;
    owned.units["valitail.service"] = rest;
    const p = plan(node(), owned, observed(diskFrom(node())));
    expect(shown(p)).toEqual(["enable valitail.service"]);
    expect(reasonOf(p, "enable valitail.service")).toBe("enablement not yet recorded");
  });

  test("recorded enable: false, desired true: enable and restart", () => {
    const before = node({ valitail: unit("valitail.service", { content: base.valitail.content ?? "", enable: false }) });
    expect(shown(change(before, node(), { noSystemd: true }))).toEqual(["enable valitail.service", "daemon-reload", "restart valitail.service"]);
  });

  test("command: stop without systemd and without changes: no stop (activity unknown)", () => {
    const d = node({ valitail: unit("valitail.service", { content: "x", command: "stop" }) });
    expect(change(d, d, { noSystemd: true }).steps).toEqual([]);
  });
});

describe("a plan is data", () => {
  const before = node();
  const after = node({ valitail: null, containerd: unit("containerd.service") }, [file(kubeletConf.path, "v2")]);

  test("the same input gives the same steps", () => {
    expect(change(before, after)).toEqual(change(before, after));
  });

  test("it survives JSON and parses back with PlanSchema", () => {
    const p = change(before, after);
    const round = JSON.parse(JSON.stringify(p));
    expect(round).toEqual(p);
    expect(v.parse(PlanSchema, round)).toEqual(p);
  });

  test("makePlan does not modify its inputs", () => {
    const owned = ownedFrom(before);
    const disk = diskFrom(before);
    const snapshot = JSON.stringify({ owned, disk: [...disk], after: { ...after, files: after.files.map((f) => ({ ...f, content: f.content instanceof Uint8Array ? [...f.content] : f.content })) } });
    plan(after, owned, observed(disk, unitsFrom(before)));
    expect(JSON.stringify({ owned, disk: [...disk], after: { ...after, files: after.files.map((f) => ({ ...f, content: f.content instanceof Uint8Array ? [...f.content] : f.content })) } })).toBe(snapshot);
  });
});

// ---------------------------------------------------------------------------------------------
// Property: random OSC histories converge, and files that are neither desired nor owned are safe.

type Rng = ReturnType<typeof prng>;

const POOL = {
  // Units with an [Install] section start "disabled"; c.timer has none ("static"); host.service is the OS's.
  units: ["a.service", "b.service", "c.timer", SELF, "host.service"],
  dropIns: ["10-a.conf", "20-b.conf"],
  // Plain files, including paths that other OSC versions use for a unit file or a drop-in.
  files: ["/etc/a", "/etc/b/c", "/opt/bin/x", U("a.service"), D("b.service", "10-a.conf"), D("host.service", "20-b.conf")],
  // Never desired: must never be touched.
  foreign: ["/etc/foreign", D("a.service", "99-foreign.conf"), D("host.service", "99-foreign.conf"), U("host.service")],
};

function randomDesired(r: Rng): Desired {
  const units: DesiredUnit[] = [];
  for (const name of POOL.units) {
    if (!r.chance(0.6)) continue;
    const content = name === "host.service" ? undefined : r.pick([undefined, "u1", "u2", "same"]);
    units.push(
      unit(name, {
        ...(content !== undefined ? { content } : {}),
        enable: r.chance(0.8),
        ...(r.chance(0.3) ? { command: r.pick(["start", "restart", "stop"] as const) } : {}),
        dropIns: Object.fromEntries(r.subset(POOL.dropIns, 0.4).map((n) => [n, r.pick(["d1", "d2", "same"])])),
        filePaths: r.subset(POOL.files, 0.3),
      }),
    );
  }
  const unitPaths = new Set(units.flatMap((u) => [...(u.content !== undefined ? [U(u.name)] : []), ...u.dropIns.map((x) => D(u.name, x.name))]));
  const files = r
    .subset(POOL.files, 0.5)
    .filter((p) => !unitPaths.has(p)) // resolveDesired refuses a file at a path a unit writes
    .map((p) => file(p, r.pick(["f1", "f2", "same"]), r.pick([0o600, 0o644])));
  return desired(units, files);
}

type Sim = { disk: Disk; owned: Owned; units: Units };
const installable = (name: string) => name !== "c.timer";

function desiredPaths(d: Desired): Map<string, string> {
  const m = new Map<string, string>();
  for (const f of d.files) m.set(f.path, f.sha256);
  for (const u of d.units) {
    if (u.sha256 !== undefined) m.set(U(u.name), u.sha256);
    for (const x of u.dropIns) m.set(D(u.name, x.name), x.sha256);
  }
  return m;
}
function ownedPaths(o: Owned): Set<string> {
  const s = new Set(Object.keys(o.files));
  for (const [name, u] of Object.entries(o.units)) {
    if (u.sha256 !== undefined) s.add(U(name));
    for (const x of Object.keys(u.dropIns)) s.add(D(name, x));
  }
  return s;
}

function observe(sim: Sim, d: Desired, withSystemd: boolean): Observed {
  const dirs = new Set(d.units.filter((u) => u.dropIns.length === 0 && [...sim.disk.keys()].some((p) => p.startsWith(`${U(u.name)}.d/`))).map((u) => u.name));
  const dropInDirs = dirs.size > 0 ? { dropInDirs: dirs } : {};
  if (!withSystemd) return { files: new Map(sim.disk), ...dropInDirs };
  const units: Units = new Map();
  for (const name of new Set([...d.units.map((u) => u.name), ...Object.keys(sim.owned.units)])) {
    units.set(name, { ...(sim.units.get(name) ?? { unitFileState: "", activeState: "inactive" }) });
  }
  return { files: new Map(sim.disk), units, ...dropInDirs };
}

/** Executes a plan on the simulated node as the executor does: disk, systemd, and Owned step by step, then settled. */
function execute(p: Plan, d: Desired, sim: Sim): void {
  const ownUnit = (name: string): OwnedUnit => {
    const u = sim.owned.units[name] ?? { dropIns: {} };
    sim.owned.units[name] = u;
    return u;
  };
  const state = (name: string): UnitState => {
    const s = sim.units.get(name) ?? { unitFileState: installable(name) ? "disabled" : "static", activeState: "inactive" };
    sim.units.set(name, s);
    return s;
  };
  for (const s of p.steps) {
    switch (s.kind) {
      case "write":
        sim.disk.set(s.path, { sha256: s.sha256, mode: s.mode });
        if (s.target.type === "file") sim.owned.files[s.path] = { sha256: s.sha256, mode: s.mode };
        else if (s.target.type === "unit") ownUnit(s.target.unit).sha256 = s.sha256;
        else ownUnit(s.target.unit).dropIns[s.target.name] = s.sha256;
        break;
      case "remove":
        sim.disk.delete(s.path);
        if (s.target.type === "file") delete sim.owned.files[s.path];
        else if (s.target.type === "unit") {
          delete ownUnit(s.target.unit).sha256;
          sim.units.delete(s.target.unit);
        } else if (s.target.type === "drop-in") delete ownUnit(s.target.unit).dropIns[s.target.name];
        else {
          for (const path of [...sim.disk.keys()]) if (path.startsWith(`${s.path}/`)) sim.disk.delete(path);
          ownUnit(s.target.unit).dropIns = {};
        }
        break;
      case "enable":
        if (installable(s.unit) && state(s.unit).unitFileState !== "static") state(s.unit).unitFileState = "enabled";
        ownUnit(s.unit).enable = true;
        break;
      case "disable":
        if (state(s.unit).unitFileState === "enabled") state(s.unit).unitFileState = "disabled";
        ownUnit(s.unit).enable = false;
        break;
      case "stop":
        state(s.unit).activeState = "inactive";
        break;
      case "restart":
        state(s.unit).activeState = "active";
        break;
      case "daemon-reload":
        break;
    }
  }
  sim.owned = settleOwned(sim.owned, d);
}

/** Someone edits the node between applies. */
function drift(r: Rng, sim: Sim): void {
  for (const path of [...sim.disk.keys()]) {
    if (POOL.foreign.includes(path) || !r.chance(0.1)) continue; // foreign files stay as their owners left them
    const what = r.pick(["delete", "edit", "chmod"] as const);
    if (what === "delete") sim.disk.delete(path);
    else if (what === "edit") sim.disk.set(path, { sha256: sha256Hex(`edited ${path}`), mode: sim.disk.get(path)?.mode ?? 0o600 });
    else sim.disk.set(path, { sha256: sim.disk.get(path)?.sha256 ?? "", mode: 0o777 });
  }
  for (const s of sim.units.values()) {
    if (r.chance(0.1)) s.activeState = r.pick(["active", "inactive", "failed"]);
    if (r.chance(0.1) && s.unitFileState === "enabled") s.unitFileState = "disabled";
  }
}

function checkPlan(p: Plan, d: Desired, sim: Sim, where: string): void {
  const ctx = (msg: string) => `${where}: ${msg}\n${shown(p).join("\n")}`;
  const desiredNames = new Set(d.units.map((u) => u.name));
  const want = desiredPaths(d);
  const owned = ownedPaths(sim.owned);
  const kinds = p.steps.map((s) => s.kind);
  for (const s of p.steps) {
    if (s.kind === "write") {
      if (want.get(s.path) !== s.sha256) throw new Error(ctx(`write ${s.path} is not the desired content`));
    }
    if (s.kind === "remove" && s.target.type === "drop-ins") {
      // A whole drop-in directory goes only for a unit the OSC gives none, and systemd reloads after it.
      if (!d.units.some((u) => u.name === (s.target as { unit: string }).unit && u.dropIns.length === 0)) throw new Error(ctx(`${show(s)}: the unit has drop-ins in the OSC`));
      continue;
    }
    if (s.kind === "remove" && !owned.has(s.path)) throw new Error(ctx(`remove ${s.path}: not owned`));
    if ((s.kind === "write" || s.kind === "remove") && POOL.foreign.includes(s.path)) throw new Error(ctx(`touched foreign ${s.path}`));
  }
  // Unit files written or removed, and enablement of units the OSC keeps (systemd re-reads both on a reload).
  const enablementChanged = p.steps.filter((s) => (s.kind === "enable" || s.kind === "disable") && desiredNames.has(s.unit) && s.reason.startsWith("was ")).length;
  const touches = p.steps.filter((s) => (s.kind === "write" || s.kind === "remove") && s.target.type !== "file").length + enablementChanged;
  const reloads = kinds.filter((k) => k === "daemon-reload").length;
  if (reloads !== (touches > 0 ? 1 : 0)) throw new Error(ctx(`${reloads} daemon-reloads for ${touches} unit file or enablement changes`));
  const lastFs = kinds.findLastIndex((k) => k === "write" || k === "remove");
  const reload = kinds.indexOf("daemon-reload");
  if (reload >= 0 && reload < lastFs) throw new Error(ctx("daemon-reload before a write"));
  p.steps.forEach((s, i) => {
    // Enabling reads the unit file on disk (as `systemctl enable` does, the reload follows it).
    const enablement = (s.kind === "enable" || s.kind === "disable") && desiredNames.has(s.unit);
    const unitStep = s.kind === "restart" || (s.kind === "stop" && desiredNames.has(s.unit));
    if ((enablement && i < lastFs) || (unitStep && (i < lastFs || i < reload))) throw new Error(ctx(`${show(s)} before the files are in place`));
    if (enablement && reload >= 0 && i > reload) throw new Error(ctx(`${show(s)} after the daemon-reload`));
    if ((s.kind === "stop" || s.kind === "disable") && !desiredNames.has(s.unit) && kinds.slice(0, i).some((k) => k === "remove")) {
      throw new Error(ctx(`${show(s)} of a removed unit after a removal`));
    }
    if (s.kind === "write" && kinds.slice(0, i).some((k) => k !== "write")) throw new Error(ctx(`${show(s)} after a step that is not a write`));
  });
  if (desiredNames.has(SELF) && p.steps.some((s) => (s.kind === "stop" || s.kind === "disable") && s.unit === SELF)) throw new Error(ctx("the agent stops or disables itself"));
  const restarts = p.steps.filter((s) => s.kind === "restart").map((s) => (s as { unit: string }).unit);
  if (restarts.includes(SELF) && shown(p).at(-1) !== `restart ${SELF}`) throw new Error(ctx("self restart is not last"));
  const stopped = new Set(p.steps.filter((s) => s.kind === "stop").map((s) => (s as { unit: string }).unit));
  for (const u of restarts) if (stopped.has(u)) throw new Error(ctx(`${u} is both stopped and restarted`));
  if (new Set(shown(p)).size !== p.steps.length) throw new Error(ctx("a step appears twice"));
}

describe("property: random OSC histories", () => {
  test.each([
    ["with systemd", true],
    ["without systemd (plan --root)", false],
  ])("200 random histories converge after each apply and never touch foreign paths (%s)", (_, withSystemd) => {
    for (let seed = 1; seed <= 200; seed++) {
      const r = prng(seed * (withSystemd ? 1 : 7919));
      const sim: Sim = { disk: new Map(), owned: emptyOwned(), units: new Map() };
      for (const path of POOL.foreign) if (r.chance(0.7)) sim.disk.set(path, { sha256: sha256Hex(`foreign ${path}`), mode: 0o644 });
      for (const path of POOL.files) if (r.chance(0.2)) sim.disk.set(path, { sha256: sha256Hex(r.pick(["f1", "pre-existing"])), mode: 0o644 });
      sim.units.set("host.service", { unitFileState: r.pick(["enabled", "static", "disabled"]), activeState: "active" });
      const foreignBefore = new Map(POOL.foreign.map((p) => [p, sim.disk.get(p)]));
      for (let round = 1; round <= 4; round++) {
        const d = randomDesired(r);
        if (round > 1) drift(r, sim);
        const where = `seed ${seed} round ${round}`;
        const p = plan(d, sim.owned, observe(sim, d, withSystemd));
        expect(plan(d, structuredClone(sim.owned), observe(sim, d, withSystemd))).toEqual(p);
        checkPlan(p, d, sim, where);
        // Foreign drop-ins go with their unit's drop-in directory (the only way they may go), and stay gone.
        for (const s of p.steps) if (s.kind === "remove" && s.target.type === "drop-ins") for (const f of foreignBefore.keys()) if (f.startsWith(`${s.path}/`)) foreignBefore.set(f, undefined);
        execute(p, d, sim);
        const again = plan(d, sim.owned, observe(sim, d, withSystemd));
        if (again.steps.length) throw new Error(`${where}: not converged after applying\n${shown(p).join("\n")}\nthen:\n${shown(again).join("\n")}`);
        for (const [path, desiredSha] of desiredPaths(d)) expect(sim.disk.get(path)?.sha256).toBe(desiredSha);
        for (const f of d.files) expect(sim.disk.get(f.path)?.mode).toBe(f.mode);
        for (const [path, before] of foreignBefore) if (!desiredPaths(d).has(path)) expect({ where, path, now: sim.disk.get(path) }).toEqual({ where, path, now: before });
      }
    }
  });
});

test("a path the OSC still declares but that is not written this time (a registry waiting for its probe) is never removed", () => {
  const before = desired([], [file("/opt/bin/tool", "v1")]);
  const after: Desired = { ...desired([], []), keep: ["/opt/bin/tool"] };
  expect(plan(after, ownedFrom(before), observed(diskFrom(before))).steps).toEqual([]);
});
