// The ELF reader the glibc test (test/e2e/glibc.test.ts) reads trellis's binaries with, on an ELF file
// written here field by field: the interpreter, the libraries linked, the version needs of two libraries
// chained through vn_next and vna_next, and the highest GLIBC_ version compared as numbers.
import { afterAll, describe, expect, test } from "bun:test";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { compareVersions, highestGlibc, readElfNeeds } from "../harness/elf.ts";

const dir = mkdtempSync("/tmp/trellis-elf-");
afterAll(() => rmSync(dir, { recursive: true, force: true }));

/** A 64-bit little-endian ELF with PT_INTERP, .dynstr, .gnu.version_r and .dynamic, nothing else. */
function elf(interpreter: string, needs: Record<string, string[]>): Buffer {
  const names = Object.keys(needs);
  const strings = ["", ...names, ...Object.values(needs).flat()];
  const strtab = Buffer.from(`${strings.join("\0")}\0`, "latin1");
  const str = (s: string) => strtab.indexOf(Buffer.from(`\0${s}\0`, "latin1")) + 1;
  const verneed = Buffer.concat(
    names.map((lib, i) => {
      const versions = needs[lib] ?? [];
      const entry = Buffer.alloc(16 + 16 * versions.length);
      entry.writeUInt16LE(1, 0);
      entry.writeUInt16LE(versions.length, 2);
      entry.writeUInt32LE(str(lib), 4);
      entry.writeUInt32LE(16, 8);
      entry.writeUInt32LE(i === names.length - 1 ? 0 : entry.length, 12);
      versions.forEach((v, k) => {
        entry.writeUInt32LE(str(v), 16 + 16 * k + 8);
        entry.writeUInt32LE(k === versions.length - 1 ? 0 : 16, 16 + 16 * k + 12);
      });
      return entry;
    }),
  );
  const dynamic = Buffer.alloc(16 * (names.length + 1)); // ends with DT_NULL
  names.forEach((lib, i) => {
    dynamic.writeBigInt64LE(1n, 16 * i);
    dynamic.writeBigUInt64LE(BigInt(str(lib)), 16 * i + 8);
  });
  const interp = Buffer.from(`${interpreter}\0`, "latin1");
  const [phoff, interpOff] = [64, 120];
  const strOff = interpOff + interp.length;
  const verOff = strOff + strtab.length;
  const dynOff = verOff + verneed.length;
  const shoff = dynOff + dynamic.length;
  const header = Buffer.alloc(64);
  Buffer.from([0x7f, 0x45, 0x4c, 0x46, 2, 1, 1]).copy(header);
  header.writeBigUInt64LE(BigInt(phoff), 32);
  header.writeBigUInt64LE(BigInt(shoff), 40);
  header.writeUInt16LE(56, 54);
  header.writeUInt16LE(1, 56);
  header.writeUInt16LE(64, 58);
  header.writeUInt16LE(4, 60);
  const ph = Buffer.alloc(56);
  ph.writeUInt32LE(3, 0);
  ph.writeBigUInt64LE(BigInt(interpOff), 8);
  ph.writeBigUInt64LE(BigInt(interp.length), 32);
  const section = (type: number, offset: number, size: number, link: number, info: number) => {
    const sh = Buffer.alloc(64);
    sh.writeUInt32LE(type, 4);
    sh.writeBigUInt64LE(BigInt(offset), 24);
    sh.writeBigUInt64LE(BigInt(size), 32);
    sh.writeUInt32LE(link, 40);
    sh.writeUInt32LE(info, 44);
    return sh;
  };
  return Buffer.concat([
    header,
    ph,
    interp,
    strtab,
    verneed,
    dynamic,
    section(0, 0, 0, 0, 0),
    section(3, strOff, strtab.length, 0, 0),
    section(0x6ffffffe, verOff, verneed.length, 1, names.length),
    section(6, dynOff, dynamic.length, 1, 0),
  ]);
}

describe("readElfNeeds", () => {
  test("the interpreter, the libraries linked and each one's version needs, as the file lists them", () => {
    const needs = { "libc.so.6": ["GLIBC_2.2.5", "GLIBC_2.17", "GLIBC_2.3.4"], "libm.so.6": ["GLIBC_2.29"] };
    writeFileSync(`${dir}/two`, elf("/lib/ld-test.so.1", needs));
    expect(readElfNeeds(`${dir}/two`)).toEqual({ interpreter: "/lib/ld-test.so.1", needed: ["libc.so.6", "libm.so.6"], versions: needs });
  });

  test("a file that is not a 64-bit little-endian ELF is an error naming it", () => {
    writeFileSync(`${dir}/script`, "#!/bin/sh\necho hello, this is long enough to hold an ELF header's sixty-four bytes\n");
    expect(() => readElfNeeds(`${dir}/script`)).toThrow(`${dir}/script: not an ELF file`);
    const elf32 = elf("/lib/ld.so", {});
    elf32[4] = 1;
    writeFileSync(`${dir}/elf32`, elf32);
    expect(() => readElfNeeds(`${dir}/elf32`)).toThrow("not a 64-bit little-endian ELF file");
  });
});

describe("highestGlibc", () => {
  test.each([
    [["GLIBC_2.2.5", "GLIBC_2.17", "GLIBC_2.3.4"], "2.17"],
    [["GLIBC_2.9", "GLIBC_2.10"], "2.10"],
    [["GLIBC_PRIVATE", "GCC_3.0", "GLIBC_2.3"], "2.3"],
    [["GCC_3.0"], undefined],
  ])("%j → %p", (names, highest) => {
    expect(highestGlibc(names)).toBe(highest);
  });

  test("versions compare part by part as numbers", () => {
    expect(compareVersions("2.17", "2.3.4")).toBeGreaterThan(0);
    expect(compareVersions("2.3", "2.3.0")).toBe(0);
    expect(compareVersions("2.2.5", "2.3")).toBeLessThan(0);
  });
});
