// bun run image [-- --arch amd64,arm64] [--push REF] [--compression zstd,gzip] [--fast] [--out DIR] [--version V] [--no-build] [--json]
//
// The OCI image of trellis: compiles the binary for each architecture (build/compile.ts), then writes
// an OCI layout (default dist/image/, tagged with the version) holding an image index with one image
// per architecture. Each image has ONE layer holding the binary as /gardener-node-agent (0755) — the
// path Gardener's OperatingSystemConfig names as filePathInImage and install.sh extracts — and the
// config Entrypoint ["/gardener-node-agent"] with version and revision labels. By default the layers
// are zstd -19, and the index lists every image a second time with a gzip -9 layer, after all the zstd
// ones (build/trellis-image.ts releaseCompression): clients take the first entry for their platform,
// install.sh on a machine without `zstd` the last. --compression zstd (or gzip) writes one kind only;
// --fast uses levels 3 (zstd) and 1 (gzip), seconds instead of minutes, for tests. Nothing in it
// depends on the time or the machine (build/oci-layout.ts), so the same binaries give the same digest.
// --push REF copies the whole index with skopeo (plain HTTP only for a registry on localhost).
import { spawnSync } from "node:child_process";
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync } from "node:fs";
import { tmpdir } from "node:os";
import { resolve } from "node:path";
import { parseArgs } from "node:util";
import { type Arch, commandFor, emulatorPackages, hostArch } from "./arch-exec.ts";
import { type Compression, type LayoutOptions, type WrittenImage, writeLayout } from "./oci-layout.ts";
import { fastCompression, releaseCompression, trellisImageSpec } from "./trellis-image.ts";

const bunArch: Record<Arch, "x64" | "arm64"> = { amd64: "x64", arm64: "arm64" };
const root = resolve(new URL("..", import.meta.url).pathname);

const { values } = parseArgs({
  options: {
    arch: { type: "string", default: "amd64" },
    push: { type: "string" },
    compression: { type: "string", default: "zstd,gzip" },
    fast: { type: "boolean", default: false },
    out: { type: "string", default: "dist/image" },
    // Passed to build/compile.ts (a release stamps the version it tags); the labels and the tag are
    // then whatever the built binary reports.
    version: { type: "string" },
    "no-build": { type: "boolean", default: false },
    json: { type: "boolean", default: false },
  },
});

const arches = parseArches(values.arch);
const out = resolve(root, values.out);
const log = values.json ? (...args: unknown[]) => console.error(...args) : (...args: unknown[]) => console.log(...args);

if (!values["no-build"]) {
  const versionFlag = values.version ? ["--version", values.version] : [];
  for (const arch of arches) run(process.execPath, [`${root}/build/compile.ts`, "--arch", bunArch[arch], ...versionFlag], { inherit: true });
}
const binaries = Object.fromEntries(arches.map((a) => [a, binaryPath(a)])) as Record<Arch, string>;
const { version, commit } = buildInfo();

const compression = layoutOptions(values.compression, values.fast);
const specs = arches.map((arch) => trellisImageSpec(arch, readFileSync(binaries[arch]), { version, commit }));
// No blobs of an earlier build left behind; but only ever delete what is an image layout (or nothing).
if (existsSync(out) && readdirSync(out).length > 0 && !existsSync(`${out}/oci-layout`)) fail(`--out ${out} exists and is not an OCI layout; not replacing it`);
rmSync(out, { recursive: true, force: true });
const t0 = performance.now();
const layout = writeLayout(out, version, specs, compression);
const describe = (kind: Compression) => (img: WrittenImage, i: number) => ({
  platform: `linux/${arches[i]}`,
  manifest: img.manifest.digest,
  compression: kind,
  binaryBytes: statSync(binaries[arches[i] as Arch]).size,
  layerBytes: img.layers[0]?.size ?? 0,
});
const images = layout.images.map(describe(compression.compression ?? "gzip"));
const alternatives = compression.alternative ? layout.alternatives.map(describe(compression.alternative.compression)) : [];
const kinds = [compression.compression, compression.alternative?.compression].filter((k) => k).join(" + ");
log(`wrote ${rel(out)} (oci:${rel(out)}:${version}), trellis ${version} commit ${commit}, ${kinds} layers, in ${((performance.now() - t0) / 1000).toFixed(1)} s`);
log(`index ${layout.root.digest}`);
for (const img of [...images, ...alternatives]) {
  log(`  ${img.platform.padEnd(12)} ${img.manifest}  layer ${mib(img.layerBytes)} (${img.compression}) of a ${mib(img.binaryBytes)} binary`);
}

let pushed: string | undefined;
if (values.push) pushed = push(values.push);
if (values.json) {
  console.log(JSON.stringify({ layout: out, tag: version, version, commit, index: layout.root.digest, images, alternatives, ...(pushed ? { pushed } : {}) }));
}

