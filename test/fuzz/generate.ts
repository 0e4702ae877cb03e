// The structure-aware generator: OSCs as Gardener writes them (files with every content kind, encoding
// and mode, units with drop-ins and filePaths, status.extension*, containerd's criConfig), overlays,
// and a node that an earlier apply (or another tool) left in some state; then mutations (mutate.ts) on
// the structure, the YAML and the bytes. Names and paths come from small pools so that entries collide
// with each other and with what is on the node, where the interesting cases are.
import { prng } from "../harness/prng.ts";
import { sha256Hex } from "../../src/api/desired.ts";
import { agentUnit, writablePathProblem } from "../../src/api/paths.ts";
import { builtinDefaultConfig } from "../../src/host/containerd-defaults.ts";
import { type Blob, caseSeed, type FuzzCase, type NodeEntry, toBlob } from "./case.ts";
import { mutateBytes, mutateTree, type Rng, toYaml } from "./mutate.ts";

const hostName = "fuzz-node";
/** Units a real node has under /lib/systemd/system (an OSC may name them without content). */
export const hostUnits = new Set(["kubelet.service", "containerd.service", agentUnit, "sshd.socket", "blocked.service"]);

const filePaths = [
  "/etc/fuzz/a.conf",
  "/etc/fuzz/b.conf",
  "/etc/fuzz/sub/c",
  "/etc/fuzz/sub",
  "/etc/fuzz/a.conf/inner",
  "/var/lib/fuzz/d",
  "/opt/bin/tool",
  "/etc/sysctl.d/99-fuzz.conf",
  "/etc/fuzz/dir",
  "/etc/fuzz/dir/x",
  "/etc/fuzz/dir/existing",
  "/etc/fuzz/file",
  "/etc/fuzz/file/child",
  "/etc/fuzz/fifo",
  "/etc/fuzz/link/x",
  "/etc/fuzz/escape/x",
  "/etc/containerd/config.toml",
  "/etc/containerd/certs.d/reg.example:5000/hosts.toml",
  "/etc/containerd/certs.d/reg.example:5000",
  "/etc/systemd/system/fuzz-a.service",
  "/etc/systemd/system/fuzz-a.service.d/10-a.conf",
  "/etc/systemd/system/fuzz-a.service.d",
  "/var/lib/gardener-node-agent/trellis/state.json",
  "/var/lib/gardener-node-agent/last-applied-osc.yaml",
];
const unitNames = ["kubelet.service", "containerd.service", agentUnit, "fuzz-a.service", "fuzz-b.service", "fuzz-c.timer", "fuzz@one.service", "fuzz@.service", "sshd.socket", "blocked.service"];
const dropInNames = ["10-a.conf", "20-b.conf", "30-env_config.conf", "99-z.conf"];
const contents = ["", "x", "hello\n", "größe ✓ 🚀\n", "a: b\n", "line\r\nline\r\n", "# comment\n", "yes", "0644", "null"];
const unitTexts = [
  "[Unit]\nDescription=fuzz\n[Service]\nExecStart=/bin/true\n[Install]\nWantedBy=multi-user.target\n",
  "[Service]\nEnvironment=A=1\n",
  "[Unit]\nDescription=no install section\n",
  "",
];
const modes = [0o600, 0o644, 0o755, 0o400, 0o7777, 0o1777];
const images = ["reg.example/tools:v1", "reg.example/missing:v1", "reg.example/tools@sha256:" + "ab".repeat(32)];
const upstreams = ["reg.example:5000", "docker.io", "_default", "ghcr.io"];
const containerdConfigs = [
  builtinDefaultConfig,
  'version = 3\n[plugins."io.containerd.cri.v1.images".registry]\n  config_path = ""\n',
  "# empty\n",
  "[[[not toml",
  'version = 2\n[plugins."io.containerd.grpc.v1.cri".registry.mirrors."docker.io"]\n  endpoint = ["https://m"]\n',
];

// Where names come from. Messy pools collide on purpose (duplicates, obstacles on the node, missing
// Secrets and images); clean ones draw without replacement from what a node can take, so that a good
// share of the cases gets through validation to the plan and the apply.
type Pools = { path(): string; unit(): string; dropIn(): string; secretRef(): { name: string; dataKey: string }; image(): string };

