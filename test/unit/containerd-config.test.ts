// containerd's configuration from spec.criConfig (src/plan/containerd.ts), against the real default
// configs of containerd 1.6 (version 2), 2.1 (version 3) and 2.3 (version 4) in test/fixtures/containerd/
// (README.md there says where each comes from). Pure: no containerd runs here; the e2e test
// test/integration/containerd-config.test.ts has a real containerd accept what this produces.
import { describe, expect, test } from "bun:test";
import { readFileSync } from "node:fs";
import { parse, stringify } from "smol-toml";
import * as v from "valibot";
import { type CriConfig, CriConfigSchema, managesContainerd } from "../../src/api/cri-config.ts";
import { OperatingSystemConfigSchema } from "../../src/api/osc.ts";
import { builtinDefaultConfig, parseContainerdVersion } from "../../src/host/containerd-defaults.ts";
import { containerdAtLeast22, type ContainerdInputs, containerdDesired, type ContainerdDesired, needsContainerdVersion, renderHostsToml } from "../../src/plan/containerd.ts";
import { prng } from "../harness/prng.ts";

const fixture = (name: string) => readFileSync(new URL(`../fixtures/containerd/${name}`, import.meta.url), "utf8");
const V2 = fixture("config-v2-1.6.toml");
const V3 = fixture("config-v3-2.x.toml");
const V4 = fixture("config-v4-2.3.toml");
const WHERE = "spec.criConfig";

type Doc = Record<string, unknown>;
const toml = (text: string): Doc => parse(text, { integersAsBigInt: true }) as Doc;
const at = (doc: unknown, ...path: string[]): unknown => path.reduce<unknown>((d, k) => (d as Doc | undefined)?.[k], doc);

function desired(input: Partial<ContainerdInputs> & { criConfig: CriConfig }): ContainerdDesired {
  const r = containerdDesired({ defaultConfig: V2, ...input }, WHERE);
  if (!r.ok) throw new Error(`unexpected errors:\n${r.errors.join("\n")}`);
  return r.value;
}
function errorsOf(input: Partial<ContainerdInputs> & { criConfig: CriConfig }): string[] {
  const r = containerdDesired({ defaultConfig: V2, ...input }, WHERE);
  if (r.ok) throw new Error("expected errors, got a config");
  return r.errors;
}

const cri = (c: Omit<CriConfig, "name"> = {}): CriConfig => ({ name: "containerd", containerd: { sandboxImage: "registry.k8s.io/pause:3.10" }, ...c });

// Where each setting lives, per config version (containerd's docs/cri/config.md, Gardener's containerdConfigPaths).
const K = {
  2: {
    configPath: ["plugins", "io.containerd.grpc.v1.cri", "registry", "config_path"],
    sandbox: ["plugins", "io.containerd.grpc.v1.cri", "sandbox_image"],
    systemdCgroup: ["plugins", "io.containerd.grpc.v1.cri", "containerd", "runtimes", "runc", "options", "SystemdCgroup"],
    runtimes: ["plugins", "io.containerd.grpc.v1.cri", "containerd", "runtimes"],
    cni: ["plugins", "io.containerd.grpc.v1.cri", "cni"],
  },
  3: {
    configPath: ["plugins", "io.containerd.cri.v1.images", "registry", "config_path"],
    sandbox: ["plugins", "io.containerd.cri.v1.images", "pinned_images", "sandbox"],
    systemdCgroup: ["plugins", "io.containerd.cri.v1.runtime", "containerd", "runtimes", "runc", "options", "SystemdCgroup"],
    runtimes: ["plugins", "io.containerd.cri.v1.runtime", "containerd", "runtimes"],
    cni: ["plugins", "io.containerd.cri.v1.runtime", "cni"],
  },
} as const;
// `containerd`: the version the containerd that printed the fixture reports through its API.
const versions = [
  { name: "version 2 (containerd 1.6)", text: V2, version: 2, k: K[2], containerd: "1.6.20~ds1" },
  { name: "version 3 (containerd 2.1)", text: V3, version: 3, k: K[3], containerd: "2.1.9" },
  { name: "version 4 (containerd 2.3)", text: V4, version: 4, k: K[3], containerd: "v2.3.4" },
] as const;

