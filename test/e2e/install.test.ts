// install.sh, the node-init script carried in user data, on real systemd nodes against a real registry,
// and build/image.ts, which makes the image it installs. The upstream registry name never resolves:
// every pull goes through the mirror that /etc/containerd/certs.d/<upstream>/hosts.toml names, as on
// an air-gapped node. Until `gardener-node-agent bootstrap` exists, most images hold a FIXTURE agent:
// a shell script that records how it was called.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { existsSync, readFileSync, rmSync } from "node:fs";
import { sha256 } from "../../build/oci-layout.ts";
import { repoRoot, trellisArm64Binary, trellisBinary } from "../harness/binary.ts";
import { runDir, runOk, waitFor } from "../harness/exec.ts";
import { bootNode, type Node } from "../harness/node.ts";
import { writeLayout } from "../harness/oci.ts";
import { startRegistry, type Registry } from "../harness/registry.ts";

const upstream = "registry.example.invalid";
const unit = "gardener-node-init.service";
const agent = "/opt/bin/gardener-node-agent";
const configDir = "/var/lib/gardener-node-agent";
/** Where cloud-init keeps user-data scripts; the script runs from inside the node, never from the checkout. */
const scriptPath = "/var/lib/cloud/instance/scripts/part-001";
const installScript = readFileSync(`${repoRoot}/install.sh`);

// The fixture agent: appends "<label>: <arguments>" to CALLS and exits 0.
const CALLS = "/var/lib/fixture-agent/calls";
const fixtureAgent = (label: string) =>
  `#!/bin/sh\n# FIXTURE standing in for gardener-node-agent (${label}): records its calls\nmkdir -p ${CALLS.replace(/\/[^/]*$/, "")}\necho "${label}: $*" >>${CALLS}\n`;

let registry: Registry;
let images: string;
/** References of the fixture images pushed to `registry`, as install.sh gets them: upstream name + digest. */
const fixtures = { multi: "", zstd: "", dual: "", otherDigest: "" };
/** Digests inside them: the amd64 manifest of `multi`; of `dual` the amd64 manifests and layers of each compression; two gzip layers. */
const digests = { multiAmd64: "", dualZstd: "", dualGzip: "", dualZstdLayer: "", dualGzipLayer: "", amd64Layer: "", arm64Layer: "" };

beforeAll(async () => {
  registry = await startRegistry();
  images = runDir("install-images");
  const agentFile = (label: string) => ({ "gardener-node-agent": { content: fixtureAgent(label), mode: 0o755 } });
  // An index with two architectures (arm64 listed first, so picking the first entry would be wrong).
  const multi = writeLayout(`${images}/multi`, "fixture-multi", [
    { platform: { os: "linux", architecture: "arm64", variant: "v8" }, layers: [agentFile("arm64")] },
    { platform: { os: "linux", architecture: "amd64" }, layers: [agentFile("amd64")] },
  ]);
  // One manifest, no index, a zstd layer.
  const zstd = writeLayout(`${images}/zstd`, "fixture-zstd", { platform: { os: "linux", architecture: "amd64" }, layers: [agentFile("zstd")] }, {
    compression: "zstd",
  });
  // As build/image.ts writes a release: zstd images first, the same images with gzip layers after them.
  const dual = writeLayout(
    `${images}/dual`,
    "fixture-dual",
    [
      { platform: { os: "linux", architecture: "arm64", variant: "v8" }, layers: [agentFile("arm64")] },
      { platform: { os: "linux", architecture: "amd64" }, layers: [agentFile("dual")] },
    ],
    { compression: "zstd", alternative: { compression: "gzip" } },
  );
  const amd64Of = (images: typeof dual.images) => images[1] as (typeof dual.images)[number];
  Object.assign(digests, {
    multiAmd64: amd64Of(multi.images).manifest.digest,
    dualZstd: amd64Of(dual.images).manifest.digest,
    dualGzip: amd64Of(dual.alternatives).manifest.digest,
    dualZstdLayer: amd64Of(dual.images).layers[0]?.digest,
    dualGzipLayer: amd64Of(dual.alternatives).layers[0]?.digest,
    amd64Layer: amd64Of(multi.images).layers[0]?.digest,
    arm64Layer: multi.images[0]?.layers[0]?.digest,
  });
  for (const [name, layout] of [["multi", multi], ["zstd", zstd], ["dual", dual]] as const) {
    // --all: the whole index, not just this machine's image (the harness's push() copies one image).
    const dest = `docker://${registry.host}/trellis/agent:fixture-${name}`;
    await runOk(["skopeo", "copy", "-q", "--all", "--preserve-digests", "--dest-tls-verify=false", `oci:${images}/${name}:fixture-${name}`, dest]);
    fixtures[name] = `${upstream}/trellis/agent:fixture-${name}@${layout.root.digest}`;
  }
  fixtures.otherDigest = zstd.root.digest;
}, 60_000);

