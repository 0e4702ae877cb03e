// install.sh travels in every machine's user data (next to the kubelet's and the agent's own settings,
// under limits like EC2's 16 KiB): it must stay small, and be plain POSIX sh, as run by dash.
// What it does is tested on real nodes in test/e2e/install.test.ts.
import { expect, test } from "bun:test";
import { readFileSync, statSync } from "node:fs";
import { repoRoot } from "../harness/binary.ts";
import { run } from "../harness/exec.ts";

const path = `${repoRoot}/install.sh`;
const script = readFileSync(path, "utf8");

test("install.sh is smaller than 5 KiB", () => {
  expect(Buffer.byteLength(script)).toBeLessThan(5120);
});

test("install.sh parses as POSIX sh (dash -n) and as bash --posix", async () => {
  for (const shell of [["dash", "-n"], ["bash", "--posix", "-n"]]) {
    const r = await run([...shell, path]);
    expect({ shell: shell[0], ...r }).toEqual({ shell: shell[0], code: 0, stdout: "", stderr: "" });
  }
});

test("install.sh is a /bin/sh script, executable, ASCII only (it is pasted into user data)", () => {
  expect(script).toStartWith("#!/bin/sh\n");
  expect(statSync(path).mode & 0o111).toBe(0o111);
  expect(/^[\x09\x0a\x20-\x7e]*$/.test(script)).toBe(true);
});

test("every setting sits at the top with its default, and the environment overrides it", () => {
  const settings = [...script.matchAll(/"\$\{(TRELLIS_[A-Z0-9_]+):?=([^}]*)\}"/g)].map((m) => [m[1], m[2]]);
  expect(Object.fromEntries(settings)).toEqual({
    TRELLIS_IMAGE: "",
    TRELLIS_URL: "",
    TRELLIS_SHA256: "",
    TRELLIS_HOSTS_DIR: "/etc/containerd/certs.d",
    TRELLIS_CONFIG_DIR: "/var/lib/gardener-node-agent",
  });
  // Only assignments that keep a value the environment already has (no plain TRELLIS_X=... anywhere).
  expect(script).not.toMatch(/^\s*TRELLIS_[A-Z0-9_]+=/m);
  // The settings are all that the rest of the script reads from outside.
  const used = new Set([...script.matchAll(/\$\{?(TRELLIS_[A-Z0-9_]+)/g)].map((m) => m[1]));
  expect([...used].sort()).toEqual(settings.map((s) => s[0]).sort());
});

test("no bash-isms, no jq: [[ ]], arrays, local, source, ==, <<<, $'…' and pipefail are not in dash", () => {
  const code = script
    .split("\n")
    .filter((l) => !/^\s*#/.test(l))
    .join("\n");
  for (const bashism of [/\[\[/, /\blocal\s/, /^\s*source\s/m, /\s==\s/, /<<</, /\$'/, /pipefail/, /\bjq\b/, /\bdeclare\b/, /\w+=\(/]) {
    expect({ bashism: String(bashism), found: bashism.test(code) }).toEqual({ bashism: String(bashism), found: false });
  }
});