describe.each(versions)("patching the default config of $name", ({ text, version, k, containerd }) => {
  const patch = (input: Partial<ContainerdInputs> & { criConfig: CriConfig }) => desired({ containerdVersion: containerd, ...input });
  test("the fixture is what the test thinks it is", () => {
    expect(at(toml(text), "version")).toBe(BigInt(version));
    expect(at(toml(text), ...k.configPath)).toBe("");
  });

  test("sets config_path, imports, the sandbox image, SystemdCgroup and the CNI bin dir", () => {
    const d = patch({ criConfig: cri({ cgroupDriver: "systemd", containerd: { sandboxImage: "example.org/pause:9" } }), defaultConfig: text });
    const doc = toml(d.configToml);
    expect(d.configVersion).toBe(version);
    expect(d.configChanged).toBe(true);
    expect(at(doc, ...k.configPath)).toBe("/etc/containerd/certs.d");
    expect(at(doc, "imports")).toEqual(["/etc/containerd/conf.d/*.toml"]);
    expect(at(doc, ...k.sandbox)).toBe("example.org/pause:9");
    expect(at(doc, ...k.systemdCgroup)).toBe(true);
    if (version < 4) {
      // Below containerd 2.2, bin_dir (2.1 prints bin_dirs too, and drops its default when bin_dir is set).
      expect(at(doc, ...k.cni, "bin_dir")).toBe("/opt/cni/bin");
      expect(at(doc, ...k.cni, "bin_dirs")).toEqual(at(toml(text), ...k.cni, "bin_dirs"));
    } else {
      // 2.2+ deprecates bin_dir and refuses it next to a bin_dirs of other directories.
      expect(at(doc, ...k.cni, "bin_dirs")).toEqual(["/opt/cni/bin"]);
      expect(at(doc, ...k.cni, "bin_dir")).toBeUndefined();
    }
  });

  test("cgroupfs turns SystemdCgroup off; no cgroupDriver leaves it as it was", () => {
    const on = patch({ criConfig: cri({ cgroupDriver: "systemd" }), defaultConfig: text }).configToml;
    expect(at(toml(patch({ criConfig: cri({ cgroupDriver: "cgroupfs" }), current: on, defaultConfig: text }).configToml), ...k.systemdCgroup)).toBe(false);
    expect(patch({ criConfig: cri({}), current: on, defaultConfig: text }).configChanged).toBe(false);
  });

  test("no sandbox image keeps the default one", () => {
    const d = patch({ criConfig: cri({ containerd: {} }), defaultConfig: text });
    expect(at(toml(d.configToml), ...k.sandbox)).toBe(at(toml(text), ...k.sandbox));
  });

  test("everything else of the default config stays as it was, values and types", () => {
    const before = toml(text);
    const after = toml(patch({ criConfig: cri({ cgroupDriver: "systemd" }), defaultConfig: text }).configToml);
    for (const path of [k.configPath, k.sandbox, k.systemdCgroup, [...k.cni, "bin_dir"], [...k.cni, "bin_dirs"], ["imports"]]) {
      for (const d of [before, after]) {
        const parent = at(d, ...path.slice(0, -1)) as Doc | undefined;
        if (parent) delete parent[path[path.length - 1] as string];
      }
    }
    expect(after).toEqual(before);
    // Floats stay floats and integers integers (pause_threshold = 0.02, deletion_threshold = 0).
    const gc = at(after, "plugins", "io.containerd.gc.v1.scheduler") as Doc;
    expect(gc.pause_threshold).toBe(0.02);
    expect(gc.deletion_threshold).toBe(0n);
  });

  test("patching its own output changes nothing (byte for byte)", () => {
    const c = cri({ cgroupDriver: "systemd", containerd: { sandboxImage: "p:1", plugins: [{ path: ["x", "y"], values: { a: 1 } }] } });
    const once = patch({ criConfig: c, defaultConfig: text });
    const twice = patch({ criConfig: c, current: once.configToml, defaultConfig: text });
    expect(twice.configToml).toBe(once.configToml);
    expect(twice.configChanged).toBe(false);
  });
});

describe("a file without version (config version 1), as gardener-node-agent patches it", () => {
  // Docker's containerd.io package ships one like this.
  const docker = 'disabled_plugins = []\n\n[plugins.cri]\n  sandbox_image = "registry.k8s.io/pause:3.6"\n';
  test("is patched with version 2's keys, gets no version, and says containerd 1.x will not read them", () => {
    const d = desired({ criConfig: cri({ cgroupDriver: "systemd" }), current: docker });
    const doc = toml(d.configToml);
    expect(d.configVersion).toBe(1);
    expect(doc.version).toBeUndefined();
    expect(at(doc, ...K[2].configPath)).toBe("/etc/containerd/certs.d");
    expect(at(doc, ...K[2].sandbox)).toBe("registry.k8s.io/pause:3.10");
    expect(at(doc, ...K[2].systemdCgroup)).toBe(true);
    expect(at(doc, ...K[2].cni, "bin_dir")).toBe("/opt/cni/bin");
    expect(at(doc, "plugins", "cri")).toEqual({ sandbox_image: "registry.k8s.io/pause:3.6" });
    expect(d.notes).toEqual([expect.stringContaining("spec.criConfig: /etc/containerd/config.toml has no `version`, so containerd reads it as config version 1")]);
  });

  test("`version = 1` is the same", () => {
    const d = desired({ criConfig: cri(), current: "version = 1\n" });
    expect(d.configVersion).toBe(1);
    expect(at(toml(d.configToml), ...K[2].configPath)).toBe("/etc/containerd/certs.d");
    expect(d.notes).toHaveLength(1);
  });

  test("plugin paths are not moved to version 3's plugins", () => {
    const d = desired({ criConfig: cri({ containerd: { plugins: [{ path: ["io.containerd.grpc.v1.cri", "containerd", "runtimes", "runsc"], values: { runtime_type: "io.containerd.runsc.v1" } }] } }), current: docker });
    expect(at(toml(d.configToml), ...K[2].runtimes, "runsc", "runtime_type")).toBe("io.containerd.runsc.v1");
  });

  test("versions 2 to 4 have no note", () => {
    expect(desired({ criConfig: cri(), current: "version = 2\n" }).notes).toEqual([]);
  });
});

