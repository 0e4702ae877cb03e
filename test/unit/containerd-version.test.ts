// Which containerd version the CNI directory follows, as src/apply/desired-for-node.ts gets it: the node's
// containerd is asked (gardener-node-agent's Version call) only for a config of version 3+, where the
// answer picks cni.bin_dirs (2.2+) or cni.bin_dir; no answer holds the OSC back as a retry, not as a
// refusal. Over a scratch root with config.toml in place, so `containerd config default` never runs.
import { describe, expect, test } from "bun:test";
import { mkdirSync, mkdtempSync, writeFileSync } from "node:fs";
import { parse } from "smol-toml";
import { parseOscBytes } from "../../src/api/desired.ts";
import { desiredForNode } from "../../src/apply/desired-for-node.ts";
import { createFiles } from "../../src/host/files.ts";
import type { ImageStore } from "../../src/host/registry/store.ts";
import { createLogger } from "../../src/log.ts";
import { containerdConfigFile } from "../../src/plan/containerd.ts";
import { runDir } from "../harness/exec.ts";

const source = "Secret kube-system/osc-v";
const noImages: ImageStore = { extract: () => Promise.reject(new Error("no images in this test")), prune: async () => {} };
const osc = (() => {
  const yaml = "apiVersion: extensions.gardener.cloud/v1alpha1\nkind: OperatingSystemConfig\nspec:\n  type: debian\n  criConfig:\n    name: containerd\n    containerd:\n      sandboxImage: registry.k8s.io/pause:3.10\n";
  const parsed = parseOscBytes(new TextEncoder().encode(yaml), source);
  if (!parsed.ok) throw new Error(parsed.errors.join("\n"));
  return parsed.value;
})();

function nodeWith(config: string): string {
  const root = mkdtempSync(`${runDir("containerd-version")}/root-`);
  mkdirSync(`${root}/etc/containerd`, { recursive: true });
  writeFileSync(`${root}/etc/containerd/config.toml`, config);
  return root;
}

async function resolve(config: string, answer: () => Promise<string>) {
  const asked: string[] = [];
  const r = await desiredForNode(osc, source, {
    files: createFiles(nodeWith(config)),
    hostName: "n",
    images: noImages,
    log: createLogger({ write: () => {} }),
    containerdVersion: () => {
      asked.push("version");
      return answer();
    },
  });
  const toml = r.ok ? new TextDecoder().decode(r.value.files.find((f) => f.path === containerdConfigFile)?.content as Uint8Array) : "";
  const cni = r.ok ? ((parse(toml) as { plugins: Record<string, { cni?: Record<string, unknown> }> }).plugins["io.containerd.cri.v1.runtime"]?.cni ?? {}) : {};
  return { r, asked, cni };
}

const v3 = "version = 3\n[plugins.'io.containerd.cri.v1.runtime'.cni]\nbin_dir = ''\nbin_dirs = ['/opt/cni/bin']\n";

describe("containerd's version for the CNI directory", () => {
  test("a version 3 config and containerd 2.2: bin_dirs", async () => {
    const { r, asked, cni } = await resolve(v3, async () => "v2.2.0");
    expect(r.ok).toBe(true);
    expect(asked).toEqual(["version"]);
    expect(cni).toEqual({ bin_dirs: ["/opt/cni/bin"] });
  });

  test("a version 3 config and containerd 2.1: bin_dir", async () => {
    const { cni } = await resolve(v3, async () => "2.1.9");
    expect(cni).toEqual({ bin_dir: "/opt/cni/bin", bin_dirs: ["/opt/cni/bin"] });
  });

  test("a version 2 config: containerd is not asked", async () => {
    const { r, asked } = await resolve("version = 2\n", () => Promise.reject(new Error("must not be asked")));
    expect(r.ok).toBe(true);
    expect(asked).toEqual([]);
  });

  test("containerd does not answer: the OSC waits for a retry, saying why", async () => {
    const { r } = await resolve(v3, () => Promise.reject(new Error("containerd Version call on /run/containerd/containerd.sock: connect ENOENT")));
    expect(r).toEqual({
      ok: false,
      retry: true,
      errors: [`${source}: spec.criConfig: containerd's version is needed to choose between cni.bin_dir and cni.bin_dirs: containerd Version call on /run/containerd/containerd.sock: connect ENOENT`],
    });
  });
});