const messy = (r: Rng): Pools => ({
  path: () => r.pick(filePaths),
  unit: () => r.pick(unitNames),
  dropIn: () => r.pick(dropInNames),
  secretRef: () => ({ name: r.pick(["s1", "s1", "s2"]), dataKey: r.pick(["k", "k", "empty", "huge", "nokey"]) }),
  image: () => r.pick(images),
});

const cleanPaths = ["/etc/fuzz/a.conf", "/etc/fuzz/b.conf", "/etc/fuzz/sub/c", "/var/lib/fuzz/d", "/opt/bin/tool", "/etc/sysctl.d/99-fuzz.conf", "/etc/fuzz/dir/x", "/etc/fuzz/link/y"];
const cleanUnits = ["kubelet.service", "containerd.service", agentUnit, "fuzz-a.service", "fuzz-b.service", "fuzz-c.timer", "sshd.socket"];

function clean(r: Rng): Pools {
  const draw = (xs: readonly string[]) => {
    const left = [...xs];
    return (fallback: () => string) => () => (left.length > 0 ? (left.splice(r.int(left.length), 1)[0] as string) : fallback());
  };
  let n = 0;
  return {
    path: draw(cleanPaths)(() => `/etc/fuzz/more/${n++}`),
    unit: draw(cleanUnits)(() => `fuzz-more-${n++}.service`),
    dropIn: () => `${10 + n++}-fuzz.conf`,
    secretRef: () => ({ name: "s1", dataKey: r.pick(["k", "empty"]) }),
    image: () => images[0] as string,
  };
}

export function generateCase(seed: number, index: number): FuzzCase {
  const r = prng(caseSeed(seed, index));
  const unmutated = r.chance(0.3);
  const pools = unmutated && r.chance(0.7) ? clean(r) : messy(r);
  const tree = unmutated ? genOsc(r, pools) : mutateTree(r, genOsc(r, pools), 1 + r.int(4));
  const overlays: Record<string, Blob> = {};
  if (r.chance(0.2)) {
    for (let i = r.int(3); i >= 0; i--) {
      const doc = genOverlay(r, pools);
      const key = r.pick(["overlay-gpu.yaml", "overlay-a.yaml", "overlay-a.yaml", "overlay-Bad.yaml", "overlayfoo", "overlay-b.yaml"]);
      overlays[key] = blobOf(r, r.chance(0.5) ? mutateTree(r, doc, 1 + r.int(2)) : doc);
    }
  }
  return {
    seed,
    index,
    osc: blobOf(r, tree),
    overlays,
    labels: r.chance(0.7) ? { pool: r.pick(["gpu", "cpu"]) } : {},
    hostName,
    secrets: {
      s1: { k: b64("secret content\n"), empty: "", ...(r.chance(0.001) ? { huge: b64("x".repeat(4 * 1024 * 1024 + 1)) } : {}) },
      s2: null,
    },
    node: genNode(r),
  };
}

// Serialised as YAML (aliases sometimes), then perhaps damaged byte by byte.
function blobOf(r: Rng, tree: unknown): Blob {
  const yaml = toYaml(r, tree);
  const bytes = new TextEncoder().encode(yaml);
  return toBlob(r.chance(0.25) ? mutateBytes(r, bytes, 1 + r.int(3)) : bytes);
}

const b64 = (s: string) => Buffer.from(s).toString("base64");
const maybe = <T>(r: Rng, p: number, f: () => T): T | undefined => (r.chance(p) ? f() : undefined);
const many = <T>(r: Rng, max: number, f: () => T): T[] => Array.from({ length: r.int(max + 1) }, f);
/** Drops undefined fields, as YAML would not have them. */
const obj = (o: Record<string, unknown>) => Object.fromEntries(Object.entries(o).filter(([, v]) => v !== undefined));

