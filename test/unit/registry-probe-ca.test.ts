// The CA files a registry's readiness probe reads (criConfig.containerd.registries[].hosts[].caCerts):
// through Files, within the root, at most maxFileBytes each; a file the node cannot offer as a CA (too
// large, a FIFO, a directory) refuses the OSC with an error naming the object and field, and one that does
// not exist yet only holds the registry back. src/apply/desired-for-node.ts, over a scratch root.
import { describe, expect, test } from "bun:test";
import { mkdirSync, mkdtempSync, writeFileSync } from "node:fs";
import { maxFileBytes, parseOscBytes } from "../../src/api/desired.ts";
import { desiredForNode } from "../../src/apply/desired-for-node.ts";
import { createFiles } from "../../src/host/files.ts";
import type { ImageStore } from "../../src/host/registry/store.ts";
import { createLogger } from "../../src/log.ts";
import { runDir } from "../harness/exec.ts";

const source = "Secret kube-system/osc-ca";
const noImages: ImageStore = { extract: () => Promise.reject(new Error("no images in this test")), prune: async () => {} };

/** An OSC with one registry whose probed host names `caCerts`; its probe goes to 127.0.0.1:1 (refused at once). */
function osc(caCerts: string[]) {
  const yaml = `apiVersion: extensions.gardener.cloud/v1alpha1
kind: OperatingSystemConfig
spec:
  type: debian
  purpose: reconcile
  criConfig:
    name: containerd
    containerd:
      registries:
      - upstream: quay.io
        readinessProbe: true
        hosts:
        - url: http://127.0.0.1:1
          caCerts: [${caCerts.map((c) => JSON.stringify(c)).join(", ")}]
`;
  const parsed = parseOscBytes(new TextEncoder().encode(yaml), source);
  if (!parsed.ok) throw new Error(parsed.errors.join("\n"));
  return parsed.value;
}

/** A node root with containerd's config in place (so containerd is not asked for its default) and CA files. */
function node(): string {
  const root = mkdtempSync(`${runDir("registry-probe-ca")}/root-`);
  mkdirSync(`${root}/etc/containerd/certs.d/quay.io`, { recursive: true });
  writeFileSync(`${root}/etc/containerd/config.toml`, 'version = 2\n[plugins."io.containerd.grpc.v1.cri".registry]\n  config_path = "/etc/containerd/certs.d"\n');
  mkdirSync(`${root}/etc/pki`, { recursive: true });
  writeFileSync(`${root}/etc/pki/big.pem`, Buffer.alloc(maxFileBytes + 1, "A"));
  writeFileSync(`${root}/etc/pki/ok.pem`, "-----BEGIN CERTIFICATE-----\n-----END CERTIFICATE-----\n");
  Bun.spawnSync(["mkfifo", `${root}/etc/pki/fifo.pem`]);
  return root;
}

const resolve = (root: string, caCerts: string[]) =>
  desiredForNode(osc(caCerts), source, { files: createFiles(root), hostName: "n", images: noImages, log: createLogger({ write: () => {} }) });

describe("a registry's CA files for its readiness probe", () => {
  test("too large, a FIFO, a directory: the OSC is refused, each naming the object, the field and the file", async () => {
    const started = performance.now();
    const r = await resolve(node(), ["/etc/pki/big.pem", "/etc/pki/fifo.pem", "/etc/pki", "ok.pem"]);
    expect(performance.now() - started).toBeLessThan(2_000);
    expect(r.ok).toBe(false);
    const field = `${source}: spec.criConfig.containerd.registries[0].hosts[0].caCerts`;
    expect(r.ok ? [] : r.errors).toEqual([
      `${field}[0]: /etc/pki/big.pem is ${maxFileBytes + 1} bytes, more than the limit of ${maxFileBytes}`,
      `${field}[1]: /etc/pki/fifo.pem is a FIFO, not a regular file`,
      `${field}[2]: /etc/pki is a directory (EISDIR)`,
    ]);
  });

  test("within the limit, relative to the registry's directory or through ..: read within the root; one missing only holds the registry back", async () => {
    const root = node();
    writeFileSync(`${root}/etc/containerd/certs.d/quay.io/ca.crt`, "-----BEGIN CERTIFICATE-----\n-----END CERTIFICATE-----\n");
    for (const caCerts of [["ca.crt"], ["../../../pki/ok.pem"], ["/etc/pki/ok.pem"], ["/etc/pki/missing.pem"]]) {
      const r = await resolve(root, caCerts);
      // The probe itself fails (nothing listens on 127.0.0.1:1): applied without the registry, which waits.
      const why = caCerts[0] === "/etc/pki/missing.pem" ? "its CA file /etc/pki/missing.pem does not exist (yet)" : expect.stringContaining("http://127.0.0.1:1/v2/: ");
      expect({ caCerts, ok: r.ok, waitingFor: r.ok ? r.waitingFor : r.errors }).toEqual({ caCerts, ok: true, waitingFor: [{ registry: "quay.io", why }] });
    }
  });
});

// gardener-node-agent probes a registry that is new or whose configuration changed (changes.go,
// computeContainerdRegistryDiffs) and writes its hosts.toml only once it answers; one configured already is
// not probed again.
describe("which registries are probed", () => {
  const hostsToml = "/etc/containerd/certs.d/quay.io/hosts.toml";
  const configured = (ca: string) => `# managed by gardener-node-agent\n[host."http://127.0.0.1:1"]\n  capabilities = ["pull","resolve"]\n  ca = ["${ca}"]\n\n`;
  const written = (r: Awaited<ReturnType<typeof resolve>>) => (r.ok ? r.value.files.some((f) => f.path === hostsToml) : undefined);

  test("hosts.toml as the OSC has it: not probed, written as it is, nothing waits", async () => {
    const root = node();
    writeFileSync(`${root}${hostsToml}`, configured("/etc/pki/ok.pem"));
    const r = await resolve(root, ["/etc/pki/ok.pem"]);
    expect({ ok: r.ok, waitingFor: r.ok && r.waitingFor, written: written(r) }).toEqual({ ok: true, waitingFor: [], written: true });
  });

  test("hosts.toml of another configuration (the OSC changed the registry): probed again; until it answers the old file stays", async () => {
    const root = node();
    writeFileSync(`${root}${hostsToml}`, configured("/etc/pki/old.pem"));
    const r = await resolve(root, ["/etc/pki/ok.pem"]);
    expect({ ok: r.ok, waitingFor: r.ok && r.waitingFor.map((w) => w.registry), written: written(r), kept: r.ok && r.value.keep }).toEqual({ ok: true, waitingFor: ["quay.io"], written: false, kept: [hostsToml] });
  });
});
