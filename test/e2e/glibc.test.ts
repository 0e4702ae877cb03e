// What a node OS must have for trellis: `bun build --compile` links the executable dynamically against
// glibc (gardener-node-agent is a static Go binary and needs nothing). Both architectures' binaries, read
// as ELF files (test/harness/elf.ts): they link only glibc's own libraries, through the loader install.sh
// checks, and need no symbol version newer than the glibc install.sh requires, which
// docs/gardener-landscape.md states. A Bun upgrade that needs a newer glibc fails here, not on a node.
import { describe, expect, test } from "bun:test";
import { readFileSync } from "node:fs";
import { repoRoot, trellisArm64Binary, trellisBinary } from "../harness/binary.ts";
import { compareVersions, highestGlibc, readElfNeeds } from "../harness/elf.ts";

const script = readFileSync(`${repoRoot}/install.sh`, "utf8");
const doc = readFileSync(`${repoRoot}/docs/gardener-landscape.md`, "utf8");
/** What install.sh requires: glibc 2.<minor> at the loader of the machine's architecture. */
const required = {
  version: /die "trellis needs glibc >= (2\.\d+) /.exec(script)?.[1],
  minor: /\[ "\$\{g:-0\}" -ge (\d+) \]/.exec(script)?.[1],
  x64: /^l=(\/\S+);/m.exec(script)?.[1],
  arm64: /= aarch64 \] && l=(\/\S+)$/m.exec(script)?.[1],
};
// glibc's libraries (Bun links these; libstdc++, libgcc_s or libz would be more that the node OS must have).
const glibcLibraries = /^(libc\.so\.6|libm\.so\.6|libdl\.so\.2|libpthread\.so\.0|librt\.so\.1|ld-linux-(x86-64\.so\.2|aarch64\.so\.1))$/;

describe("trellis's binaries need glibc, no newer than install.sh checks for", () => {
  test("install.sh states one minimum, and docs/gardener-landscape.md the same", () => {
    expect(required.version).toBe(`2.${required.minor}`);
    expect(doc).toContain(`glibc ${required.version}`);
    expect(doc).toContain(`GLIBC_${required.version}`);
  });

  test.each([
    ["x64", trellisBinary],
    ["arm64", trellisArm64Binary],
  ] as const)("%s: glibc's libraries only, through the loader install.sh asks, symbols up to the version it requires", async (arch, build) => {
    const needs = readElfNeeds(await build());
    expect(needs.interpreter).toBe(required[arch]);
    expect(needs.needed.filter((lib) => !glibcLibraries.test(lib))).toEqual([]);
    expect(needs.needed).toContain("libc.so.6");
    const highest = highestGlibc(Object.values(needs.versions).flat());
    console.log(`${arch}: ${needs.interpreter}, ${needs.needed.join(" ")}; highest symbol version GLIBC_${highest} (install.sh requires ${required.version})`);
    expect(highest).toBeDefined();
    expect(compareVersions(highest as string, required.version as string)).toBeLessThanOrEqual(0);
  }, 600_000);
});
