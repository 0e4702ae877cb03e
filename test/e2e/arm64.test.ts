// The arm64 binary, run: dist/trellis-arm64 under Debian's qemu-user-static (build/arch-exec.ts) does what
// dist/trellis does — `version`, `plan` of the OSC Gardener renders for a worker pool (its imageRef files
// pulled from a real registry, arm64's layer for the arm64 binary), `check-config` — and build/image.ts
// labels its image from what the arm64 binary says about itself, as it does for amd64's.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { closeSync, mkdirSync, mkdtempSync, openSync, readSync, rmSync, writeFileSync } from "node:fs";
import { createHash } from "node:crypto";
import { parse, stringify } from "yaml";
import { commandFor } from "../../build/arch-exec.ts";
import { arm64BinaryPath as arm, repoRoot, trellisBinary } from "../harness/binary.ts";
import { run, runDir, runOk } from "../harness/exec.ts";
import { writeLayout } from "../harness/oci.ts";
import { type Registry, startRegistry } from "../harness/registry.ts";
import { workerOsc } from "../harness/worker-osc.ts";

const base = runDir("arm64");
const upstream = "registry.example.invalid";
const content = (arch: string) => ({ kubelet: `kubelet for ${arch}\n`, agent: `agent for ${arch}\n` });
const sha256 = (s: string) => createHash("sha256").update(s).digest("hex");
let registry: Registry;
let oscPath: string;

const armBuild = (...flags: string[]) => runOk(["bun", "run", "build", "--", "--arch", "arm64", ...flags], { cwd: repoRoot, timeoutMs: 300_000 });
/** Both binaries with the same arguments: [amd64's result, arm64's]. */
const both = async (args: string[]) => Promise.all([run([await trellisBinary(), ...args], { timeoutMs: 60_000 }), run([...commandFor("arm64", arm), ...args], { timeoutMs: 120_000 })]);

beforeAll(async () => {
  registry = await startRegistry();
  // Each image an index of amd64 and arm64, with different content per architecture.
  const push = async (repo: string, tag: string, path: string, of: (arch: "amd64" | "arm64") => string) => {
    const dir = `${base}/${repo.replaceAll("/", "-")}`;
    writeLayout(dir, tag, (["amd64", "arm64"] as const).map((arch) => ({ platform: { os: "linux", architecture: arch }, layers: [{ [path]: { content: of(arch), mode: 0o755 } }], config: {} })));
    await registry.push(dir, repo, tag, { all: true });
  };
  await push("hyperkube", "v1.35.4", "kubelet", (a) => content(a).kubelet);
  await push("trellis/agent", "1", "gardener-node-agent", (a) => content(a).agent);
  const pem = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";
  const rendered = await workerOsc({
    server: "https://127.0.0.1:6443",
    caPem: pem,
    kubeletCaPem: pem,
    images: { hyperkube: `${upstream}/hyperkube:v1.35.4`, pause: `${upstream}/pause:3.10`, web: "", hyperkubeLayer: "" },
    agentImage: `${upstream}/trellis/agent:1`,
  });
  // As a mirror configured on the machine would: the upstream's images come from the test registry.
  const doc = parse(rendered.osc);
  doc.spec.criConfig.containerd.registries = [{ upstream, server: `https://${upstream}`, hosts: [{ url: `http://${registry.host}` }] }];
  oscPath = `${base}/osc.yaml`;
  writeFileSync(oscPath, stringify(doc));
}, 120_000);
afterAll(async () => {
  await registry?.stop();
  rmSync(base, { recursive: true, force: true }); // the image layouts hold two 100 MiB binaries
});