afterAll(async () => {
  await registry?.stop();
  if (images) rmSync(images, { recursive: true, force: true });
});

/**
 * Boots a node whose hosts.toml sends `upstream` to `mirror` ("127.0.0.1:PORT", plain HTTP). The
 * upstream's own endpoint (`server`, tried last) is a closed local port: a test must never ask DNS.
 */
async function mirroredNode(prefix: string, containerd: boolean, mirror = registry.host, hostsToml?: string): Promise<Node> {
  const node = await bootNode(prefix, { net: "host", containerd });
  try {
    await node.writeFile(
      `/etc/containerd/certs.d/${upstream}/hosts.toml`,
      hostsToml ?? `server = "https://127.0.0.1:1"\n\n[host."http://${mirror}"]\n  capabilities = ["pull", "resolve"]\n`,
    );
    await node.writeFile(scriptPath, installScript, 0o700);
  } catch (err) {
    await node.stop();
    throw err;
  }
  return node;
}

/** Runs install.sh as cloud-init does (a plain process, not a unit) with these settings. */
function cloudInit(node: Node, env: Record<string, string>) {
  return node.exec(["sh", scriptPath], { env, timeoutMs: 30_000 });
}

const journal = (node: Node) => node.execOk(["journalctl", "-u", unit, "--no-pager", "-o", "cat"]);
const calls = async (node: Node) => (existsSync(`${node.root}${CALLS}`) ? (await node.readFile(CALLS)).trim().split("\n") : []);
const waitForCalls = (node: Node, n: number) => waitFor(`${n} call(s) of the agent in ${node.name}`, async () => ((await calls(node)).length >= n ? calls(node) : false), 30_000);

/** Waits until the init unit's main process has exited with a failure; returns its journal. */
async function failure(node: Node): Promise<string> {
  await waitFor(`${unit} to fail in ${node.name}`, async () => {
    const show = await node.execOk(["systemctl", "show", unit, "-p", "ExecMainStatus", "-p", "ExecMainCode"]);
    return show.includes("ExecMainCode=1") && !show.includes("ExecMainStatus=0") ? show : false;
  }, 30_000);
  return journal(node);
}

