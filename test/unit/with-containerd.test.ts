// src/plan/with-containerd.ts, and what the plan makes of the result: containerd restarts exactly when
// config.toml is written, never for hosts.toml, and a registry that left the OSC takes its file along.
import { describe, expect, test } from "bun:test";
import { type Desired, type DesiredFile, sha256Hex } from "../../src/api/desired.ts";
import { dropInPath } from "../../src/api/paths.ts";
import { emptyOwned, type Owned } from "../../src/api/state.ts";
import { containerdConfigFile, type ContainerdDesired, hostsTomlPath } from "../../src/plan/containerd.ts";
import { makePlan } from "../../src/plan/plan.ts";
import type { Observed } from "../../src/plan/types.ts";
import { withContainerd } from "../../src/plan/with-containerd.ts";

const WHERE = "Secret kube-system/osc: spec.criConfig";
const envDropIn = { unit: "containerd.service", name: "30-env_config.conf", content: '[Service]\nEnvironment="PATH=/var/bin/containerruntimes:/usr/bin"\n' } as const;

function cd(config: string, registries: Record<string, string> = {}, pending: string[] = [], notes: string[] = []): ContainerdDesired {
  return {
    configToml: config,
    configChanged: true,
    configVersion: 2,
    notes,
    hostsFiles: Object.entries(registries).map(([upstream, content]) => ({ upstream, path: hostsTomlPath(upstream), content })),
    pendingRegistries: pending,
    upstreams: [...Object.keys(registries), ...pending],
    directories: [],
    envDropIn,
  };
}

const empty = (): Desired => ({ units: [], files: [], unsupported: [], keep: [] });
function merged(d: Desired, c: ContainerdDesired): Desired {
  const r = withContainerd(d, c, WHERE);
  if (!r.ok) throw new Error(r.errors.join("\n"));
  return r.value;
}

// The node after a complete apply of `d`: owned, on disk, containerd running.
function appliedState(d: Desired): { owned: Owned; observed: Observed } {
  const owned = emptyOwned();
  const files = new Map<string, { sha256: string; mode: number } | null>();
  for (const f of d.files) {
    owned.files[f.path] = { sha256: f.sha256, mode: f.mode };
    files.set(f.path, { sha256: f.sha256, mode: f.mode });
  }
  for (const u of d.units) {
    owned.units[u.name] = { enable: u.enable, dropIns: Object.fromEntries(u.dropIns.map((x) => [x.name, x.sha256])) };
    for (const x of u.dropIns) files.set(dropInPath(u.name, x.name), { sha256: x.sha256, mode: 0o600 });
  }
  return { owned, observed: { files, units: new Map([["containerd.service", { unitFileState: "enabled", activeState: "active" }]]) } };
}

const planFor = (after: Desired, before: Desired) => {
  const { owned, observed } = appliedState(before);
  // Paths only the new state has are not on disk yet.
  const files = new Map(observed.files);
  for (const f of after.files) if (!files.has(f.path)) files.set(f.path, null);
  return makePlan({ checksum: "c", desired: after, owned, observed: { ...observed, files }, selfUnit: "gardener-node-agent.service" });
};
const restarts = (p: ReturnType<typeof makePlan>) => p.steps.flatMap((s) => (s.kind === "restart" ? [s.unit] : []));
const writes = (p: ReturnType<typeof makePlan>) => p.steps.flatMap((s) => (s.kind === "write" ? [s.path] : []));

