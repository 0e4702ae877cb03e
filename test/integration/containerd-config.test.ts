// containerd's config from spec.criConfig against a real containerd (Debian's 1.6) in a real systemd
// node: what src/plan/containerd.ts produces is written into the node, containerd is restarted, and the
// running daemon proves it took every setting — through its CRI API (Status with verbose=true reports
// the config it runs with) and by pulling an image through the mirror that hosts.toml names, once with
// CRI (the daemon's own config_path) and once with `ctr --hosts-dir`. That a plugin's values replace
// what was at their keys (a nested key an extension dropped goes), what containerd 1.6 makes of a file
// without version patched as gardener-node-agent patches it, and the version its API reports (what the
// CNI directory follows). Also the readiness probe against a real registry, a 401, a closed port and a
// server that never answers.
//
// Why CRI over the socket: `ctr` has no command that shows the CRI plugin's effective config, and
// crictl is not installed. gRPC is HTTP/2 with length-prefixed protobuf; the few fields needed are
// encoded by hand below, as src/host/containerd.ts does for Version.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { mkdtempSync, rmSync } from "node:fs";
import http from "node:http";
import http2 from "node:http2";
import { connect, createServer, type Server, type Socket } from "node:net";
import { parse } from "smol-toml";
import type { CriConfig } from "../../src/api/cri-config.ts";
import { parseOscBytes } from "../../src/api/desired.ts";
import { desiredForNode } from "../../src/apply/desired-for-node.ts";
import { containerdVersion } from "../../src/host/containerd.ts";
import { builtinDefaultConfig, containerdDefaultConfig, probeRegistry, probeRegistryHosts } from "../../src/host/containerd-defaults.ts";
import { createFiles } from "../../src/host/files.ts";
import type { ImageStore } from "../../src/host/registry/store.ts";
import { createLogger } from "../../src/log.ts";
import { type ContainerdDesired, containerdDesired } from "../../src/plan/containerd.ts";
import { freePort, runDir, runOk } from "../harness/exec.ts";
import { bootNode, type Node } from "../harness/node.ts";
import { buildImageLayout } from "../harness/oci.ts";
import { type Registry, startRegistry } from "../harness/registry.ts";

const MIRRORED = "registry.example.invalid"; // .invalid never resolves: a pull can only succeed through the mirror
const IMAGE = "trellis/hello";

let node: Node;
let registry: Registry;
let layoutDir: string;
// hosts.toml's `server` (the fallback after the mirror) is a closed loopback port: if the mirror ever
// failed, containerd would fail there instead of resolving a name outside this machine.
let closedPort: number;

beforeAll(async () => {
  layoutDir = mkdtempSync(`${runDir("containerd-config")}/layout-`);
  [node, registry, closedPort] = await Promise.all([bootNode("ctrdcfg", { net: "host", containerd: true }), startRegistry(), freePort()]);
  await buildImageLayout(layoutDir, "1", { "hello.txt": "hello through the mirror\n" });
  await registry.push(layoutDir, IMAGE, "1");
}, 120_000);
afterAll(async () => {
  await node?.stop();
  await registry?.stop();
  if (layoutDir) rmSync(layoutDir, { recursive: true, force: true });
}, 60_000);

const criConfig = (sandboxImage: string): CriConfig => ({
  name: "containerd",
  cgroupDriver: "systemd",
  containerd: {
    sandboxImage,
    registries: [{ upstream: MIRRORED, server: `http://127.0.0.1:${closedPort}`, hosts: [{ url: `http://${registry.host}` }] }],
    // An extension's runtime, written as for version 2 configs.
    plugins: [{ path: ["io.containerd.grpc.v1.cri", "containerd", "runtimes", "trellis-test"], values: { runtime_type: "io.containerd.runc.v2", options: { SystemdCgroup: true, BinaryName: "/usr/sbin/runc" } } }],
  },
});

function plan(input: { criConfig: CriConfig; current?: string; defaultConfig: string }): ContainerdDesired {
  const r = containerdDesired(input, "spec.criConfig");
  if (!r.ok) throw new Error(r.errors.join("\n"));
  return r.value;
}