function parseArches(list: string): Arch[] {
  const names: Record<string, Arch> = { amd64: "amd64", x64: "amd64", x86_64: "amd64", arm64: "arm64", aarch64: "arm64" };
  const result: Arch[] = [];
  for (const name of list.split(",").filter((n) => n !== "")) {
    const arch = names[name];
    if (!arch) fail(`--arch: unknown architecture "${name}" (want amd64 and/or arm64)`);
    if (!result.includes(arch)) result.push(arch);
  }
  if (result.length === 0) fail("--arch: no architecture given");
  // amd64 first: the index lists platforms in a fixed order whatever the flag's order, for the digest.
  return result.sort();
}

// "zstd,gzip" (the release's: zstd, with a gzip alternative), "zstd" or "gzip"; --fast lowers the levels.
function layoutOptions(list: string, fast: boolean): LayoutOptions {
  const preset = fast ? fastCompression : releaseCompression;
  const levels: Record<Compression, number | undefined> = {
    zstd: preset.compression === "zstd" ? preset.level : preset.alternative?.level,
    gzip: preset.compression === "gzip" ? preset.level : preset.alternative?.level,
  };
  const kinds = list.split(",").filter((k) => k !== "");
  for (const k of kinds) if (k !== "zstd" && k !== "gzip") fail(`--compression: unknown "${k}" (want zstd and/or gzip, the default layer first)`);
  const [first, second, ...rest] = kinds as Compression[];
  if (!first || rest.length > 0 || first === second) fail(`--compression ${list}: want one or two of zstd, gzip`);
  return { compression: first, level: levels[first], ...(second ? { alternative: { compression: second, level: levels[second] } } : {}) };
}

// Where build/compile.ts puts the binary for `arch` (dist/trellis for the native x64 build).
function binaryPath(arch: Arch): string {
  return `${root}/dist/${arch === hostArch && arch === "amd64" ? "trellis" : `trellis-${bunArch[arch]}`}`;
}

// The labels say what the binaries say about themselves (version --json), so they cannot disagree with
// them even with --no-build; every architecture's binary is asked (another one's through qemu), and
// binaries that disagree (a stale dist/trellis-arm64 beside a fresh dist/trellis) are refused.
function buildInfo(): { version: string; commit: string } {
  const infos = arches.map((arch) => {
    const [cmd, ...args] = commandFor(arch, binaries[arch]);
    const r = spawnSync(cmd as string, [...args, "version", "--json"], { cwd: root, encoding: "utf8" });
    if (r.error || r.status !== 0) {
      const why = r.error ? r.error.message : `exited ${r.status ?? r.signal}: ${r.stderr.trim()}`;
      fail(`running the ${arch} binary ${rel(binaries[arch])} (${commandFor(arch, binaries[arch]).join(" ")}): ${why}${arch === hostArch ? "" : ` (install ${emulatorPackages(arch)})`}`);
    }
    return { arch, ...(JSON.parse(r.stdout) as { version: string; commit: string }) };
  });
  const first = infos[0] as (typeof infos)[number];
  for (const i of infos) {
    if (i.version !== first.version || i.commit !== first.commit) {
      fail(`the ${i.arch} binary is trellis ${i.version} (commit ${i.commit}) but the ${first.arch} one is trellis ${first.version} (commit ${first.commit}): build them from the same tree`);
    }
  }
  return { version: first.version, commit: first.commit };
}

function push(ref: string): string {
  const registry = ref.split("/")[0] ?? "";
  // TLS is verified for every registry except one on this machine (the tests' plain-HTTP registry).
  const local = /^(127\.0\.0\.1|localhost|\[::1\])(:\d+)?$/.test(registry);
  const dir = mkdtempSync(`${tmpdir()}/trellis-push-`);
  try {
    const flags = ["--all", "--preserve-digests", "--digestfile", `${dir}/digest`, ...(local ? ["--dest-tls-verify=false"] : [])];
    run("skopeo", ["copy", ...flags, `oci:${out}:${version}`, `docker://${ref}`], { inherit: true });
    const digest = readFileSync(`${dir}/digest`, "utf8").trim();
    if (digest !== layout.root.digest) fail(`pushed ${ref} but the registry has digest ${digest}, not ${layout.root.digest}`);
    // The reference install.sh wants: name[:tag]@digest.
    const pinned = `${ref.replace(/@sha256:[0-9a-f]{64}$/, "")}@${digest}`;
    log(`pushed ${ref}\nTRELLIS_IMAGE=${pinned}`);
    return pinned;
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

function run(cmd: string, args: string[], opts: { inherit?: boolean } = {}): string {
  const r = spawnSync(cmd, args, { cwd: root, encoding: "utf8", stdio: ["ignore", opts.inherit ? (values.json ? 2 : "inherit") : "pipe", "inherit"] });
  if (r.error) fail(`${cmd}: ${r.error.message}`);
  if (r.status !== 0) fail(`${cmd} ${args.join(" ")} exited ${r.status ?? r.signal}`);
  return r.stdout ?? "";
}

function fail(message: string): never {
  console.error(`image: ${message}`);
  process.exit(1);
}

function rel(path: string): string {
  return path.startsWith(`${root}/`) ? path.slice(root.length + 1) : path;
}

function mib(bytes: number): string {
  return `${(bytes / 2 ** 20).toFixed(1)} MiB`;
}