function genOsc(r: Rng, pools: Pools): Record<string, unknown> {
  const units = many(r, 4, () => genUnit(r, pools));
  const files = many(r, 5, () => genFile(r, pools));
  return obj({
    apiVersion: "extensions.gardener.cloud/v1alpha1",
    kind: "OperatingSystemConfig",
    metadata: { name: "fuzz", namespace: "kube-system" },
    spec: obj({
      type: "debian",
      purpose: r.pick(["reconcile", "provision"]),
      units,
      files,
      criConfig: maybe(r, 0.3, () => genCri(r)),
    }),
    status: maybe(r, 0.3, () => obj({ extensionUnits: many(r, 2, () => genUnit(r, pools)), extensionFiles: many(r, 2, () => genFile(r, pools)) })),
  });
}

function genUnit(r: Rng, pools: Pools): Record<string, unknown> {
  const name = pools.unit();
  return obj({
    name,
    command: maybe(r, 0.4, () => r.pick(["start", "restart", "stop"])),
    enable: maybe(r, 0.5, () => r.chance(0.8)),
    content: hostUnits.has(name) && r.chance(0.5) ? undefined : r.pick(unitTexts),
    dropIns: maybe(r, 0.4, () => many(r, 2, () => ({ name: pools.dropIn(), content: r.pick(unitTexts) }))),
    filePaths: maybe(r, 0.4, () => many(r, 2, () => r.pick(filePaths))),
  });
}

function genFile(r: Rng, pools: Pools): Record<string, unknown> {
  const kind = r.int(10);
  const content =
    kind < 7
      ? { inline: genInline(r) }
      : kind < 9
        ? { secretRef: pools.secretRef() }
        : { imageRef: { image: pools.image(), filePathInImage: r.pick(["/bin/tool", "/etc/x"]) } };
  return obj({
    path: pools.path(),
    permissions: maybe(r, 0.7, () => r.pick(modes)),
    content: r.chance(0.1) ? { ...content, transmitUnencoded: r.chance(0.5) } : content,
    hostName: maybe(r, 0.15, () => r.pick([hostName, "other-node"])),
  });
}

function genInline(r: Rng): Record<string, unknown> {
  const text = r.pick(contents);
  const encoding = r.pick(["", "plain", "b64", "base64", undefined]);
  const data = encoding === "b64" || encoding === "base64" ? b64(text) : text;
  return obj({ encoding, data });
}

function genCri(r: Rng): Record<string, unknown> {
  return obj({
    name: r.pick(["containerd", "containerd", "containerd", "docker"]),
    cgroupDriver: maybe(r, 0.5, () => r.pick(["systemd", "cgroupfs"])),
    containerd: maybe(r, 0.85, () =>
      obj({
        registries: maybe(r, 0.7, () => many(r, 2, () => genRegistry(r))),
        sandboxImage: maybe(r, 0.3, () => "registry.k8s.io/pause:3.10"),
        plugins: maybe(r, 0.3, () =>
          many(r, 2, () =>
            obj({
              op: maybe(r, 0.5, () => r.pick(["add", "remove"])),
              path: r.pick([["io.containerd.grpc.v1.cri", "containerd", "runtimes", "runsc"], ["io.containerd.grpc.v1.cri"], []]),
              values: maybe(r, 0.7, () => ({ runtime_type: "io.containerd.runsc.v1", options: { TypeUrl: "x" }, gone: null })),
            }),
          ),
        ),
      }),
    ),
  });
}

// A registry with a readiness probe points at 127.0.0.1:1, which refuses at once: no test reaches the network.
function genRegistry(r: Rng): Record<string, unknown> {
  const probe = r.chance(0.3);
  return obj({
    upstream: r.pick(upstreams),
    server: maybe(r, 0.4, () => r.pick(["https://registry-1.docker.io", "http://reg.example:5000"])),
    hosts: many(r, 2, () =>
      obj({
        url: probe ? "http://127.0.0.1:1" : r.pick(["https://mirror.example", "http://127.0.0.1:1", "mirror.example"]),
        capabilities: maybe(r, 0.4, () => r.subset(["pull", "resolve", "push"])),
        // Read for a readiness probe: relative, absolute, through .., and the node's FIFO, directory and escaping symlink.
        caCerts: maybe(r, 0.2, () => [r.pick(["ca.crt", "/etc/fuzz/file", "/etc/fuzz/fifo", "/etc/fuzz/dir", "/etc/fuzz/escape/ca.crt", "../../../fuzz/file"])]),
        overridePath: maybe(r, 0.2, () => r.chance(0.5)),
      }),
    ),
    readinessProbe: probe ? true : maybe(r, 0.2, () => false),
  });
}