describe("install.sh", () => {
  test("cloud-init mode sets up gardener-node-init.service, which pulls with containerd through the mirror and runs bootstrap; a second run skips the download", async () => {
    const mirror = startMirror(registry.host);
    const node = await mirroredNode("inst-ctr", true, mirror.host);
    try {
      const r = await cloudInit(node, { TRELLIS_IMAGE: fixtures.multi });
      expect(r.stderr).toBe("");
      expect(r.code).toBe(0);
      expect(r.stdout).toBe(`trellis-install: started ${unit}\n`);

      expect(await waitForCalls(node, 1)).toEqual([`amd64: bootstrap --config-dir ${configDir}`]);
      const unitFile = await node.readFile(`/etc/systemd/system/${unit}`);
      expect(unitFile).toContain(`ExecStart=/bin/sh ${configDir}/init.sh run\n`);
      for (const line of ["Restart=on-failure", "RestartSec=5", "StandardOutput=journal+console", "WantedBy=multi-user.target"]) expect(unitFile).toContain(`${line}\n`);
      expect((await node.exec(["systemctl", "is-enabled", unit])).stdout.trim()).toBe("enabled");
      // The unit runs a copy with the settings cloud-init had baked in, readable by root only.
      const copy = await node.readFile(`${configDir}/init.sh`);
      expect(copy).toStartWith(`TRELLIS_CONFIG_DIR='${configDir}'\nTRELLIS_HOSTS_DIR='/etc/containerd/certs.d'\nTRELLIS_IMAGE='${fixtures.multi}'\n`);
      expect(copy).toEndWith(installScript.toString());
      expect((await node.execOk(["stat", "-c", "%a", `${configDir}/init.sh`])).trim()).toBe("600");

      expect(await node.readFile(agent)).toBe(fixtureAgent("amd64"));
      expect((await node.execOk(["stat", "-c", "%a", agent])).trim()).toBe("755");
      const digest = fixtures.multi.split("@sha256:")[1];
      // The index's digest, the binary's sha256 and the manifest it came from (bootstrap tells the agent's image cache).
      expect((await node.readFile(`${configDir}/init-installed`)).trim()).toBe(`${digest} ${sha256(fixtureAgent("amd64"))} ${digests.multiAmd64}`);
      const log = await journal(node);
      expect(log).toContain(`trellis-install: pulling ${fixtures.multi} with containerd\n`);
      expect(log).toContain(`trellis-install: installed ${agent} (${digest})\n`);
      expect(log).toContain(`trellis-install: running ${agent} bootstrap --config-dir ${configDir}\n`);
      // The image is not kept in containerd once the binary is out (nor unpacked into a snapshot); no temporary file is left behind.
      expect((await node.execOk(["ctr", "-n", "trellis", "images", "ls", "-q"])).trim()).toBe("");
      expect((await node.execOk(["ctr", "-n", "trellis", "snapshots", "ls"])).trim().split("\n").slice(1)).toEqual([]);
      expect(existsSync(`${node.root}${configDir}/init.tmp`)).toBe(false);
      expect((await node.execOk(["sh", "-c", "ls -A /opt/bin"])).trim()).toBe("gardener-node-agent");
      expect(mirror.requests.filter((r) => r.includes("/blobs/")).length).toBeGreaterThan(0);

      // Again (a reboot before bootstrap finished): the installed binary is the wanted one, nothing is fetched.
      const before = mirror.requests.length;
      await node.execOk(["systemctl", "start", unit]);
      expect(await waitForCalls(node, 2)).toEqual([`amd64: bootstrap --config-dir ${configDir}`, `amd64: bootstrap --config-dir ${configDir}`]);
      expect(mirror.requests.slice(before)).toEqual([]);
      expect(await journal(node)).toContain(`trellis-install: ${agent} is already ${digest}\n`);
    } finally {
      await node.stop();
      mirror.stop();
    }
  }, 60_000);

  for (const containerd of [false, true]) {
    const how = containerd ? "containerd" : "curl (no containerd on the node)";
    test(`${how}: a single-manifest image with a zstd layer`, async () => {
      const node = await mirroredNode(containerd ? "inst-zctr" : "inst-zcurl", containerd);
      try {
        expect((await cloudInit(node, { TRELLIS_IMAGE: fixtures.zstd })).code).toBe(0);
        expect(await waitForCalls(node, 1)).toEqual([`zstd: bootstrap --config-dir ${configDir}`]);
      } finally {
        await node.stop();
      }
    }, 60_000);
  }

  for (const containerd of [false, true]) {
    const how = containerd ? "containerd" : "curl";
    test(`${how}: an image as build/image.ts writes it (zstd first, then gzip): the zstd layer, or the gzip one on a machine without zstd; only that layer is fetched`, async () => {
      for (const withZstd of [true, false]) {
        const mirror = startMirror(registry.host);
        const node = await mirroredNode(containerd ? "inst-dctr" : "inst-dcurl", containerd, mirror.host);
        try {
          if (!withZstd) {
            await node.execOk(["rm", "-f", "/usr/bin/zstd"]); // the node's own overlay: the host keeps it
            expect((await node.exec(["sh", "-c", "command -v zstd"])).code).not.toBe(0);
          }
          expect((await cloudInit(node, { TRELLIS_IMAGE: fixtures.dual })).code).toBe(0);
          expect(await waitForCalls(node, 1)).toEqual([`dual: bootstrap --config-dir ${configDir}`]);
          const [, , manifest] = (await node.readFile(`${configDir}/init-installed`)).trim().split(" ");
          expect({ withZstd, manifest }).toEqual({ withZstd, manifest: withZstd ? digests.dualZstd : digests.dualGzip });
          // Of the two layers only the one taken (containerd fetches the image's config blob too).
          const [taken, other] = withZstd ? [digests.dualZstdLayer, digests.dualGzipLayer] : [digests.dualGzipLayer, digests.dualZstdLayer];
          const blobs = mirror.requests.filter((r) => r.startsWith("GET") && r.includes("/blobs/")).map((r) => r.replace(/\?.*/, ""));
          expect({ withZstd, taken: blobs.filter((b) => b.endsWith(taken)).length, other: blobs.filter((b) => b.endsWith(other)).length }).toEqual({ withZstd, taken: 1, other: 0 });
        } finally {
          await node.stop();
          mirror.stop();
        }
      }
    }, 90_000);
  }

  test("a zstd-only image on a machine without zstd: said so, nothing installed", async () => {
    const node = await mirroredNode("inst-nozstd", false);
    try {
      await node.execOk(["rm", "-f", "/usr/bin/zstd"]);
      expect((await cloudInit(node, { TRELLIS_IMAGE: fixtures.zstd })).code).toBe(0);
      expect(await failure(node)).toContain(`trellis-install: error: ${fixtures.zstd}: its layer needs zstd, which is not installed\n`);
      expect(existsSync(`${node.root}${agent}`)).toBe(false);
    } finally {
      await node.stop();
    }
  }, 60_000);

  test("curl path on a node without containerd: the same hosts.toml, the index's amd64 image, every blob verified", async () => {
    const mirror = startMirror(registry.host);
    const node = await mirroredNode("inst-curl", false, mirror.host);
    try {
      expect((await node.exec(["systemctl", "is-active", "containerd.service"])).stdout.trim()).not.toBe("active");
      expect((await cloudInit(node, { TRELLIS_IMAGE: fixtures.multi })).code).toBe(0);
      expect(await waitForCalls(node, 1)).toEqual([`amd64: bootstrap --config-dir ${configDir}`]);
      expect(await journal(node)).toContain(`trellis-install: fetching ${fixtures.multi} with curl\n`);
      // By digest only (never by tag), and only the amd64 image's blobs.
      const gets = mirror.requests.map((r) => r.replace(/sha256:[0-9a-f]{64}/, "D"));
      expect(gets).toEqual(["GET /v2/trellis/agent/manifests/D", "GET /v2/trellis/agent/manifests/D", "GET /v2/trellis/agent/blobs/D"]);
      expect(await node.readFile(agent)).toBe(fixtureAgent("amd64"));
    } finally {
      await node.stop();
      mirror.stop();
    }
  }, 60_000);

  for (const containerd of [false, true]) {
    test(`${containerd ? "containerd" : "curl"}: hosts.toml's hosts in order (a dead one skipped), an HTTPS mirror verified with its ca, skip_verify`, async () => {
      const dir = runDir("install-tls");
      await runOk(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
        "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", `${dir}/key.pem`, "-out", `${dir}/cert.pem`]);
      const mirror = startMirror(registry.host, { tls: { cert: readFileSync(`${dir}/cert.pem`, "utf8"), key: readFileSync(`${dir}/key.pem`, "utf8") } });
      const certs = `/etc/containerd/certs.d/${upstream}`;
      const hosts = (settings: string) =>
        `# a comment\nserver = "https://127.0.0.1:1"\n\n[host."http://127.0.0.1:1"]\n  capabilities = ["pull", "resolve"]\n\n` +
        `[host."https://${mirror.host}"]\n  capabilities = ["pull", "resolve"]\n${settings}\n  [host."https://${mirror.host}".header]\n    x-trellis = ["test"]\n`;
      const prefix = containerd ? "inst-tlsc" : "inst-tls";
      const nodes: Node[] = [];
      try {
        // With the CA: installed, after the dead mirror was tried.
        const withCa = await mirroredNode(prefix, containerd, undefined, hosts(`  ca = "${certs}/ca.crt"`));
        nodes.push(withCa);
        await withCa.install(`${dir}/cert.pem`, `${certs}/ca.crt`, 0o644);
        expect((await cloudInit(withCa, { TRELLIS_IMAGE: fixtures.multi })).code).toBe(0);
        expect(await waitForCalls(withCa, 1)).toEqual([`amd64: bootstrap --config-dir ${configDir}`]);
        if (!containerd) expect(await journal(withCa)).toContain(`trellis-install: GET http://127.0.0.1:1/v2/trellis/agent/manifests/${fixtures.multi.split("@")[1]}: 000\n`);
        // Without it: the mirror's certificate is refused, nothing is installed.
        const withoutCa = await mirroredNode(prefix, containerd, undefined, hosts(""));
        nodes.push(withoutCa);
        expect((await cloudInit(withoutCa, { TRELLIS_IMAGE: fixtures.multi })).code).toBe(0);
        const log = await failure(withoutCa);
        expect(log).toContain(containerd ? "x509: certificate signed by unknown authority" : "SSL certificate problem: self-signed certificate");
        expect(existsSync(`${withoutCa.root}${agent}`)).toBe(false);
        // skip_verify = true: accepted without a CA.
        const skip = await mirroredNode(prefix, containerd, undefined, hosts("  skip_verify = true"));
        nodes.push(skip);
        expect((await cloudInit(skip, { TRELLIS_IMAGE: fixtures.multi })).code).toBe(0);
        expect(await waitForCalls(skip, 1)).toEqual([`amd64: bootstrap --config-dir ${configDir}`]);
        expect(mirror.requests.some((r) => r.includes("/blobs/"))).toBe(true);
      } finally {
        await Promise.all(nodes.map((n) => n.stop()));
        mirror.stop();
        rmSync(dir, { recursive: true, force: true });
      }
    }, 90_000);
  }

  test("TRELLIS_URL + TRELLIS_SHA256: a plain download, verified", async () => {
    const content = fixtureAgent("url");
    const server = Bun.serve({ hostname: "127.0.0.1", port: 0, fetch: (req) => (new URL(req.url).pathname === "/agent" ? new Response(content) : new Response("", { status: 404 })) });
    const node = await mirroredNode("inst-url", false);
    try {
      expect((await cloudInit(node, { TRELLIS_URL: `http://127.0.0.1:${server.port}/agent`, TRELLIS_SHA256: sha256(content) })).code).toBe(0);
      expect(await waitForCalls(node, 1)).toEqual([`url: bootstrap --config-dir ${configDir}`]);
      expect(await journal(node)).toContain(`trellis-install: downloading http://127.0.0.1:${server.port}/agent\n`);
    } finally {
      await node.stop();
      server.stop(true);
    }
  }, 60_000);

  describe("every failure: a clear message, a non-zero exit (systemd retries), the installed binary untouched", () => {
    const missingDigest = `sha256:${"0".repeat(64)}`;
    const cases: { name: string; containerd: boolean; env: () => Record<string, string>; message: () => string | string[]; tamper?: boolean; swap?: () => [string, string]; token?: boolean }[] = [
      {
        name: "containerd: a digest the registry does not have",
        containerd: true,
        env: () => ({ TRELLIS_IMAGE: `${upstream}/trellis/agent:fixture-multi@${missingDigest}` }),
        message: () => `trellis-install: error: ${upstream}/trellis/agent:fixture-multi@${missingDigest}: manifests/${missingDigest} not found or not verified`,
      },
      {
        name: "curl: a digest the registry does not have",
        containerd: false,
        env: () => ({ TRELLIS_IMAGE: `${upstream}/trellis/agent:fixture-multi@${missingDigest}` }),
        message: () => `trellis-install: error: ${upstream}/trellis/agent:fixture-multi@${missingDigest}: manifests/${missingDigest} not found or not verified`,
      },
      {
        name: "curl: an image that does not exist",
        containerd: false,
        env: () => ({ TRELLIS_IMAGE: `${upstream}/trellis/missing:v1@${missingDigest}` }),
        message: () => `/v2/trellis/missing/manifests/${missingDigest}: 404`,
      },
      {
        // ctr fetches manifests to stdout (content fetch-object); the script checks them like curl's.
        name: "containerd: a mirror that serves other content for the digest",
        containerd: true,
        tamper: true,
        env: () => ({ TRELLIS_IMAGE: fixtures.multi }),
        message: () => [`manifests/${fixtures.multi.split("@")[1]}: got ${fixtures.otherDigest} instead`, `trellis-install: error: ${fixtures.multi}: manifests/`],
      },
      {
        // The layer goes into containerd's content store first, which checks it as it commits.
        name: "containerd: a mirror that serves another layer for the layer's digest",
        containerd: true,
        swap: () => [digests.amd64Layer, digests.arm64Layer],
        env: () => ({ TRELLIS_IMAGE: fixtures.multi }),
        message: () => [`unexpected commit digest`, `trellis-install: error: containerd could not pull ${fixtures.multi}`],
      },
      {
        // Streamed through the decompressor into the temp file and hashed on the way: refused before it is installed.
        name: "curl: a mirror that serves another layer for the layer's digest",
        containerd: false,
        swap: () => [digests.amd64Layer, digests.arm64Layer],
        env: () => ({ TRELLIS_IMAGE: fixtures.multi }),
        message: () => [`blobs/${digests.amd64Layer}: got ${digests.arm64Layer} instead`, `trellis-install: error: ${fixtures.multi}: blobs/${digests.amd64Layer} not found or not verified`],
      },
      {
        name: "curl: a mirror that serves other content for the digest",
        containerd: false,
        tamper: true,
        env: () => ({ TRELLIS_IMAGE: fixtures.multi }),
        message: () => `manifests/${fixtures.multi.split("@")[1]}: got ${fixtures.otherDigest} instead`,
      },
      {
        // Registry auth is containerd's job; the curl fallback speaks to mirrors that allow anonymous pulls.
        name: "curl: a registry that wants a bearer token",
        containerd: false,
        token: true,
        env: () => ({ TRELLIS_IMAGE: fixtures.multi }),
        message: () => `/v2/trellis/agent/manifests/${fixtures.multi.split("@")[1]}: 401`,
      },
      {
        name: "a reference without a digest",
        containerd: false,
        env: () => ({ TRELLIS_IMAGE: `${upstream}/trellis/agent:fixture-multi` }),
        message: () => "trellis-install: error: need TRELLIS_IMAGE=name[:tag]@sha256:<hex> or TRELLIS_URL+TRELLIS_SHA256",
      },
      {
        name: "TRELLIS_URL with the wrong TRELLIS_SHA256",
        containerd: false,
        env: () => ({ TRELLIS_URL: `http://${registry.host}/v2/`, TRELLIS_SHA256: "a".repeat(64) }),
        message: () => `trellis-install: error: http://${registry.host}/v2/: sha256 is ${sha256("{}")}, want ${"a".repeat(64)}`,
      },
    ];
    for (const c of cases) {
      test(c.name, async () => {
        // The tampering mirror answers the index's digest with the zstd image's manifest.
        const mirror = startMirror(registry.host, {
          ...(c.tamper ? { swap: [fixtures.multi.split("@")[1] as string, fixtures.otherDigest] as [string, string] } : {}),
          ...(c.swap ? { swap: c.swap() } : {}),
          ...(c.token ? { token: "t0k3n" } : {}),
        });
        const node = await mirroredNode("inst-fail", c.containerd, mirror.host);
        try {
          await node.writeFile(agent, "old agent\n", 0o755);
          const r = await cloudInit(node, c.env());
          const log = r.code === 0 ? await failure(node) : r.stdout + r.stderr; // bad settings fail already under cloud-init
          for (const message of [c.message()].flat()) expect(log).toContain(message);
          expect(await node.readFile(agent)).toBe("old agent\n");
          expect((await node.execOk(["sh", "-c", "ls -A /opt/bin"])).trim()).toBe("gardener-node-agent");
          expect(await calls(node)).toEqual([]);
          expect(existsSync(`${node.root}${configDir}/init-installed`)).toBe(false);
        } finally {
          await node.stop();
          mirror.stop();
        }
      }, 60_000);
    }
  });
});

