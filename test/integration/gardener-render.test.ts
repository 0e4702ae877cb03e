// What Gardener itself renders (test/peer/osc-render: Gardener v1.150's own code, built from the Go module
// proxy) read by trellis: the OSC and the NodeAgentConfiguration in it pass the strict schemas (every field
// known, docs/gardener-fields.md), the checksum trellis stamps is the one gardenlet computed, and
// bootstrap.kubeletDataVolumeSize comes in the unit trellis reads (bytes). Checksums of bytes that are not
// UTF-8 are compared with sha256sum, an implementation that is not trellis's.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { Buffer } from "node:buffer";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { parse } from "yaml";
import { parseAgentConfig } from "../../src/api/agent-config.ts";
import { oscChecksum, parseOscBytes } from "../../src/api/desired.ts";
import type { OperatingSystemConfig } from "../../src/api/osc.ts";
import { runOk } from "../harness/exec.ts";
import { binaryPathInImage, trellisImageSpec } from "../../build/trellis-image.ts";
import { repoRoot } from "../harness/binary.ts";
import { rendererBinary } from "../harness/worker-osc.ts";

const dir = mkdtempSync("/tmp/trellis-gardener-render-");
type Rendered = { bytes: Uint8Array; checksum: string; osc: OperatingSystemConfig; init: OperatingSystemConfig };
let plain: Rendered;
let withDataVolume: Rendered;

const images = { hyperkube: "r/h:v1.35.4", "gardener-node-agent": "r/g:v1", "pause-container": "r/p:3" };

/** `imageVectorOverwrite`: a file gardenlet would read (IMAGEVECTOR_OVERWRITE) instead of the values' images. */
async function render(name: string, extra: Record<string, unknown>, imageVectorOverwrite?: string): Promise<Rendered> {
  const ca = readFileSync(`${dir}/ca.crt`, "utf8");
  const values = { apiServerURL: "https://10.233.0.1:6443", caBundle: ca, kubeletCABundle: ca, ...(imageVectorOverwrite ? {} : { images }), clusterDNS: ["10.0.0.10"], ...extra };
  writeFileSync(`${dir}/${name}.json`, JSON.stringify(values));
  const env = imageVectorOverwrite ? { env: { ...(process.env as Record<string, string>), IMAGEVECTOR_OVERWRITE: imageVectorOverwrite } } : {};
  await runOk([await rendererBinary(), "--values", `${dir}/${name}.json`, "--out", `${dir}/${name}-osc.yaml`, "--secret-out", `${dir}/${name}-secret.yaml`, "--init-out", `${dir}/${name}-init.yaml`], env);
  const secret = parse(readFileSync(`${dir}/${name}-secret.yaml`, "utf8"));
  const bytes = new Uint8Array(Buffer.from(secret.data["osc.yaml"], "base64"));
  const osc = parseOscBytes(bytes, `${name} osc.yaml`);
  if (!osc.ok) throw new Error(osc.errors.join("\n"));
  const init = parseOscBytes(readFileSync(`${dir}/${name}-init.yaml`), `${name} init`);
  if (!init.ok) throw new Error(init.errors.join("\n"));
  return { bytes, checksum: secret.metadata.annotations["checksum/data-script"], osc: osc.value, init: init.value };
}

/** The agent's configuration file an OSC carries (inline, base64), as text. */
function agentConfigIn(osc: OperatingSystemConfig): string {
  const file = (osc.spec.files ?? []).find((f) => /^\/var\/lib\/gardener-node-agent\/config-.+\.yaml$/.test(f.path));
  const inline = file?.content.inline;
  if (!inline) throw new Error("no inline gardener-node-agent configuration in the OSC");
  return inline.encoding === "b64" ? Buffer.from(inline.data, "base64").toString("utf8") : inline.data;
}