/** Writes everything as the agent would, reloads systemd and restarts containerd; returns its new MainPID. */
async function applyAndRestart(d: ContainerdDesired): Promise<number> {
  for (const dir of d.directories) await node.execOk(["mkdir", "-p", "-m", "0755", dir]);
  await node.writeFile("/etc/containerd/config.toml", d.configToml, 0o644);
  for (const f of d.hostsFiles) await node.writeFile(f.path, f.content, 0o644);
  await node.writeFile(`/etc/systemd/system/${d.envDropIn.unit}.d/${d.envDropIn.name}`, d.envDropIn.content, 0o600);
  await node.execOk(["systemctl", "daemon-reload"]);
  await node.execOk(["systemctl", "restart", "containerd.service"]);
  expect((await node.exec(["systemctl", "is-active", "containerd.service"])).stdout.trim()).toBe("active");
  return Number((await node.execOk(["systemctl", "show", "-P", "MainPID", "containerd.service"])).trim());
}

type CriStatusConfig = {
  sandboxImage: string;
  registry: { configPath: string };
  cni: { binDir: string };
  containerd: { runtimes: Record<string, { runtimeType: string; options?: Record<string, unknown> }> };
};

/** What the running daemon says it runs with (CRI Status, verbose). */
async function criConfigOfDaemon(): Promise<CriStatusConfig> {
  const reply = await grpc("/runtime.v1.RuntimeService/Status", Uint8Array.of(0x08, 0x01)); // verbose: true
  const info = new Map<string, string>();
  for (const f of fields(reply)) {
    if (f.field !== 2 || typeof f.value === "number") continue; // map<string,string> info = 2
    const entry = [...fields(f.value)];
    const text = (n: number) => new TextDecoder().decode(entry.find((e) => e.field === n)?.value as Uint8Array);
    info.set(text(1), text(2));
  }
  const config = info.get("config");
  if (!config) throw new Error(`CRI Status has no config; keys: ${[...info.keys()].join(", ")}`);
  return JSON.parse(config) as CriStatusConfig;
}

/** Pulls with the CRI plugin, i.e. with the daemon's own registry config (config_path → hosts.toml). */
async function criPull(image: string): Promise<string> {
  const spec = lenField(1, text(image)); // ImageSpec { string image = 1 }
  const reply = await grpc("/runtime.v1.ImageService/PullImage", lenField(1, spec), 60_000);
  const ref = [...fields(reply)].find((f) => f.field === 1)?.value;
  return new TextDecoder().decode(ref as Uint8Array);
}

async function ctr(...args: string[]): Promise<string> {
  return node.execOk(["ctr", ...args], { timeoutMs: 60_000 });
}

async function containerdAccepted(): Promise<void> {
  // `ctr version` answers only when the daemon runs with this config…
  expect(await ctr("version")).toMatch(/Server:\s+Version:\s+\S+/);
  // …and the CRI plugin, which is where every patched setting lives, loaded instead of failing on it.
  const cri = (await ctr("plugins", "ls")).split("\n").find((l) => /^io\.containerd\.grpc\.v1\s+cri\s/.test(l));
  expect(cri).toMatch(/\sok\s*$/);
}