describe("dist/trellis-arm64 under qemu-user-static", () => {
  test("built for aarch64, it prints the same version, commit and runtime as dist/trellis", async () => {
    await armBuild();
    const fd = openSync(arm, "r");
    const header = Buffer.alloc(20);
    readSync(fd, header, 0, 20, 0);
    closeSync(fd);
    expect(header.subarray(0, 4).toString("latin1")).toBe("\x7fELF");
    expect(header.readUInt16LE(18)).toBe(0xb7); // e_machine EM_AARCH64
    const [x64, a64] = await both(["version", "--json"]);
    expect(a64.stderr).toBe("");
    expect(a64.code).toBe(0);
    expect(JSON.parse(a64.stdout)).toEqual(JSON.parse(x64.stdout));
  }, 300_000);

  test("`plan --root` of Gardener's worker OSC: the same plan, with arm64's layer of each imageRef", async () => {
    const root = mkdtempSync(`${base}/root-`);
    mkdirSync(`${root}/etc`);
    writeFileSync(`${root}/etc/hostname`, "worker\n");
    const [x64, a64] = await both(["plan", "--root", root, "--osc", oscPath, "--json"]);
    expect(a64.stderr).toBe(x64.stderr);
    expect(x64.code).toBe(3);
    expect(a64.code).toBe(3);
    type Steps = { steps: { kind: string; path?: string; sha256?: string }[] };
    const [px, pa] = [JSON.parse(x64.stdout) as Steps, JSON.parse(a64.stdout) as Steps];
    const shaOf = (p: Steps, path: string) => p.steps.find((s) => s.kind === "write" && s.path === path)?.sha256;
    expect(shaOf(px, "/opt/bin/kubelet")).toBe(sha256(content("amd64").kubelet));
    expect(shaOf(pa, "/opt/bin/kubelet")).toBe(sha256(content("arm64").kubelet));
    expect(shaOf(pa, "/opt/bin/gardener-node-agent")).toBe(sha256(content("arm64").agent));
    // Everything else is the same plan: the rest of the OSC does not depend on the architecture.
    const rest = (p: Steps) => p.steps.filter((s) => s.path !== "/opt/bin/kubelet" && s.path !== "/opt/bin/gardener-node-agent");
    expect(rest(pa)).toEqual(rest(px));
    expect(rest(px).length).toBeGreaterThan(10);
  }, 300_000);

  test("`check-config`: a good configuration is chosen, a bad one is refused naming the field, as by dist/trellis", async () => {
    const dir = mkdtempSync(`${base}/config-`);
    writeFileSync(`${dir}/config.yaml`, "apiVersion: nodeagent.config.gardener.cloud/v1alpha1\nkind: NodeAgentConfiguration\ncontrollers:\n  operatingSystemConfig: {secretName: osc, kubernetesVersion: 1.35.4}\n");
    const good = await both(["check-config", "--config-dir", dir]);
    expect(good.map((r) => r.code)).toEqual([0, 0]);
    expect(good[1].stdout).toBe(good[0].stdout);
    expect(good[1].stdout).toContain(`${dir}/config.yaml`);
    writeFileSync(`${dir}/config.yaml`, "apiVersion: nodeagent.config.gardener.cloud/v1alpha1\nkind: NodeAgentConfiguration\ncontrollers:\n  operatingSystemConfig: {secretName: osc, kubernetesVersion: 1.35.4, syncPeriod: 5s}\n");
    const bad = await both(["check-config", "--config-dir", dir]);
    expect(bad.map((r) => r.code)).toEqual([1, 1]);
    expect(bad[1].stderr).toBe(bad[0].stderr);
    expect(bad[1].stderr).toContain(`${dir}/config.yaml: controllers.operatingSystemConfig.syncPeriod: must be at least 15s`);
  }, 300_000);
});

describe("build/image.ts with the arm64 binary", () => {
  const image = (...args: string[]) => run(["bun", "run", "image", "--", "--no-build", "--out", `${base}/image`, "--json", ...args], { cwd: repoRoot, timeoutMs: 180_000 });

  test("labels an arm64-only image with what the arm64 binary says, and refuses binaries that disagree", async () => {
    await armBuild("--version", "0.0.1-arm64test");
    try {
      const only = await image("--arch", "arm64");
      expect(only.code).toBe(0);
      expect(JSON.parse(only.stdout.trim().split("\n").pop() as string).version).toBe("0.0.1-arm64test");
      const mixed = await image("--arch", "amd64,arm64");
      expect(mixed.code).toBe(1);
      expect(mixed.stderr).toContain("the arm64 binary is trellis 0.0.1-arm64test");
      expect(mixed.stderr).toContain("build them from the same tree");
    } finally {
      await armBuild();
    }
  }, 300_000);
});