describe("the CNI directory follows containerd's own version (gardener-node-agent asks its API)", () => {
  test.each([
    ["2.2.0", true],
    ["v2.2.1", true],
    ["2.2.0-rc.1", true],
    ["2.2", true],
    ["2.10.0", true],
    ["3.0.0", true],
    ["2.1.9", false],
    ["1.7.27", false],
    ["1.6.20~ds1", false],
    ["2", false],
    ["", undefined],
    ["dev", undefined],
    ["2.2.0.1", undefined],
  ] as const)("containerdAtLeast22(%p) = %p", (version, want) => {
    expect(containerdAtLeast22(version)).toBe(want);
  });

  test.each([
    ["2.2.0", V3],
    ["2.3.4", V4],
  ])("containerd %s on a version 3+ config: bin_dirs, and no bin_dir", (containerdVersion, base) => {
    const cni = at(toml(desired({ criConfig: cri(), defaultConfig: base, containerdVersion }).configToml), ...K[3].cni) as Doc;
    expect(cni.bin_dirs).toEqual(["/opt/cni/bin"]);
    expect(cni.bin_dir).toBeUndefined();
  });

  test("containerd 2.1 on the same version 3 config: bin_dir, whatever bin_dirs the file has", () => {
    const current = "version = 3\n[plugins.'io.containerd.cri.v1.runtime'.cni]\nbin_dirs = ['/usr/lib/cni']\n";
    const cni = at(toml(desired({ criConfig: cri(), current, containerdVersion: "2.1.9" }).configToml), ...K[3].cni) as Doc;
    expect(cni).toEqual({ bin_dir: "/opt/cni/bin", bin_dirs: ["/usr/lib/cni"] });
  });

  test("a version 2 config gets bin_dir, whatever containerd says (it is not asked)", () => {
    expect(at(toml(desired({ criConfig: cri(), current: "version = 2\n", containerdVersion: "2.3.4" }).configToml), ...K[2].cni, "bin_dir")).toBe("/opt/cni/bin");
  });

  test.each([
    [undefined, V2, false],
    [undefined, V3, true],
    [undefined, V4, true],
    ["# empty\n", V3, true],
    ["version = 3\n", V2, true],
    ["version = 2\n", V3, false],
    ["[plugins.cri]\n", V3, false],
    ["version = = 3\n", V3, false],
    ["version = 9\n", V3, false],
  ] as const)("needsContainerdVersion(current %p, default …) is %p", (current, base, want) => {
    expect(needsContainerdVersion(current, base)).toBe(want);
  });

  test("a version 3+ config without containerd's version, or with one that is not a version, is an error", () => {
    expect(errorsOf({ criConfig: cri(), defaultConfig: V3 })).toEqual([
      "containerd's default config: version 3: containerd's version is needed to choose between cni.bin_dir and cni.bin_dirs, and was not given",
    ]);
    expect(errorsOf({ criConfig: cri(), defaultConfig: V3, containerdVersion: "dev" })).toEqual([
      'containerd\'s version: "dev" (as its API reports it) is not a version x.y.z; needed to choose between cni.bin_dir and cni.bin_dirs',
    ]);
  });
});

describe("the current file", () => {
  test("is the base when present; the default config is then not used", () => {
    const current = 'version = 2\n[plugins."io.containerd.internal.v1.opt"]\n  path = "/var/lib/containerd/opt"\n';
    const d = desired({ criConfig: cri(), current, defaultConfig: V3 });
    expect(d.configVersion).toBe(2);
    const doc = toml(d.configToml);
    expect(at(doc, "plugins", "io.containerd.internal.v1.opt", "path")).toBe("/var/lib/containerd/opt");
    expect(at(doc, ...K[2].configPath)).toBe("/etc/containerd/certs.d");
    expect(at(doc, "root")).toBeUndefined(); // nothing taken over from the default config
  });

  test("foreign settings are kept: other plugins, other imports, comments aside", () => {
    const current = [
      "# written by the image build",
      "version = 2",
      'imports = ["/etc/containerd/extra.toml"]',
      "oom_score = -999",
      "[debug]",
      '  level = "debug"',
      '[plugins."io.containerd.grpc.v1.cri"]',
      "  max_container_log_line_size = 16384",
      '[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.kata]',
      '  runtime_type = "io.containerd.kata.v2"',
      '[plugins."io.containerd.snapshotter.v1.overlayfs"]',
      '  mount_options = ["volatile"]',
      "",
    ].join("\n");
    const doc = toml(desired({ criConfig: cri({ cgroupDriver: "systemd" }), current }).configToml);
    expect(at(doc, "imports")).toEqual(["/etc/containerd/extra.toml", "/etc/containerd/conf.d/*.toml"]);
    expect(at(doc, "oom_score")).toBe(-999n);
    expect(at(doc, "debug", "level")).toBe("debug");
    expect(at(doc, "plugins", "io.containerd.grpc.v1.cri", "max_container_log_line_size")).toBe(16384n);
    expect(at(doc, ...K[2].runtimes, "kata", "runtime_type")).toBe("io.containerd.kata.v2");
    expect(at(doc, "plugins", "io.containerd.snapshotter.v1.overlayfs", "mount_options")).toEqual(["volatile"]);
  });

  test("an import already listed is not added twice", () => {
    const current = 'version = 2\nimports = ["/etc/containerd/conf.d/*.toml", "/x.toml"]\n';
    expect(at(toml(desired({ criConfig: cri(), current }).configToml), "imports")).toEqual(["/etc/containerd/conf.d/*.toml", "/x.toml"]);
  });

  test("a file that already says everything is returned unchanged, whatever its layout, quoting and comments", () => {
    // The same settings as the patched 1.6 default, written by hand in another order and style.
    const current = `# hand-written, keep me
imports = ['/etc/containerd/conf.d/*.toml']
version = 2

[plugins]
  [plugins.'io.containerd.grpc.v1.cri']
    sandbox_image = 'registry.k8s.io/pause:3.10'
    registry = { config_path = '/etc/containerd/certs.d' }
    [plugins.'io.containerd.grpc.v1.cri'.cni]
      bin_dir = "/opt/cni/bin"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
      SystemdCgroup = true     # comment
`;
    const d = desired({ criConfig: cri({ cgroupDriver: "systemd" }), current });
    expect(d.configChanged).toBe(false);
    expect(d.configToml).toBe(current);
  });

  test("Debian's config.toml (only the CNI directories): the runc table trellis creates gets containerd's runtime type", () => {
    // containerd decodes runtimes entry by entry: runc with only `options` would have no type, and every
    // pod sandbox failed with "container.Runtime.Name must be set" (found with a real kubelet).
    const debian = `version = 2\n\n[plugins]\n  [plugins."io.containerd.grpc.v1.cri"]\n    [plugins."io.containerd.grpc.v1.cri".cni]\n      bin_dir = "/usr/lib/cni"\n      conf_dir = "/etc/cni/net.d"\n`;
    const d = desired({ criConfig: cri({ cgroupDriver: "systemd" }), current: debian });
    const runc = at(toml(d.configToml), "plugins", "io.containerd.grpc.v1.cri", "containerd", "runtimes", "runc");
    expect(runc).toEqual({ runtime_type: "io.containerd.runc.v2", options: { SystemdCgroup: true } });
  });

  test("a runc runtime type already there is kept", () => {
    const current = `version = 2\n[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]\nruntime_type = "io.containerd.runc.v3"\n`;
    const d = desired({ criConfig: cri({ cgroupDriver: "systemd" }), current });
    expect(at(toml(d.configToml), "plugins", "io.containerd.grpc.v1.cri", "containerd", "runtimes", "runc", "runtime_type")).toBe("io.containerd.runc.v3");
  });

  test("one real difference rewrites the whole file (comments are not kept then)", () => {
    const current = "# mine\nversion = 2\n";
    const d = desired({ criConfig: cri(), current });
    expect(d.configChanged).toBe(true);
    expect(d.configToml).not.toContain("# mine");
  });

  test("an empty current file is treated as missing: the default config is patched (gardener-node-agent patches it as version 1)", () => {
    const d = desired({ criConfig: cri(), current: "# nothing here\n", defaultConfig: V3, containerdVersion: "2.1.9" });
    expect(d.configVersion).toBe(3);
    expect(at(toml(d.configToml), ...K[3].configPath)).toBe("/etc/containerd/certs.d");
  });

  test("the built-in default (containerd not installed) is a version 2 config that patches cleanly", () => {
    const d = desired({ criConfig: cri({ cgroupDriver: "systemd" }), defaultConfig: builtinDefaultConfig });
    expect(d.configVersion).toBe(2);
    expect(at(toml(d.configToml), ...K[2].systemdCgroup)).toBe(true);
  });

  test("integers and floats keep their TOML types through a rewrite", () => {
    const current = "version = 2\na = 1\nb = 1.0\nc = 1.5\nd = 1979-05-27T07:32:00Z\ne = 9007199254740993\n";
    const out = desired({ criConfig: cri(), current }).configToml;
    expect(out).toMatch(/^a = 1$/m);
    expect(out).toMatch(/^b = 1\.0$/m);
    expect(out).toMatch(/^c = 1\.5$/m);
    expect(out).toMatch(/^d = 1979-05-27T07:32:00/m);
    expect(out).toMatch(/^e = 9007199254740993$/m);
  });
});