describe("containerd 1.6 in a node runs with the patched config", () => {
  test("Debian's config.toml patched in place: the daemon reports every setting, pulls through the mirror, and keeps the foreign ones", async () => {
    const current = await node.readFile("/etc/containerd/config.toml"); // Debian's: version 2, cni bin_dir /usr/lib/cni, an opt plugin path
    const d = plan({ criConfig: criConfig("registry.k8s.io/pause:3.10"), current, defaultConfig: builtinDefaultConfig });
    expect(d.configChanged).toBe(true);
    expect((parse(d.configToml) as any).plugins["io.containerd.internal.v1.opt"].path).toBe("/var/lib/containerd/opt");

    const pid = await applyAndRestart(d);
    await containerdAccepted();

    const cfg = await criConfigOfDaemon();
    expect(cfg.registry.configPath).toBe("/etc/containerd/certs.d");
    expect(cfg.sandboxImage).toBe("registry.k8s.io/pause:3.10");
    expect(cfg.cni.binDir).toBe("/opt/cni/bin");
    expect(cfg.containerd.runtimes.runc?.options?.SystemdCgroup).toBe(true);
    expect(cfg.containerd.runtimes["trellis-test"]).toMatchObject({ runtimeType: "io.containerd.runc.v2", options: { SystemdCgroup: true, BinaryName: "/usr/sbin/runc" } });

    // The drop-in reached the daemon's environment.
    const environ = (await node.execOk(["cat", `/proc/${pid}/environ`])).split("\0");
    expect(environ).toContain("PATH=/var/bin/containerruntimes:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin");

    // The daemon's own pull (CRI) resolves registry.example.invalid through hosts.toml to the mirror.
    const imageId = await criPull(`${MIRRORED}/${IMAGE}:1`);
    expect(imageId).toMatch(/^sha256:[0-9a-f]{64}$/);
    expect(await ctr("-n", "k8s.io", "images", "ls", "-q")).toContain(`${MIRRORED}/${IMAGE}:1`);

    // And a client that reads the same hosts dir.
    await ctr("images", "pull", "--hosts-dir", "/etc/containerd/certs.d", `${MIRRORED}/${IMAGE}:1`);
    expect(await ctr("images", "ls", "-q")).toContain(`${MIRRORED}/${IMAGE}:1`);
  }, 120_000);

  test("the file on the node is stable: planning again against it changes nothing, so containerd would not restart", async () => {
    const onDisk = await node.readFile("/etc/containerd/config.toml");
    const d = plan({ criConfig: criConfig("registry.k8s.io/pause:3.10"), current: onDisk, defaultConfig: builtinDefaultConfig });
    expect(d.configChanged).toBe(false);
    expect(d.configToml).toBe(onDisk);
    expect(d.hostsFiles[0]?.content).toBe(await node.readFile(`/etc/containerd/certs.d/${MIRRORED}/hosts.toml`));
  });

  test("an extension that drops a nested key from its plugin values: the daemon's runtime no longer has it (gardener-node-agent replaces top-level keys)", async () => {
    const current = await node.readFile("/etc/containerd/config.toml");
    const c = criConfig("registry.k8s.io/pause:3.10");
    const plugins = [{ path: ["io.containerd.grpc.v1.cri", "containerd", "runtimes", "trellis-test"], values: { runtime_type: "io.containerd.runc.v2", options: { SystemdCgroup: true } } }];
    const d = plan({ criConfig: { ...c, containerd: { ...c.containerd, plugins } }, current, defaultConfig: builtinDefaultConfig });
    expect(d.configChanged).toBe(true);
    await applyAndRestart(d);
    await containerdAccepted();
    expect((await criConfigOfDaemon()).containerd.runtimes["trellis-test"]?.options).toEqual({ SystemdCgroup: true });
  }, 60_000);

  test("a config.toml without version (Docker's containerd.io ships one): patched as gardener-node-agent patches it, and containerd 1.6 does not read those settings, as trellis reports", async () => {
    const docker = 'disabled_plugins = []\n\n[plugins.cri]\n  sandbox_image = "registry.k8s.io/pause:from-plugins-cri"\n';
    const d = plan({ criConfig: criConfig("registry.k8s.io/pause:3.10"), current: docker, defaultConfig: builtinDefaultConfig });
    expect(d.configVersion).toBe(1);
    expect(d.notes).toEqual([expect.stringContaining("containerd 1.x does not")]);
    await applyAndRestart(d);
    await containerdAccepted();
    const cfg = await criConfigOfDaemon();
    expect(cfg.sandboxImage).toBe("registry.k8s.io/pause:from-plugins-cri");
    expect(cfg.registry.configPath).toBe("");
  }, 60_000);

  test("containerd's version comes from its API on the node's socket; 1.6 on a version 3 config means bin_dir", async () => {
    // desiredForNode reads this config.toml and, for version 3, asks the running daemon; nothing is applied.
    const saved = await node.readFile("/etc/containerd/config.toml");
    await node.writeFile("/etc/containerd/config.toml", "version = 3\n[plugins.'io.containerd.cri.v1.runtime'.cni]\nbin_dirs = ['/usr/lib/cni']\n", 0o644);
    try {
      expect((await containerdVersion(`${node.root}/run/containerd/containerd.sock`, 5_000)).version).toBe("1.6.20~ds1");
      const osc = parseOscBytes(new TextEncoder().encode(`apiVersion: extensions.gardener.cloud/v1alpha1\nkind: OperatingSystemConfig\nspec:\n  type: debian\n  criConfig:\n    name: containerd\n    containerd:\n      sandboxImage: p\n`), "osc");
      if (!osc.ok) throw new Error(osc.errors.join("\n"));
      const images: ImageStore = { extract: () => Promise.reject(new Error("no images")), prune: async () => {} };
      const r = await desiredForNode(osc.value, "osc", { files: createFiles(node.root), hostName: "n", images, log: createLogger({ write: () => {} }) });
      if (!r.ok) throw new Error(r.errors.join("\n"));
      const toml = new TextDecoder().decode(r.value.files.find((f) => f.path === "/etc/containerd/config.toml")?.content as Uint8Array);
      expect((parse(toml) as any).plugins["io.containerd.cri.v1.runtime"].cni).toEqual({ bin_dir: "/opt/cni/bin", bin_dirs: ["/usr/lib/cni"] });
    } finally {
      await node.writeFile("/etc/containerd/config.toml", saved, 0o644);
    }
  }, 60_000);

  test("without a config.toml: `containerd config default` (read by src/host) patched is accepted too", async () => {
    const def = await containerdDefaultConfig({ timeoutMs: 10_000 }); // the host's containerd is the node's (same lower layer)
    expect(def).toMatchObject({ source: "containerd", major: 1 });
    const d = plan({ criConfig: criConfig("registry.k8s.io/pause:3.6-trellis"), defaultConfig: def.config });
    expect(d.configVersion).toBe(2);
    await applyAndRestart(d);
    await containerdAccepted();
    const cfg = await criConfigOfDaemon();
    expect(cfg.sandboxImage).toBe("registry.k8s.io/pause:3.6-trellis");
    expect(cfg.registry.configPath).toBe("/etc/containerd/certs.d");
    expect(cfg.containerd.runtimes.runc?.options?.SystemdCgroup).toBe(true);
  }, 60_000);

  test("the built-in default (no containerd binary to ask) patched is accepted too", async () => {
    const d = plan({ criConfig: { ...criConfig("registry.k8s.io/pause:builtin"), cgroupDriver: "cgroupfs" }, defaultConfig: builtinDefaultConfig });
    await applyAndRestart(d);
    await containerdAccepted();
    const cfg = await criConfigOfDaemon();
    expect(cfg.sandboxImage).toBe("registry.k8s.io/pause:builtin");
    expect(cfg.containerd.runtimes.runc?.options?.SystemdCgroup).toBe(false);
  }, 60_000);
});