describe("containerd's configuration as desired files and unit", () => {
  test("config.toml and each hosts.toml become files (0644), containerd.service gets the drop-in and lists config.toml", () => {
    const d = merged(empty(), cd("version = 2\n", { "registry.example.invalid": "server = 'x'\n" }));
    expect(d.files.map((f) => [f.path, f.mode])).toEqual([
      [containerdConfigFile, 0o644],
      [hostsTomlPath("registry.example.invalid"), 0o644],
    ]);
    expect(d.units).toEqual([
      {
        name: "containerd.service",
        enable: true,
        dropIns: [{ name: envDropIn.name, content: envDropIn.content, sha256: sha256Hex(envDropIn.content) }],
        filePaths: [containerdConfigFile],
      },
    ]);
  });

  test("a containerd.service the OSC declares keeps its own settings and gains the drop-in and file path", () => {
    const d = empty();
    d.units.push({ name: "containerd.service", enable: true, command: "start", dropIns: [{ name: "10-x.conf", content: "x", sha256: sha256Hex("x") }], filePaths: ["/etc/x"] });
    const u = merged(d, cd("version = 2\n")).units[0];
    expect(u?.command).toBe("start");
    expect(u?.dropIns.map((x) => x.name)).toEqual(["10-x.conf", envDropIn.name]);
    expect(u?.filePaths).toEqual(["/etc/x", containerdConfigFile]);
  });

  test("an OSC file at config.toml or a drop-in of the same name is an error naming both", () => {
    const f: DesiredFile = { path: containerdConfigFile, mode: 0o644, content: new Uint8Array(), sha256: sha256Hex(""), origin: "spec.files[3] (/etc/containerd/config.toml)" };
    const r = withContainerd({ ...empty(), files: [f] }, cd("version = 2\n"), WHERE);
    expect(r).toEqual({ ok: false, errors: [`spec.files[3] (/etc/containerd/config.toml): path is also written by ${WHERE}`] });
    const d = empty();
    d.units.push({ name: "containerd.service", enable: true, dropIns: [{ name: envDropIn.name, content: "y", sha256: sha256Hex("y") }], filePaths: [] });
    const r2 = withContainerd(d, cd("version = 2\n"), WHERE);
    expect(r2.ok).toBe(false);
  });

  test("a registry waiting for its readiness probe keeps its file on the node", () => {
    const d = merged(empty(), cd("version = 2\n", {}, ["mirror.example"]));
    expect(d.keep).toEqual([hostsTomlPath("mirror.example")]);
    expect(d.files.map((f) => f.path)).toEqual([containerdConfigFile]);
  });

  test("what containerd may not act on is reported with the OSC's unsupported parts", () => {
    const d = merged({ ...empty(), unsupported: ["other"] }, cd("imports = []\n", {}, [], ["config.toml has no version"]));
    expect(d.unsupported).toEqual(["other", "config.toml has no version"]);
  });
});

describe("what the plan restarts", () => {
  const before = merged(empty(), cd("version = 2\n[a]\n", { "r.example": "one\n" }));

  test("nothing changed: nothing written, containerd not restarted", () => {
    const p = planFor(merged(empty(), cd("version = 2\n[a]\n", { "r.example": "one\n" })), before);
    expect(p.steps).toEqual([]);
  });

  test("config.toml changed: written, containerd restarted exactly once", () => {
    const p = planFor(merged(empty(), cd("version = 2\n[b]\n", { "r.example": "one\n" })), before);
    expect(writes(p)).toEqual([containerdConfigFile]);
    expect(restarts(p)).toEqual(["containerd.service"]);
  });

  test("only a hosts.toml changed: written, containerd keeps running", () => {
    const p = planFor(merged(empty(), cd("version = 2\n[a]\n", { "r.example": "two\n" })), before);
    expect(writes(p)).toEqual([hostsTomlPath("r.example")]);
    expect(restarts(p)).toEqual([]);
  });

  test("a registry removed from the OSC: its hosts.toml is removed, containerd keeps running", () => {
    const p = planFor(merged(empty(), cd("version = 2\n[a]\n")), before);
    expect(p.steps.map((s) => [s.kind, "path" in s ? s.path : ""])).toEqual([["remove", hostsTomlPath("r.example")]]);
    expect(restarts(p)).toEqual([]);
  });
});