describe("plugin operations", () => {
  const runtimes2 = K[2].runtimes;
  test("add replaces each top-level key of values at the path and keeps the others; whole numbers become integers", () => {
    const current = 'version = 2\n[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runsc]\n  runtime_type = "old"\n  keep = true\n  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runsc.options]\n    TypeUrl = "x"\n';
    const d = desired({
      criConfig: cri({
        containerd: {
          sandboxImage: "p",
          plugins: [{ path: ["io.containerd.grpc.v1.cri", "containerd", "runtimes", "runsc"], values: { runtime_type: "io.containerd.runsc.v1", options: { ConfigPath: "/etc/runsc.toml" }, n: 3, f: 0.5, list: ["a", 1] } }],
        },
      }),
      current,
    });
    const runsc = at(toml(d.configToml), ...runtimes2, "runsc");
    // options is replaced as a whole, as json.Unmarshal does: TypeUrl, which the OSC no longer gives, is gone.
    expect(runsc).toEqual({ runtime_type: "io.containerd.runsc.v1", keep: true, options: { ConfigPath: "/etc/runsc.toml" }, n: 3n, f: 0.5, list: ["a", 1n] });
  });

  test("a nested key an extension dropped from its values goes on the next apply", () => {
    const op = (options: Record<string, unknown>) => cri({ containerd: { plugins: [{ path: ["io.containerd.grpc.v1.cri", "containerd", "runtimes", "runsc"], values: { runtime_type: "io.containerd.runsc.v1", options } }] } });
    const first = desired({ criConfig: op({ ConfigPath: "/etc/runsc.toml", Debug: true }), current: "version = 2\n" });
    const second = desired({ criConfig: op({ ConfigPath: "/etc/runsc.toml" }), current: first.configToml });
    expect(second.configChanged).toBe(true);
    expect(at(toml(second.configToml), ...runtimes2, "runsc", "options")).toEqual({ ConfigPath: "/etc/runsc.toml" });
  });

  test("add without values only creates the table", () => {
    const d = desired({ criConfig: cri({ containerd: { plugins: [{ op: "add", path: ["io.containerd.grpc.v1.cri", "new"] }] } }), current: "version = 2\n" });
    expect(at(toml(d.configToml), "plugins", "io.containerd.grpc.v1.cri", "new")).toEqual({});
    expect(d.configToml).toContain('[plugins."io.containerd.grpc.v1.cri".new]');
  });

  test("add turns a non-table at the last key into a table (as Gardener does)", () => {
    const d = desired({ criConfig: cri({ containerd: { plugins: [{ path: ["p", "k"], values: { a: "b" } }] } }), current: 'version = 2\n[plugins.p]\nk = "scalar"\n' });
    expect(at(toml(d.configToml), "plugins", "p", "k")).toEqual({ a: "b" });
  });

  test("null in values removes that key; null inside a table given leaves its key out", () => {
    const current = 'version = 2\n[plugins.p]\na = 1\nb = 2\n[plugins.p.t]\nc = 3\ne = 5\n';
    const d = desired({ criConfig: cri({ containerd: { plugins: [{ path: ["p"], values: { a: null, t: { c: null, d: 4 } } }] } }), current });
    expect(at(toml(d.configToml), "plugins", "p")).toEqual({ b: 2n, t: { d: 4n } });
  });

  test("remove deletes the subtree", () => {
    const withRemove = desired({ criConfig: cri({ containerd: { sandboxImage: "registry.k8s.io/pause:3.10", plugins: [{ op: "remove", path: ["io.containerd.grpc.v1.cri", "cni"] }] } }), defaultConfig: V2 });
    const doc = toml(withRemove.configToml);
    expect(at(doc, ...K[2].cni)).toBeUndefined();
    expect(at(doc, "plugins", "io.containerd.grpc.v1.cri", "sandbox_image")).toBe("registry.k8s.io/pause:3.10");
  });

  test("a path that does not exist yet gets its tables, for remove too (as Gardener's SetMapEntry does)", () => {
    const d = desired({ criConfig: cri({ containerd: { plugins: [{ op: "remove", path: ["no", "such", "thing"] }, { path: ["new", "deep", "t"], values: { a: 1 } }] } }), current: "version = 2\n" });
    const plugins = at(toml(d.configToml), "plugins");
    expect(at(plugins, "no")).toEqual({ such: {} });
    expect(at(plugins, "new")).toEqual({ deep: { t: { a: 1n } } });
    expect(d.configToml).toContain("[plugins.no.such]");
  });

  test("ops apply in order: remove then add replaces a subtree; add then remove deletes it", () => {
    const current = 'version = 2\n[plugins.p.t]\nold = 1\n';
    const a = desired({ criConfig: cri({ containerd: { plugins: [{ op: "remove", path: ["p", "t"] }, { path: ["p", "t"], values: { new: 2 } }] } }), current });
    expect(at(toml(a.configToml), "plugins", "p", "t")).toEqual({ new: 2n });
    const b = desired({ criConfig: cri({ containerd: { plugins: [{ path: ["p", "t"], values: { new: 2 } }, { op: "remove", path: ["p", "t"] }] } }), current });
    expect(at(toml(b.configToml), "plugins", "p")).toEqual({});
  });

  test.each([
    [3, V3, K[3].runtimes],
    [4, V4, K[3].runtimes],
  ] as const)("on version %d, paths under the old CRI plugin's runtimes move to the runtime plugin (as Gardener does)", (_, text, runtimes) => {
    const d = desired({ criConfig: cri({ containerd: { plugins: [{ path: ["io.containerd.grpc.v1.cri", "containerd", "runtimes", "runsc"], values: { runtime_type: "io.containerd.runsc.v1" } }] } }), defaultConfig: text, containerdVersion: "2.3.4" });
    const doc = toml(d.configToml);
    expect(at(doc, ...runtimes, "runsc", "runtime_type")).toBe("io.containerd.runsc.v1");
    expect(at(doc, "plugins", "io.containerd.grpc.v1.cri", "containerd")).toBeUndefined();
  });

  test("keys with dots and odd characters are quoted in the file and read back as one key; an empty key is a key", () => {
    const d = desired({ criConfig: cri({ containerd: { plugins: [{ path: ["io.containerd.x.v1", "a b", 'q"uote'], values: { "k.e.y": "v", __proto__x: 1 } }, { path: ["x", ""], values: { "": 1 } }] } }), current: "version = 2\n" });
    expect(d.configToml).toContain('[plugins."io.containerd.x.v1"."a b"."q\\"uote"]');
    expect(at(toml(d.configToml), "plugins", "io.containerd.x.v1", "a b", 'q"uote', "k.e.y")).toBe("v");
    expect(at(toml(d.configToml), "plugins", "x", "", "")).toBe(1n);
  });

  test("a key named __proto__ is a key, not a prototype", () => {
    const values = JSON.parse('{"__proto__": {"polluted": "yes"}}') as Record<string, unknown>;
    const d = desired({ criConfig: cri({ containerd: { plugins: [{ path: ["p"], values }] } }), current: "version = 2\n" });
    expect(({} as Record<string, unknown>).polluted).toBeUndefined();
    expect(d.configToml).toContain('[plugins.p.__proto__]\npolluted = "yes"');
  });
});

