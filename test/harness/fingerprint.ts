import { createHash } from "node:crypto";
import { lstatSync, readdirSync, readFileSync, readlinkSync } from "node:fs";

/** Every entry under `dir` with its kind, mode, owner and content (or link target): a tree's fingerprint. */
export function fingerprint(dir: string): string[] {
  const out: string[] = [];
  const walk = (rel: string) => {
    for (const name of readdirSync(`${dir}${rel}`).sort()) {
      const p = `${rel}/${name}`;
      const st = lstatSync(`${dir}${p}`);
      const what = st.isSymbolicLink() ? `-> ${readlinkSync(`${dir}${p}`)}` : st.isFile() ? createHash("sha256").update(readFileSync(`${dir}${p}`)).digest("hex") : "";
      out.push(`${p} ${st.mode.toString(8)} ${st.uid} ${what}`);
      if (st.isDirectory()) walk(p);
    }
  };
  walk("");
  return out;
}
