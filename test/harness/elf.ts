// What a dynamically linked ELF executable asks of the machine, read from the file itself (no readelf on
// the test machines): the program interpreter (PT_INTERP), the libraries it links (DT_NEEDED in the
// SHT_DYNAMIC section) and the symbol versions it needs from each (the .gnu.version_r section,
// SHT_GNU_verneed). 64-bit little-endian only: what both of trellis's architectures (x86-64, aarch64) are.
import { closeSync, openSync, readSync } from "node:fs";

export type ElfNeeds = {
  /** The dynamic loader the kernel starts the program with, e.g. /lib64/ld-linux-x86-64.so.2. */
  interpreter: string | undefined;
  /** The shared libraries it is linked against, in order. */
  needed: string[];
  /** Per library (libc.so.6 …) the version names it needs (GLIBC_2.17 …), as the file lists them. */
  versions: Record<string, string[]>;
};

const ptInterp = 3;
const shtDynamic = 6;
const shtGnuVerneed = 0x6ffffffe;
const dtNeeded = 1n;

export function readElfNeeds(path: string): ElfNeeds {
  const fd = openSync(path, "r");
  try {
    const at = (offset: number, length: number) => {
      const buf = Buffer.alloc(length);
      const n = readSync(fd, buf, 0, length, offset);
      if (n !== length) throw new Error(`${path}: ends at ${offset + n}, ${length} bytes wanted at ${offset}`);
      return buf;
    };
    const header = at(0, 64);
    if (header.readUInt32BE(0) !== 0x7f454c46) throw new Error(`${path}: not an ELF file`);
    if (header[4] !== 2 || header[5] !== 1) throw new Error(`${path}: not a 64-bit little-endian ELF file`);
    const num = (b: Buffer, o: number) => Number(b.readBigUInt64LE(o));
    const [phoff, phentsize, phnum] = [num(header, 32), header.readUInt16LE(54), header.readUInt16LE(56)];
    const [shoff, shentsize, shnum] = [num(header, 40), header.readUInt16LE(58), header.readUInt16LE(60)];

    let interpreter: string | undefined;
    for (let i = 0; i < phnum; i++) {
      const ph = at(phoff + i * phentsize, phentsize);
      if (ph.readUInt32LE(0) === ptInterp) interpreter = cString(at(num(ph, 8), num(ph, 32)), 0);
    }

    const sections = Array.from({ length: shnum }, (_, i) => {
      const sh = at(shoff + i * shentsize, shentsize);
      return { type: sh.readUInt32LE(4), offset: num(sh, 24), size: num(sh, 32), link: sh.readUInt32LE(40), info: sh.readUInt32LE(44) };
    });
    const withStrings = (s: (typeof sections)[number]) => {
      const table = sections[s.link];
      if (!table) throw new Error(`${path}: a section of type ${s.type} links to section ${s.link}, which does not exist`);
      return [at(s.offset, s.size), at(table.offset, table.size)] as const;
    };
    const needed: string[] = [];
    for (const s of sections.filter((x) => x.type === shtDynamic)) {
      const [data, strings] = withStrings(s);
      // Elf64_Dyn {d_tag, d_val}, 16 bytes each.
      for (let o = 0; o + 16 <= data.length; o += 16) if (data.readBigInt64LE(o) === dtNeeded) needed.push(cString(strings, num(data, o + 8)));
    }
    const versions: Record<string, string[]> = {};
    for (const s of sections.filter((x) => x.type === shtGnuVerneed)) {
      const [data, strings] = withStrings(s);
      // sh_info entries of Verneed {vn_version, vn_cnt, vn_file, vn_aux, vn_next}, each with vn_cnt
      // Vernaux {vna_hash, vna_flags, vna_other, vna_name, vna_next}; offsets relative to the entry.
      for (let n = 0, need = 0; n < s.info; n++) {
        const [count, file, aux, next] = [data.readUInt16LE(need + 2), data.readUInt32LE(need + 4), data.readUInt32LE(need + 8), data.readUInt32LE(need + 12)];
        const names: string[] = [];
        for (let k = 0, entry = need + aux; k < count; k++) {
          names.push(cString(strings, data.readUInt32LE(entry + 8)));
          entry += data.readUInt32LE(entry + 12);
        }
        versions[cString(strings, file)] = names;
        need += next;
      }
    }
    return { interpreter, needed, versions };
  } finally {
    closeSync(fd);
  }
}

function cString(buf: Buffer, offset: number): string {
  const end = buf.indexOf(0, offset);
  return buf.toString("latin1", offset, end < 0 ? buf.length : end);
}

/** The highest GLIBC_x.y[.z] version among `names` (numerically: 2.17 above 2.3.4), or undefined. */
export function highestGlibc(names: string[]): string | undefined {
  const parsed = names.flatMap((n) => {
    const m = /^GLIBC_(\d+(?:\.\d+)+)$/.exec(n);
    return m ? [m[1] as string] : [];
  });
  return parsed.sort(compareVersions).at(-1);
}

/** Dotted numeric versions compared part by part ("2.17" > "2.3.4"). */
export function compareVersions(a: string, b: string): number {
  const [x, y] = [a.split(".").map(Number), b.split(".").map(Number)];
  for (let i = 0; i < Math.max(x.length, y.length); i++) {
    const d = (x[i] ?? 0) - (y[i] ?? 0);
    if (d !== 0) return d;
  }
  return 0;
}