beforeAll(async () => {
  await runOk(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", `${dir}/ca.key`, "-out", `${dir}/ca.crt`, "-days", "1", "-subj", "/CN=render-ca"]);
  plain = await render("plain", {});
  withDataVolume = await render("data-volume", { kubeletDataVolume: { name: "kubelet", size: "20Gi" } });
}, 30 * 60_000);
afterAll(() => rmSync(dir, { recursive: true, force: true }));

describe("Gardener's rendering, read by trellis", () => {
  test("the worker OSC and its agent configuration pass the strict schemas (no field unknown to trellis)", () => {
    expect(plain.osc.spec.units?.length).toBeGreaterThan(5);
    const config = parseAgentConfig(agentConfigIn(plain.osc), "config from the OSC");
    if (!config.ok) throw new Error(config.errors.join("\n"));
    expect(config.config.controllers.operatingSystemConfig.secretName).toStartWith("gardener-node-agent-worker-");
  });

  test("the checksum trellis stamps is gardenlet's checksum/data-script", () => {
    expect(oscChecksum(plain.bytes)).toBe(plain.checksum);
    expect(oscChecksum(withDataVolume.bytes)).toBe(withDataVolume.checksum);
  });

  test("a kubelet data volume: Gardener sends bootstrap.kubeletDataVolumeSize in bytes, and the mount unit for later boots", () => {
    expect((withDataVolume.osc.spec.units ?? []).find((u) => u.name === "var-lib-kubelet.mount")?.content).toContain("What=/dev/disk/by-label/KUBEDEV");
    const config = parseAgentConfig(agentConfigIn(withDataVolume.init), "config-v1.150.0.yaml");
    if (!config.ok) throw new Error(config.errors.join("\n"));
    expect(config.config.bootstrap?.kubeletDataVolumeSize).toBe(20 * 1024 ** 3);
  });
});

// docs/gardener-landscape.md: the image vector overwrite it gives gardenlet, rendered by Gardener's code.
describe("gardenlet with the image vector overwrite docs/gardener-landscape.md gives", () => {
  const overwrite = readFileSync(`${repoRoot}/docs/gardener-landscape.md`, "utf8")
    .split("```yaml\n")
    .slice(1)
    .map((block) => block.slice(0, block.indexOf("```")))
    .find((block) => block.includes("name: gardener-node-agent"));
  const ref = (parse(overwrite ?? "") as { images: { name: string; ref: string }[] }).images.find((i) => i.name === "gardener-node-agent")?.ref as string;
  let rendered: Rendered;
  beforeAll(async () => {
    writeFileSync(`${dir}/images_overwrite.yaml`, overwrite ?? "");
    rendered = await render("overwritten", {}, `${dir}/images_overwrite.yaml`);
  }, 30 * 60_000);

  test("the OSC installs the agent from trellis's image, by its digest, at the path in the image where trellis's image holds it", () => {
    expect(ref).toMatch(/@sha256:[0-9a-f]{64}$/);
    const agent = (rendered.osc.spec.files ?? []).find((f) => f.path === "/opt/bin/gardener-node-agent");
    expect(agent).toMatchObject({ permissions: 0o755, content: { imageRef: { image: ref, filePathInImage: binaryPathInImage } } });
    expect((rendered.osc.spec.units ?? []).find((u) => u.name === "gardener-node-agent.service")?.filePaths).toContain("/opt/bin/gardener-node-agent");
    const layer = trellisImageSpec("amd64", new Uint8Array([1]), { version: "0.1.0", commit: "x" }).layers[0] ?? {};
    expect(layer[binaryPathInImage.slice(1)]).toMatchObject({ mode: 0o755 });
  });

  test("a new machine's gardener-node-init pulls the same image, copies that path out of it to /opt/bin and runs its bootstrap", () => {
    const init = (rendered.init.spec.files ?? []).find((f) => f.path === "/var/lib/gardener-node-agent/init.sh")?.content.inline;
    const script = Buffer.from(init?.data ?? "", "base64").toString("utf8");
    expect(script).toContain(`image="${ref}"`);
    expect(script).toContain(`ctr images pull $CTR_EXTRA_ARGS --hosts-dir "/etc/containerd/certs.d" "$image"`);
    expect(script).toContain(`cp -f "$tmp_dir${binaryPathInImage}" "/opt/bin"`);
    expect(script).toContain('exec "/opt/bin/gardener-node-agent" bootstrap --config-dir="/var/lib/gardener-node-agent"');
  });
});

describe("the checksum of bytes", () => {
  const encoder = new TextEncoder();
  test.each([
    ["bytes that are not UTF-8", new Uint8Array([...encoder.encode("apiVersion: x\n# "), 0xff, 0xfe, 0xc3, 0x0a])],
    ["a UTF-8 byte-order mark", new Uint8Array([0xef, 0xbb, 0xbf, ...encoder.encode("apiVersion: x\n")])],
    ["CRLF line ends", encoder.encode("apiVersion: x\r\nkind: y\r\n")],
  ])("%s: SHA-256 of the bytes as they are (sha256sum agrees), not of a decoded text", async (_name, bytes) => {
    writeFileSync(`${dir}/bytes`, bytes);
    const sha256sum = (await runOk(["sha256sum", `${dir}/bytes`])).split(" ")[0];
    expect(oscChecksum(bytes)).toBe(sha256sum as string);
    const roundTripped = encoder.encode(new TextDecoder().decode(bytes));
    if (!Buffer.from(roundTripped).equals(Buffer.from(bytes))) expect(oscChecksum(roundTripped)).not.toBe(oscChecksum(bytes));
  });
});
