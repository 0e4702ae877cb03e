// install.sh travels in every machine's user data (next to the kubelet's and the agent's own settings,
// under limits like EC2's 16 KiB): it must stay small, and be plain POSIX sh, as run by dash.
// What it does is tested on real nodes in test/e2e/install.test.ts.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from "node:fs";
import { dirname } from "node:path";
import { repoRoot } from "../harness/binary.ts";
import { run, runOk } from "../harness/exec.ts";

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

// A machine that cannot run trellis (musl, or a glibc older than the binaries need: test/e2e/glibc.test.ts)
// is refused before anything is installed, rather than left with a unit that crash-loops. The script runs
// unchanged, in a mount namespace where the machine's dynamic loader is replaced (or gone); everything in
// it is the static busybox, which needs no loader. The unit directory and /opt are private tmpfs there and
// systemctl a recorder, so a script that passes the check installs nothing on this machine.
describe("install.sh refuses a machine whose C library cannot run trellis, before installing its unit", () => {
  const loader = process.arch === "arm64" ? "/lib/ld-linux-aarch64.so.1" : "/lib64/ld-linux-x86-64.so.2";
  const image = `registry.example.invalid/trellis/agent:1@sha256:${"a".repeat(64)}`;
  let dir: string;
  beforeAll(async () => {
    dir = mkdtempSync("/tmp/trellis-install-libc-");
    mkdirSync(`${dir}/bin`);
    await runOk(["busybox", "--install", "-s", `${dir}/bin`]);
    writeFileSync(`${dir}/bin/systemctl`, `#!/usr/bin/busybox sh\necho "$*" >>${dir}/systemctl-calls\n`, { mode: 0o755 });
  });
  afterAll(() => rmSync(dir, { recursive: true, force: true }));

  /** install.sh as cloud-init runs it, with the loader `replace`d (a script, or nothing at all). */
  async function installWith(name: string, replace: { script: string } | "absent" | "real") {
    rmSync(`${dir}/systemctl-calls`, { force: true });
    const config = `${dir}/${name}`;
    let setup = "";
    if (replace === "absent") setup = `mount -t tmpfs none ${dirname(loader)}`;
    else if (replace !== "real") {
      writeFileSync(`${dir}/${name}.ld`, `#!/usr/bin/busybox sh\n${replace.script}\n`, { mode: 0o755 });
      setup = `mount --bind ${dir}/${name}.ld ${loader}`;
    }
    const script = `mount -t tmpfs none /etc/systemd/system && mount -t tmpfs none /opt && ${setup || "true"} && exec sh ${path}`;
    const r = await run(["busybox", "unshare", "-m", "--propagation", "private", "busybox", "sh", "-c", script], {
      env: { PATH: `${dir}/bin`, TRELLIS_IMAGE: image, TRELLIS_CONFIG_DIR: config },
    });
    const calls = existsSync(`${dir}/systemctl-calls`) ? readFileSync(`${dir}/systemctl-calls`, "utf8") : "";
    return { ...r, calls, initScript: existsSync(`${config}/init.sh`) };
  }

  test.each([
    ["glibc 2.12", { script: "echo 'ld.so (GNU libc) stable release version 2.12, by Roland McGrath et al.'" }, "found 2.12"],
    ["musl (its loader answers --version with an error)", { script: "echo 'musl libc (x86_64)' >&2; echo 'Version 1.2.4' >&2; exit 1" }, "found none (musl?)"],
    ["no glibc loader at all", "absent" as const, "found none (musl?)"],
  ])("%s: stops with the reason, writes no unit, starts nothing", async (name, replace, found) => {
    const r = await installWith(name.replace(/\W+/g, "-"), replace);
    expect(r.code).toBe(1);
    expect(r.stdout.trim()).toBe(`trellis-install: error: trellis needs glibc >= 2.17 (${loader}), ${found}`);
    expect({ calls: r.calls, initScript: r.initScript }).toEqual({ calls: "", initScript: false });
  });

  test.each([
    ["glibc 2.17, the oldest it runs on", { script: "echo 'ld.so (GNU libc) stable release version 2.17, by Roland McGrath et al.'" }],
    ["this machine's glibc", "real" as const],
  ])("%s: goes on to install and start the init unit", async (name, replace) => {
    const r = await installWith(name.replace(/\W+/g, "-"), replace);
    expect({ code: r.code, stdout: r.stdout, calls: r.calls, initScript: r.initScript }).toEqual({
      code: 0,
      stdout: "trellis-install: started gardener-node-init.service\n",
      calls: "daemon-reload\n-q enable --now --no-block gardener-node-init.service\n",
      initScript: true,
    });
  });
});