describe("errors name the field", () => {
  const reg = (upstream: string, url = "https://mirror.example.com") => ({ upstream, hosts: [{ url }] });
  test.each([
    ["docker.io/library", "spec.criConfig.containerd.registries[0].upstream: \"docker.io/library\" must be host[:port]"],
    ["..", 'spec.criConfig.containerd.registries[0].upstream: ".." must be host[:port]'],
    ["a..b", 'spec.criConfig.containerd.registries[0].upstream: "a..b" must be host[:port]'],
    ["Docker.io", 'spec.criConfig.containerd.registries[0].upstream: "Docker.io" must be host[:port]'],
    ["https://docker.io", 'spec.criConfig.containerd.registries[0].upstream: "https://docker.io" must be host[:port]'],
    ["", 'spec.criConfig.containerd.registries[0].upstream: "" must be host[:port]'],
    ["host:70000", 'spec.criConfig.containerd.registries[0].upstream: "host:70000" has a port outside 1–65535'],
    ["host:0", 'spec.criConfig.containerd.registries[0].upstream: "host:0" has a port outside 1–65535'],
  ])("upstream %p", (upstream, message) => {
    expect(errorsOf({ criConfig: cri({ containerd: { registries: [reg(upstream)] } }) }).join("\n")).toContain(message);
  });

  test.each(["docker.io", "registry-1.docker.io:443", "127.0.0.1:5000", "_default", "localhost"])("upstream %p is fine", (upstream) => {
    expect(desired({ criConfig: cri({ containerd: { registries: [reg(upstream)] } }) }).hostsFiles[0]?.path).toBe(`/etc/containerd/certs.d/${upstream}/hosts.toml`);
  });

  test("bad URLs, duplicates, capabilities paths and plugin mistakes are all reported at once", () => {
    const errors = errorsOf({
      criConfig: {
        name: "containerd",
        containerd: {
          registries: [
            { upstream: "docker.io", server: "ftp://x", hosts: [{ url: "https://ok.example.com" }] },
            { upstream: "quay.io", hosts: [{ url: "https://ok.example.com" }, { url: "mirror.local:5000" }, { url: 'https://a"b' }, { url: "https://x", caCerts: ["ok.pem", "bad\npath"] }] },
            { upstream: "docker.io", hosts: [] },
          ],
          plugins: [{ path: [] }, { op: "remove", path: ["a"], values: {} }, { path: ["a"], values: { list: [1, null] } }],
        },
      },
    });
    expect(errors).toEqual([
      'spec.criConfig.containerd.registries[0].server: "ftp://x" has scheme ftp; want http or https',
      'spec.criConfig.containerd.registries[1].hosts[1].url: "mirror.local:5000" has scheme mirror.local; want http or https',
      'spec.criConfig.containerd.registries[1].hosts[2].url: "https://a"b" must not contain spaces, quotes, backslashes or control characters',
      "spec.criConfig.containerd.registries[1].hosts[3].caCerts[1]: must be a file path without control characters",
      'spec.criConfig.containerd.registries[2].upstream: duplicate "docker.io", also in spec.criConfig.containerd.registries[0]',
      "spec.criConfig.containerd.plugins[0].path: must name at least one key below plugins",
      "spec.criConfig.containerd.plugins[1].values: must not be set when op is remove",
      "spec.criConfig.containerd.plugins[2].values.list[1]: null is not allowed in an array (TOML has no null)",
    ]);
  });

  test("a plugin path through a non-table names the plugin entry and the key", () => {
    const errors = errorsOf({ criConfig: cri({ containerd: { plugins: [{ path: ["io.containerd.grpc.v1.cri", "sandbox_image", "x"], values: {} }] } }) });
    expect(errors).toEqual([
      'spec.criConfig.containerd.plugins[0].path: plugins."io.containerd.grpc.v1.cri".sandbox_image is a string in containerd\'s default config, not a table',
    ]);
  });

  test("a current file where a setting's table is a value names the file and key", () => {
    const errors = errorsOf({ criConfig: cri(), current: 'version = 2\n[plugins]\n"io.containerd.grpc.v1.cri" = "oops"\n' });
    expect(errors[0]).toBe('/etc/containerd/config.toml: plugins."io.containerd.grpc.v1.cri": is a string, not a table');
  });

  test.each([
    ["version 5", "version = 5\n", "/etc/containerd/config.toml: version: 5 is not supported; want 1 or none, 2 (containerd 1.x), 3 (containerd 2.0–2.2) or 4 (containerd 2.3+)"],
    ["version 0", "version = 0\n", "/etc/containerd/config.toml: version: 0 is not supported"],
    ["version as a string", 'version = "2"\n', "/etc/containerd/config.toml: version: 2 is not supported"],
    ["not TOML", "version = = 2\n", "/etc/containerd/config.toml: not valid TOML: line 1, column"],
  ])("current file with %s", (_, current, message) => {
    expect(errorsOf({ criConfig: cri(), current })[0]).toStartWith(message);
  });

  test("the default config is named when it is the one at fault", () => {
    expect(errorsOf({ criConfig: cri(), defaultConfig: "version = 7\n" })[0]).toStartWith("containerd's default config: version: 7 is not supported");
  });

  test.each([
    ["mirrors", 'version = 2\n[plugins."io.containerd.grpc.v1.cri".registry.mirrors."docker.io"]\nendpoint = ["https://m"]\n', 'plugins."io.containerd.grpc.v1.cri".registry.mirrors'],
    ["configs.*.tls", 'version = 2\n[plugins."io.containerd.grpc.v1.cri".registry.configs."m".tls]\ninsecure_skip_verify = true\n', 'plugins."io.containerd.grpc.v1.cri".registry.configs.m.tls'],
  ])("legacy registry %s next to config_path (containerd refuses to start the CRI plugin)", (_, current, key) => {
    expect(errorsOf({ criConfig: cri(), current })).toEqual([
      `/etc/containerd/config.toml: ${key}: containerd refuses it together with config_path, which trellis sets for the OSC's registries; move it to /etc/containerd/certs.d/<registry>/hosts.toml`,
    ]);
  });

  test("legacy registry settings removed by a plugin op are fine (that is how an OSC cleans them up)", () => {
    const current = 'version = 2\n[plugins."io.containerd.grpc.v1.cri".registry.mirrors."docker.io"]\nendpoint = ["https://m"]\n';
    const d = desired({ criConfig: cri({ containerd: { plugins: [{ op: "remove", path: ["io.containerd.grpc.v1.cri", "registry", "mirrors"] }] } }), current });
    expect(at(toml(d.configToml), ...K[2].configPath.slice(0, -1))).toEqual({ config_path: "/etc/containerd/certs.d" });
  });

  test("a CRI other than containerd", () => {
    expect(errorsOf({ criConfig: { name: "cri-o", containerd: {} } })).toEqual(['spec.criConfig.name: "cri-o" is not supported; trellis configures only containerd']);
  });
});