describe("build/image.ts", () => {
  test("a valid, reproducible OCI layout of the real binary (zstd images, then the same with gzip layers); pushed to a registry, pulled back, installed by install.sh, and it runs", async () => {
    const bin = await trellisBinary();
    const arm = await trellisArm64Binary();
    const dir = runDir("install-image");
    const ref = `${registry.host}/trellis/agent:release`;
    // --fast: the release's layout at levels that take seconds (zstd -19 and gzip -9 take minutes per architecture).
    const image = (out: string, ...flags: string[]) =>
      runOk(["bun", "run", "image", "--", "--no-build", "--fast", "--arch", "arm64,amd64", "--out", out, "--json", ...flags], { cwd: repoRoot, timeoutMs: 180_000 });
    // Built twice (once while pushing): same binaries, same digests.
    const [a, b] = (await Promise.all([image(`${dir}/a`), image(`${dir}/b`, "--push", ref)])).map((out) => JSON.parse(out.trim().split("\n").pop() as string));
    expect(b.index).toBe(a.index);
    expect(b.pushed).toBe(`${ref}@${a.index}`);
    const version = JSON.parse(await runOk([bin, "version", "--json"]));

    // The layout as a registry client sees it: an index of amd64 and arm64 with zstd layers, then both again with gzip layers.
    const index = JSON.parse(await runOk(["skopeo", "inspect", "--raw", `oci:${dir}/a:${version.version}`]));
    expect(index.mediaType).toBe("application/vnd.oci.image.index.v1+json");
    const entries = index.manifests as { digest: string; platform: { architecture: string } }[];
    expect(entries.map((m) => m.platform.architecture)).toEqual(["amd64", "arm64", "amd64", "arm64"]);
    expect(entries.map((m) => m.digest)).toEqual([...a.images, ...a.alternatives].map((i: { manifest: string }) => i.manifest));
    const config = JSON.parse(await runOk(["skopeo", "inspect", "--config", `oci:${dir}/a:${version.version}`]));
    expect(config.config).toEqual({
      Entrypoint: ["/gardener-node-agent"],
      Labels: { "org.opencontainers.image.title": "trellis", "org.opencontainers.image.version": version.version, "org.opencontainers.image.revision": version.commit },
    });
    for (const img of [...a.images, ...a.alternatives]) expect(img.layerBytes).toBeLessThan(img.binaryBytes / 1.5);
    for (const img of a.images) expect(img.layerBytes).toBeLessThan(a.alternatives.find((g: { platform: string }) => g.platform === img.platform).layerBytes);

    // Pulled back from the registry by digest, every entry's one layer holds its architecture's binary at /gardener-node-agent, 0755.
    const binaries: Record<string, string> = { amd64: bin, arm64: arm };
    for (const [i, entry] of entries.entries()) {
      const back = `${dir}/back-${i}`;
      await runOk(["skopeo", "copy", "-q", "--src-tls-verify=false", `docker://${registry.host}/trellis/agent@${entry.digest}`, `oci:${back}:x`]);
      const manifest = JSON.parse(await runOk(["skopeo", "inspect", "--raw", `oci:${back}:x`]));
      expect(manifest.layers.length).toBe(1);
      const kind = i < 2 ? "zstd" : "gzip";
      expect(manifest.layers[0].mediaType).toBe(`application/vnd.oci.image.layer.v1.tar+${kind}`);
      const layer = `${back}/blobs/sha256/${manifest.layers[0].digest.slice(7)}`;
      expect(await runOk(["sh", "-c", `${kind} -dc ${layer} | tar -tvf -`])).toMatch(/^-rwxr-xr-x 0\/0 +\d+ 1970-01-01 00:00 gardener-node-agent\n$/);
      expect((await runOk(["sh", "-c", `${kind} -dc ${layer} | tar -xOf - gardener-node-agent | sha256sum`])).slice(0, 64)).toBe(sha256(readFileSync(binaries[entry.platform.architecture] as string)));
    }

    // install.sh installs it from the upstream name through the mirror; the agent runs in the node.
    const node = await mirroredNode("inst-real", true);
    try {
      expect((await cloudInit(node, { TRELLIS_IMAGE: `${upstream}/trellis/agent:release@${a.index}` })).code).toBe(0);
      await waitFor("the agent installed", async () => (await node.exec(["test", "-s", `${configDir}/init-installed`])).code === 0, 60_000);
      expect(await node.execOk([agent, "version"])).toBe(`trellis ${version.version} (commit ${version.commit}, ${version.runtime})\n`);
      await node.exec(["systemctl", "disable", "--now", unit]); // this binary may not know `bootstrap` yet: stop the retries
      expect((await node.execOk(["sh", "-c", `sha256sum ${agent}`])).slice(0, 64)).toBe(sha256(readFileSync(bin)));
      expect((await node.readFile(`${configDir}/init-installed`)).trim().split(" ")[2]).toBe(a.images[0].manifest);
    } finally {
      await node.stop();
      rmSync(dir, { recursive: true, force: true });
    }
  }, 300_000);
});

