// `trellis plan --root DIR` with the compiled binary on a machine image in a directory: it changes not
// one byte under DIR (imageRef files are pulled into a throwaway cache outside it, removed afterwards),
// and it resolves paths by the same rule as the agent on a node: symlinks within the root, only
// root-owned ones followed.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { lchownSync, mkdirSync, mkdtempSync, readdirSync, symlinkSync, writeFileSync } from "node:fs";
import { stringify } from "yaml";
import { trellisBinary } from "../harness/binary.ts";
import { run, runDir } from "../harness/exec.ts";
import { fingerprint } from "../harness/fingerprint.ts";
import { buildImageLayout } from "../harness/oci.ts";
import { type Registry, startRegistry } from "../harness/registry.ts";

const base = runDir("plan-root");
let registry: Registry;
const tool = "#!/bin/sh\necho tool v1\n";

beforeAll(async () => {
  registry = await startRegistry();
  await buildImageLayout(`${base}/tool-layout`, "v1", { "usr/bin/tool": { content: tool, mode: 0o755 } });
  await registry.push(`${base}/tool-layout`, "tools/tool", "v1");
}, 60_000);
afterAll(async () => {
  await registry?.stop();
});

const osc = (files: unknown[]) =>
  stringify({
    apiVersion: "extensions.gardener.cloud/v1alpha1",
    kind: "OperatingSystemConfig",
    spec: {
      files,
      criConfig: { name: "containerd", containerd: { registries: [{ upstream: "registry.example.invalid", server: "https://registry.example.invalid", hosts: [{ url: `http://${registry.host}` }] }] } },
    },
  });

async function plan(root: string, text: string, tmp: string) {
  writeFileSync(`${base}/osc.yaml`, text);
  return run([await trellisBinary(), "plan", "--root", root, "--osc", `${base}/osc.yaml`], { env: { ...(process.env as Record<string, string>), TMPDIR: tmp }, timeoutMs: 60_000 });
}

describe("trellis plan --root", () => {
  test("plans an imageRef file and changes nothing under the root, nor leaves its image cache behind", async () => {
    const root = mkdtempSync(`${base}/root-`);
    const tmp = mkdtempSync(`${base}/tmp-`);
    mkdirSync(`${root}/etc`);
    writeFileSync(`${root}/etc/hostname`, "image\n");
    const before = fingerprint(root);
    const r = await plan(root, osc([{ path: "/opt/bin/tool", permissions: 0o755, content: { imageRef: { image: "registry.example.invalid/tools/tool:v1", filePathInImage: "/usr/bin/tool" } } }]), tmp);
    expect(r.stderr).toBe("");
    expect(r.code).toBe(3);
    expect(r.stdout).toContain("write file /opt/bin/tool (mode 0755): new");
    expect(fingerprint(root)).toEqual(before);
    expect(readdirSync(tmp)).toEqual([]);
  });

  test("follows a root-owned symlink within the root, as the node does; refuses one another user owns", async () => {
    const root = mkdtempSync(`${base}/root-`);
    const tmp = mkdtempSync(`${base}/tmp-`);
    mkdirSync(`${root}/run`);
    mkdirSync(`${root}/var`);
    mkdirSync(`${root}/etc`);
    symlinkSync("/run", `${root}/var/run`); // as every Debian image has it
    mkdirSync(`${root}/tmp`, { mode: 0o1777 });
    symlinkSync("/etc", `${root}/tmp/planted`);
    lchownSync(`${root}/tmp/planted`, 4242, 4242);
    const before = fingerprint(root);

    const followed = await plan(root, osc([{ path: "/var/run/app/flag", content: { inline: { data: "1" } } }]), tmp);
    expect(followed.code).toBe(3);
    expect(followed.stdout).toContain("write file /var/run/app/flag (mode 0600): new");

    const planted = await plan(root, osc([{ path: "/tmp/planted/sudoers", content: { inline: { data: "x" } } }]), tmp);
    expect(planted.code).toBe(1);
    expect(planted.stderr).toContain("spec.files[0] (/tmp/planted/sudoers): /tmp/planted/sudoers cannot be written: /tmp/planted is owned by uid 4242, not root");
    expect(fingerprint(root)).toEqual(before);
  });
});