function genOverlay(r: Rng, pools: Pools): Record<string, unknown> {
  return obj({
    rank: r.pick(["fallback", "group", "node", "force"]),
    selector: r.pick(["pool=gpu", "pool in (gpu,cpu)", "!pool", "pool!=cpu", "pool"]),
    units: maybe(r, 0.6, () => many(r, 2, () => genUnit(r, pools))),
    files: maybe(r, 0.6, () => many(r, 2, () => genFile(r, pools))),
  });
}

// What the node holds before: fixed obstacles (a directory, a FIFO, a file where a directory would be
// needed, symlinks, containerd's config), files trellis or others wrote, and trellis's record of them.
function genNode(r: Rng): FuzzCase["node"] {
  const entries: NodeEntry[] = [
    { path: "/etc/fuzz/dir", kind: "dir" },
    { path: "/etc/fuzz/dir/existing", kind: "file", content: "x", mode: 0o644 },
    { path: "/etc/fuzz/file", kind: "file", content: "a file", mode: 0o644 },
    { path: "/etc/fuzz/fifo", kind: "fifo" },
    { path: "/etc/fuzz/link", kind: "symlink", target: "/etc/fuzz/dir" },
    { path: "/etc/fuzz/escape", kind: "symlink", target: "../../../../../../tmp" },
    { path: "/etc/systemd/system/blocked.service.d", kind: "file", content: "not a directory", mode: 0o644 },
  ];
  if (r.chance(0.8)) entries.push({ path: "/etc/containerd/config.toml", kind: "file", content: r.pick(containerdConfigs), mode: 0o644 });
  const written = new Map<string, string>();
  for (let i = r.int(7); i > 0; i--) {
    const path = r.chance(0.7) ? r.pick(filePaths) : `/etc/systemd/system/${r.pick(unitNames)}${r.chance(0.5) ? `.d/${r.pick(dropInNames)}` : ""}`;
    const content = r.pick([...contents, ...unitTexts]);
    written.set(path, content);
    entries.push({ path, kind: "file", content, mode: r.pick(modes) });
  }
  const sha = () => sha256Hex(r.pick([...contents, ...unitTexts]));
  // trellis never owns what an OSC may not write (paths.ts): an apply never records such a path.
  const ownable = (path: string) => writablePathProblem(path) === undefined;
  const files: Record<string, { sha256: string; mode: number }> = {};
  for (const [path, content] of written) if (r.chance(0.6) && ownable(path)) files[path] = { sha256: r.chance(0.7) ? sha256Hex(content) : sha(), mode: r.pick(modes) };
  for (let i = r.int(3); i > 0; i--) {
    const path = r.pick(filePaths);
    if (ownable(path)) files[path] = { sha256: sha(), mode: r.pick(modes) };
  }
  const units: Record<string, unknown> = {};
  for (let i = r.int(4); i > 0; i--) {
    units[r.pick(unitNames)] = obj({
      sha256: maybe(r, 0.6, sha),
      enable: maybe(r, 0.7, () => r.chance(0.7)),
      command: maybe(r, 0.3, () => r.pick(["start", "restart", "stop"])),
      dropIns: Object.fromEntries(many(r, 2, () => [r.pick(dropInNames), sha()])),
    });
  }
  const systemd: FuzzCase["node"]["units"] = {};
  for (const name of r.subset(unitNames, 0.3)) {
    systemd[name] = { unitFileState: r.pick(["enabled", "disabled", "static", "enabled-runtime", "linked", ""]), activeState: r.pick(["active", "inactive", "failed", "activating"]) };
  }
  return { entries, owned: { version: 1, files, units }, units: systemd };
}