describe("hosts.toml", () => {
  // The two files of Gardener's integration test (test/integration/nodeagent/operatingsystemconfig), byte for byte.
  test("Gardener's layout: header, server, one table per host with default capabilities", () => {
    expect(
      renderHostsToml({ upstream: "docker.io", server: "https://registry.hub.docker.com", hosts: [{ url: "https://10.10.10.100:8080" }, { url: "https://10.10.10.200:8080" }] }),
    ).toBe('# managed by gardener-node-agent\nserver = "https://registry.hub.docker.com"\n\n[host."https://10.10.10.100:8080"]\n  capabilities = ["pull","resolve"]\n\n[host."https://10.10.10.200:8080"]\n  capabilities = ["pull","resolve"]\n\n');
    expect(
      renderHostsToml({ upstream: "registry.k8s.io", server: "https://registry.k8s.io", hosts: [{ url: "https://10.10.10.101:8080", capabilities: ["pull"], caCerts: ["/var/certs/ca.crt"], overridePath: true }] }),
    ).toBe('# managed by gardener-node-agent\nserver = "https://registry.k8s.io"\n\n[host."https://10.10.10.101:8080"]\n  capabilities = ["pull"]\n  ca = ["/var/certs/ca.crt"]\n  override_path = true\n\n');
  });

  test.each([
    ["no server", { upstream: "a", hosts: [{ url: "http://127.0.0.1:5000" }] }, '# managed by gardener-node-agent\n[host."http://127.0.0.1:5000"]\n  capabilities = ["pull","resolve"]\n\n'],
    ["no hosts", { upstream: "a", server: "https://a" }, '# managed by gardener-node-agent\nserver = "https://a"\n\n'],
    ["nothing", { upstream: "a" }, "# managed by gardener-node-agent\n"],
    ["empty capabilities, overridePath false", { upstream: "a", hosts: [{ url: "https://m", capabilities: [], overridePath: false }] }, '# managed by gardener-node-agent\n[host."https://m"]\n  capabilities = ["pull","resolve"]\n\n'],
    ["push and two CAs", { upstream: "a", hosts: [{ url: "https://m/v2/x", capabilities: ["pull", "resolve", "push"] as const, caCerts: ["ca.pem", "/etc/b&c.pem"] }] }, '# managed by gardener-node-agent\n[host."https://m/v2/x"]\n  capabilities = ["pull","resolve","push"]\n  ca = ["ca.pem","/etc/b\\u0026c.pem"]\n\n'],
  ])("%s", (_, registry, text) => {
    expect(renderHostsToml(registry as never)).toBe(text);
    expect(() => parse(text)).not.toThrow(); // and containerd's TOML parser reads the same
  });

  test("every written registry gets one file; readiness-probed ones wait until they are ready", () => {
    const registries = [
      { upstream: "docker.io", hosts: [{ url: "https://m1" }] },
      { upstream: "quay.io", hosts: [{ url: "https://m2" }], readinessProbe: true },
      { upstream: "ghcr.io", hosts: [{ url: "https://m3" }], readinessProbe: true },
    ];
    const d = desired({ criConfig: cri({ containerd: { registries } }), readyRegistries: new Set(["ghcr.io"]) });
    expect(d.hostsFiles.map((f) => [f.upstream, f.path])).toEqual([
      ["docker.io", "/etc/containerd/certs.d/docker.io/hosts.toml"],
      ["ghcr.io", "/etc/containerd/certs.d/ghcr.io/hosts.toml"],
    ]);
    expect(d.pendingRegistries).toEqual(["quay.io"]);
    expect(d.upstreams).toEqual(["docker.io", "quay.io", "ghcr.io"]);
  });

  test("registries do not touch config.toml: adding one is no reason to restart containerd", () => {
    const base = desired({ criConfig: cri() }).configToml;
    const d = desired({ criConfig: cri({ containerd: { sandboxImage: "registry.k8s.io/pause:3.10", registries: [{ upstream: "docker.io", hosts: [{ url: "https://m" }] }] } }), current: base });
    expect(d.configChanged).toBe(false);
    expect(d.hostsFiles).toHaveLength(1);
  });
});

