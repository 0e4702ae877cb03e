// The record install.sh leaves in <config dir>/init-installed, as bootstrap reads it (src/cli/installed-binary.ts);
// what bootstrap does with it is tested on real nodes (test/e2e/node-from-nothing.test.ts).
import { expect, test } from "bun:test";
import { parseInstallRecord } from "../../src/cli/installed-binary.ts";

const hex = (c: string) => c.repeat(64);

test("an image install: the digest it was given, the binary's sha256, the platform manifest it took", () => {
  expect(parseInstallRecord(`${hex("a")} ${hex("b")} sha256:${hex("c")}\n`)).toEqual({ digest: `sha256:${hex("a")}`, sha256: hex("b"), manifest: `sha256:${hex("c")}` });
});

test("no manifest named (a TRELLIS_URL install, or an older install.sh's record), or anything else: nothing to take", () => {
  for (const text of [`${hex("a")} ${hex("b")} \n`, `${hex("a")} ${hex("b")}\n`, "", "garbage\n", `${hex("a")} ${hex("b")} sha256:${hex("c")} extra\n`, `${hex("A")} ${hex("b")} sha256:${hex("c")}\n`]) {
    expect({ text, record: parseInstallRecord(text) }).toEqual({ text, record: undefined });
  }
});