/**
 * A mirror in front of the registry, in this process: records the requests it gets, can insist on an
 * anonymous bearer token first (as public registries do), and can answer one digest with another's
 * content (a mirror that lies).
 */
function startMirror(upstreamHost: string, opts: { token?: string; swap?: [string, string]; tls?: { cert: string; key: string } } = {}) {
  const requests: string[] = [];
  const server = Bun.serve({
    hostname: "127.0.0.1",
    port: 0,
    ...(opts.tls ? { tls: opts.tls } : {}),
    async fetch(req: Request): Promise<Response> {
      const url = new URL(req.url);
      requests.push(`${req.method} ${url.pathname}${url.search}`);
      if (opts.token) {
        if (url.pathname === "/token") return Response.json({ token: opts.token, expires_in: 300 });
        if (req.headers.get("authorization") !== `Bearer ${opts.token}`) {
          const realm = `${url.protocol}//${url.host}/token`;
          return new Response("{}", { status: 401, headers: { "www-authenticate": `Bearer realm="${realm}",service="fixture-registry",scope="repository:trellis/agent:pull"` } });
        }
      }
      const path = opts.swap ? url.pathname.replace(opts.swap[0], opts.swap[1]) : url.pathname;
      const r = await fetch(`http://${upstreamHost}${path}`, { method: req.method, headers: { accept: req.headers.get("accept") ?? "*/*" } });
      const headers = new Headers(r.headers);
      if (opts.swap) headers.delete("docker-content-digest");
      return new Response(await r.arrayBuffer(), { status: r.status, headers });
    },
  });
  return { host: `127.0.0.1:${server.port}`, requests, stop: () => server.stop(true) };
}