describe("the rest of the result", () => {
  test("the drop-in puts /var/bin/containerruntimes first on containerd's PATH", () => {
    const d = desired({ criConfig: cri() });
    expect(d.envDropIn).toEqual({
      unit: "containerd.service",
      name: "30-env_config.conf",
      content: '[Service]\nEnvironment="PATH=/var/bin/containerruntimes:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"\n',
    });
    expect(desired({ criConfig: cri(), servicePath: "/usr/bin:/bin" }).envDropIn.content).toBe('[Service]\nEnvironment="PATH=/var/bin/containerruntimes:/usr/bin:/bin"\n');
    expect(d.directories).toEqual(["/var/bin/containerruntimes", "/etc/containerd", "/etc/containerd/conf.d", "/etc/containerd/certs.d"]);
  });

  test("managesContainerd: only name containerd with a containerd section (gardener-node-agent's rule)", () => {
    expect(managesContainerd(cri())).toBe(true);
    expect(managesContainerd({ name: "containerd", cgroupDriver: "systemd" })).toBe(false);
    expect(managesContainerd({ name: "cri-o", containerd: {} })).toBe(false);
    expect(managesContainerd(undefined)).toBe(false);
  });

  test.each([
    ["containerd github.com/containerd/containerd 1.6.20~ds1 1.6.20~ds1-1+deb12u3", { version: "1.6.20", major: 1 }],
    ["containerd github.com/containerd/containerd/v2 v2.1.9 8d4ac2b", { version: "2.1.9", major: 2 }],
    ["containerd containerd.io 1.7.27 05044ec0a9a75232cad458027ca83437aae3f4da", { version: "1.7.27", major: 1 }],
    ["containerd github.com/containerd/containerd/v2 2.1.9+unknown ", { version: "2.1.9", major: 2 }],
    ["something else", undefined],
  ])("containerd --version %p", (out, want) => {
    expect(parseContainerdVersion(out)).toEqual(want);
  });
});

describe("the schema", () => {
  const osc = (criConfig: unknown) => ({ apiVersion: "extensions.gardener.cloud/v1alpha1", kind: "OperatingSystemConfig", spec: { criConfig } });
  test("Gardener's shape passes, with nulls", () => {
    const c = {
      name: "containerd",
      cgroupDriver: "systemd",
      containerd: {
        sandboxImage: "p",
        registries: [{ upstream: "docker.io", server: null, hosts: [{ url: "https://m", capabilities: ["pull"], caCerts: null, overridePath: true }], readinessProbe: false }],
        plugins: [{ op: "add", path: ["a"], values: { b: { c: 1 } } }, { path: ["b"], values: null }],
      },
    };
    const r = v.safeParse(OperatingSystemConfigSchema, osc(c));
    expect(r.issues).toBeUndefined();
    expect(r.success && r.output.spec.criConfig?.containerd?.registries?.[0]?.hosts?.[0]).toMatchObject({ url: "https://m", overridePath: true });
  });

  test.each([
    [{ name: "containerd", cgroupDriver: "systemd.slice" }, "cgroupDriver"],
    [{ name: "containerd", containerd: { plugins: [{ op: "replace", path: ["a"] }] } }, "op"],
    [{ name: "containerd", containerd: { plugins: [{ path: ["a"], values: [1] }] } }, "values"],
    [{ name: "containerd", containerd: { registries: [{ upstream: "a", hosts: [{ url: "https://m", capabilities: ["fetch"] }] }] } }, "capabilities"],
    [{ containerd: {} }, "name"],
  ])("%j is refused at %s", (c, key) => {
    const r = v.safeParse(CriConfigSchema, c);
    expect(r.success).toBe(false);
    expect(r.issues?.map((i) => i.path?.map((p) => p.key).join(".")).join(" ")).toContain(key);
  });
});