describe("containerdDefaultConfig", () => {
  test("no containerd: the built-in default, and a log line that says so", async () => {
    const lines: string[] = [];
    const def = await containerdDefaultConfig({ binary: "/nonexistent/containerd", log: createLogger({ write: (l) => lines.push(l) }) });
    expect(def).toEqual({ config: builtinDefaultConfig, source: "built-in" });
    expect(lines.join("\n")).toContain("containerd is not installed: using trellis' built-in default config (version 2)");
  });

  test("a containerd that hangs is cut off at the timeout", async () => {
    const dir = mkdtempSync(`${runDir("containerd-config")}/hang-`);
    try {
      await Bun.write(`${dir}/containerd`, "#!/bin/sh\nexec sleep 30\n");
      await runOk(["chmod", "+x", `${dir}/containerd`]);
      const started = Date.now();
      await expect(containerdDefaultConfig({ binary: `${dir}/containerd`, timeoutMs: 300 })).rejects.toThrow(/--version: no answer within 300 ms/);
      expect(Date.now() - started).toBeLessThan(5_000);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});

describe("probeRegistry", () => {
  test("a real registry is ready (200 on /v2/), also through probeRegistryHosts", async () => {
    expect(await probeRegistry(`http://${registry.host}`, 2_000)).toEqual({ ready: true, status: 200 });
    expect(await probeRegistry(`http://${registry.host}/`, 2_000)).toEqual({ ready: true, status: 200 });
    expect(await probeRegistryHosts({ upstream: MIRRORED, hosts: [{ url: `http://${registry.host}` }] }, 2_000)).toEqual({ ready: true, status: 200 });
  });

  test("401 counts as ready: the mirror runs, it just wants a token", async () => {
    const seen: string[] = [];
    const srv = http.createServer((req, res) => {
      seen.push(req.url ?? "");
      res.writeHead(401, { "www-authenticate": 'Bearer realm="x"' }).end();
    });
    const port = await listen(srv);
    try {
      expect(await probeRegistry(`http://127.0.0.1:${port}`, 2_000)).toEqual({ ready: true, status: 401 });
      expect(seen).toEqual(["/v2/"]);
    } finally {
      srv.close();
    }
  });

  test("a closed port is not ready", async () => {
    const port = await freePort();
    const r = await probeRegistry(`http://127.0.0.1:${port}`, 2_000);
    expect(r.ready).toBe(false);
    expect(!r.ready && r.error).toContain("ECONNREFUSED");
    // One host down makes the whole registry not ready.
    expect((await probeRegistryHosts({ upstream: "x", hosts: [{ url: `http://${registry.host}` }, { url: `http://127.0.0.1:${port}` }] }, 2_000)).ready).toBe(false);
  });

  test("a server that accepts but never answers is not ready, within the timeout", async () => {
    const sockets: Socket[] = [];
    const srv = createServer((s) => sockets.push(s)); // holds the connection, says nothing
    const port = await listen(srv);
    try {
      const started = Date.now();
      const r = await probeRegistry(`http://127.0.0.1:${port}`, 300);
      expect(r).toEqual({ ready: false, error: `http://127.0.0.1:${port}/v2/: no answer within 300 ms` });
      expect(Date.now() - started).toBeLessThan(2_000);
    } finally {
      for (const s of sockets) s.destroy();
      srv.close();
    }
  });

  test("not a URL, or not http(s): not ready, and says why", async () => {
    expect(await probeRegistry("mirror:5000", 500)).toEqual({ ready: false, error: "mirror:5000: scheme must be http or https" });
    expect(await probeRegistry("::", 500)).toEqual({ ready: false, error: ":: is not a URL" });
  });
});

function listen(srv: Server | http.Server): Promise<number> {
  return new Promise((resolve) => srv.listen(0, "127.0.0.1", () => resolve((srv.address() as { port: number }).port)));
}

// --- gRPC to the node's containerd, from the host (its socket through /proc/<pid>/root) -------------

function grpc(method: string, message: Uint8Array, timeoutMs = 10_000): Promise<Uint8Array> {
  const socket = `${node.root}/run/containerd/containerd.sock`;
  return new Promise((resolve, reject) => {
    const session = http2.connect("http://containerd", { createConnection: () => connect(socket) });
    const timer = setTimeout(() => done(new Error(`${method}: no answer within ${timeoutMs} ms`)), timeoutMs);
    const done = (err?: Error, value?: Uint8Array) => {
      clearTimeout(timer);
      session.destroy();
      if (err) reject(err);
      else resolve(value as Uint8Array);
    };
    session.on("error", (err) => done(err));
    const req = session.request({ ":method": "POST", ":path": method, "content-type": "application/grpc", te: "trailers" });
    const headers: Record<string, unknown> = {};
    const chunks: Buffer[] = [];
    req.on("response", (h) => Object.assign(headers, h));
    req.on("trailers", (t) => Object.assign(headers, t));
    req.on("data", (c: Buffer) => chunks.push(c));
    req.on("error", (err) => done(err));
    req.on("end", () => {
      const status = String(headers["grpc-status"] ?? "");
      if (status !== "0") return done(new Error(`${method}: gRPC status ${status}: ${String(headers["grpc-message"] ?? "")}`));
      const body = Buffer.concat(chunks);
      done(undefined, body.subarray(5, 5 + body.readUInt32BE(1)));
    });
    const frame = Buffer.alloc(5 + message.length);
    frame.writeUInt32BE(message.length, 1);
    frame.set(message, 5);
    req.end(frame);
  });
}

const text = (s: string) => new TextEncoder().encode(s);
function varint(n: number): number[] {
  const out: number[] = [];
  for (; n > 127; n = Math.floor(n / 128)) out.push((n % 128) | 128);
  out.push(n);
  return out;
}
function lenField(field: number, data: Uint8Array): Uint8Array {
  return Uint8Array.from([...varint((field << 3) | 2), ...varint(data.length), ...data]);
}
function* fields(msg: Uint8Array): Generator<{ field: number; value: Uint8Array | number }> {
  let i = 0;
  const readVarint = () => {
    let v = 0;
    for (let shift = 0; ; shift += 7) {
      const b = msg[i++] as number;
      v += (b & 0x7f) * 2 ** shift;
      if (b < 0x80) return v;
    }
  };
  while (i < msg.length) {
    const key = readVarint();
    const wire = key & 7;
    if (wire === 0) yield { field: key >>> 3, value: readVarint() };
    else if (wire === 2) {
      const len = readVarint();
      yield { field: key >>> 3, value: msg.subarray(i, i + len) };
      i += len;
    } else if (wire === 5) i += 4;
    else if (wire === 1) i += 8;
    else throw new Error(`protobuf wire type ${wire} not handled`);
  }
}