// ---------------------------------------------------------------------------------------------
// Properties over random criConfigs and random current files.

type Rng = ReturnType<typeof prng>;

// Small pools so that random operations often meet: the same paths, keys that exist in the fixtures.
const KEYS = ["io.containerd.grpc.v1.cri", "io.containerd.cri.v1.runtime", "containerd", "runtimes", "runc", "runsc", "options", "cni", "x.y", "k"];
function randomValue(r: Rng, depth: number): unknown {
  const kind = r.int(depth > 1 ? 5 : 7);
  if (kind === 0) return r.pick(["a", "", "with 'quotes' and \"dq\"", "ü"]);
  if (kind === 1) return r.pick([0, 1, -7, 16384, 2.5, 0.02]);
  if (kind === 2) return r.chance(0.5);
  if (kind === 3) return [r.pick(["a", "b"]), r.pick(["c", "d"])];
  if (kind === 4) return null;
  const out: Record<string, unknown> = {};
  for (let i = r.int(3); i >= 0; i--) out[r.pick(KEYS)] = randomValue(r, depth + 1);
  return out;
}
function randomCri(r: Rng): CriConfig {
  const plugins = Array.from({ length: r.int(4) }, () => {
    const path = Array.from({ length: 1 + r.int(4) }, () => r.pick(KEYS));
    if (r.chance(0.3)) return { op: "remove" as const, path };
    const values = randomValue(r, 2);
    return { path, ...(values && typeof values === "object" && !Array.isArray(values) ? { values: values as Record<string, unknown> } : {}) };
  });
  const registries = r.chance(0.5) ? [{ upstream: r.pick(["docker.io", "_default", "127.0.0.1:5000"]), hosts: [{ url: "https://m.example.com" }] }] : [];
  return {
    name: "containerd",
    ...(r.chance(0.7) ? { cgroupDriver: r.pick(["systemd", "cgroupfs"] as const) } : {}),
    containerd: { ...(r.chance(0.7) ? { sandboxImage: r.pick(["p:1", "p:2"]) } : {}), plugins, registries },
  };
}
// Settings nobody asked for, in places the OSC may or may not touch.
function withForeign(r: Rng, text: string): string {
  const doc = toml(text);
  const tables = [doc, at(doc, "plugins") as Doc, at(doc, "debug") as Doc].filter(Boolean);
  for (let i = r.int(4); i >= 0; i--) (r.pick(tables) as Doc)[`foreign_${r.int(5)}`] = r.pick(["v", 42n, 1.5, true]);
  return stringify(doc, { numbersAsFloat: true });
}

describe("properties (300 random criConfigs per base)", () => {
  test.each([
    ["version 2", V2, "1.6.20"],
    ["version 3", V3, "2.1.9"],
    ["version 4", V4, "2.3.4"],
  ])("%s: the result is stable, a semantic no-op returns the file as it is, and foreign settings survive", (_, base, containerdVersion) => {
    const r = prng(base.length);
    let ok = 0;
    for (let i = 0; i < 300; i++) {
      const c = randomCri(r);
      const current = r.chance(0.5) ? withForeign(r, base) : undefined;
      const res = containerdDesired({ criConfig: c, defaultConfig: base, containerdVersion, ...(current !== undefined ? { current } : {}) }, WHERE);
      if (!res.ok) {
        // Only the plugin ops can go wrong here (a path through a value); the errors say which.
        for (const e of res.errors) expect(e).toMatch(/^spec\.criConfig\.containerd\.plugins\[\d\]\.(path|values)/);
        continue;
      }
      ok++;
      const patched = res.value.configToml;

      // Idempotent: patching the result again gives the very same bytes and no change.
      const again = containerdDesired({ criConfig: c, current: patched, defaultConfig: base, containerdVersion }, WHERE);
      expect(again.ok && again.value.configToml).toBe(patched);
      expect(again.ok && again.value.configChanged).toBe(false);

      // Semantic no-op: the same document written differently is returned untouched.
      const reformatted = `# reformatted\n${stringify(toml(patched), { numbersAsFloat: true })}`;
      const same = containerdDesired({ criConfig: c, current: reformatted, defaultConfig: base, containerdVersion }, WHERE);
      expect(same.ok && same.value.configToml).toBe(reformatted);

      // configChanged is exactly "differs from current".
      expect(res.value.configChanged).toBe(current === undefined || !deepEq(toml(current), toml(patched)));

      // Foreign top-level and [debug] settings survive (plugin ops only write below plugins).
      if (current !== undefined) {
        const before = toml(current);
        const after = toml(patched);
        for (const key of Object.keys(before).filter((k) => k.startsWith("foreign_"))) expect(after[key]).toEqual(before[key]);
        for (const key of Object.keys((before.debug as Doc | undefined) ?? {})) expect(at(after, "debug", key)).toEqual(at(before, "debug", key));
      }
    }
    expect(ok).toBeGreaterThan(150); // most random configs are valid: the properties were really exercised
  });
});

function deepEq(a: unknown, b: unknown): boolean {
  try {
    expect(a).toEqual(b);
    return true;
  } catch {
    return false;
  }
}
