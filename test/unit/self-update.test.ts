// src/apply/self-update.ts with real executables in a temporary root: an OSC that replaces the agent's
// binary or its configuration is accepted only when the agent it leaves starts with the configuration
// it will find.
import { describe, expect, test } from "bun:test";
import { mkdtempSync, readdirSync } from "node:fs";
import { sha256Hex, type Desired, type DesiredFile } from "../../src/api/desired.ts";
import { checkSelfUpdate } from "../../src/apply/self-update.ts";
import { createFiles } from "../../src/host/files.ts";
import { createLogger } from "../../src/log.ts";
import { runDir } from "../harness/exec.ts";

const base = runDir("self-update-unit");
const selfBinary = "/opt/bin/gardener-node-agent";
const configDir = "/var/lib/gardener-node-agent";

// A stand-in agent: `check-config --config-dir D` succeeds when D holds config-v2.yaml saying "ok".
const newAgent = `#!/bin/sh
[ "$1" = check-config ] || exit 2
grep -q ok "$3/config-v2.yaml" 2>/dev/null && exit 0
echo "no usable config-v2.yaml in $3" >&2
exit 1
`;

function fileOf(path: string, content: string, mode = 0o644): DesiredFile {
  const bytes = new TextEncoder().encode(content);
  return { path, mode, content: bytes, sha256: sha256Hex(bytes), origin: `spec.files (${path})` };
}
const desiredWith = (files: DesiredFile[]): Desired => ({ units: [], files, unsupported: [], keep: [] });

async function setup() {
  const root = mkdtempSync(`${base}/root-`);
  const files = createFiles(root);
  await files.writeAtomic(selfBinary, "#!/bin/sh\necho old\n", 0o755);
  await files.writeAtomic(`${configDir}/config.yaml`, "old format\n", 0o600);
  return { root, files, check: { files, selfBinary, configDir } };
}

describe("checking a new agent binary or configuration before installing it", () => {
  test("an OSC that does not touch the agent's binary needs no check", async () => {
    const { check } = await setup();
    expect(await checkSelfUpdate(desiredWith([fileOf("/etc/x", "x")]), check)).toBeUndefined();
  });

  test("the same binary again needs no check", async () => {
    const { check } = await setup();
    expect(await checkSelfUpdate(desiredWith([fileOf(selfBinary, "#!/bin/sh\necho old\n", 0o755)]), check)).toBeUndefined();
  });

  test("a new binary whose config file the OSC brings along is accepted", async () => {
    const { check } = await setup();
    const desired = desiredWith([fileOf(selfBinary, newAgent, 0o755), fileOf(`${configDir}/config-v2.yaml`, "ok\n", 0o600)]);
    expect(await checkSelfUpdate(desired, check)).toBeUndefined();
  });

  test("a config file already on the node counts too", async () => {
    const { files, check } = await setup();
    await files.writeAtomic(`${configDir}/config-v2.yaml`, "ok\n", 0o600);
    expect(await checkSelfUpdate(desiredWith([fileOf(selfBinary, newAgent, 0o755)]), check)).toBeUndefined();
  });

  test("a new binary that cannot read the configuration is refused, saying which file and why", async () => {
    const { check } = await setup();
    const problem = await checkSelfUpdate(desiredWith([fileOf(selfBinary, newAgent, 0o755)]), check);
    expect(problem).toContain(`spec.files (${selfBinary}): the new agent binary`);
    expect(problem).toContain("no usable config-v2.yaml");
  });

  test("the binary trellis installed there itself is not checked (or hashed) again", async () => {
    const { check } = await setup();
    const desired = desiredWith([fileOf(selfBinary, newAgent, 0o755)]);
    expect(await checkSelfUpdate(desired, { ...check, installed: sha256Hex(newAgent) })).toBeUndefined();
  });

  test("a binary that does not run at all is refused", async () => {
    const { check } = await setup();
    const problem = await checkSelfUpdate(desiredWith([fileOf(selfBinary, "\x7fELF garbage", 0o755)]), check);
    expect(problem).toContain("cannot start");
  });

  test("a configuration the running agent cannot read is refused, naming the config file", async () => {
    const { files, check } = await setup();
    await files.writeAtomic(selfBinary, newAgent, 0o755);
    const problem = await checkSelfUpdate(desiredWith([fileOf(`${configDir}/config-v2.yaml`, "a format it does not know\n", 0o600)]), check);
    expect(problem).toContain(`spec.files (${configDir}/config-v2.yaml): the agent cannot start with the configuration this OSC writes`);
    expect(problem).toContain("no usable config-v2.yaml");
  });

  test("a configuration the running agent reads is accepted, and an unchanged one is not checked", async () => {
    const { files, check } = await setup();
    await files.writeAtomic(selfBinary, newAgent, 0o755);
    expect(await checkSelfUpdate(desiredWith([fileOf(`${configDir}/config-v2.yaml`, "ok\n", 0o600)]), check)).toBeUndefined();
    // On the node already: not even the (here unreadable) old config.yaml is looked at again.
    await files.writeAtomic(`${configDir}/config-v2.yaml`, "broken\n", 0o600);
    expect(await checkSelfUpdate(desiredWith([fileOf(`${configDir}/config-v2.yaml`, "broken\n", 0o600)]), check)).toBeUndefined();
  });

  // gardener-node-agent v1.150.0's command line (cobra): no check-config or version command, --version prints its version.
  const otherAgent = `#!/bin/sh
case "$1" in
--version) echo "Kubernetes v1.150.0" ;;
*) echo "Error: unknown command \"$1\" for \"gardener-node-agent\"" >&2; exit 1 ;;
esac
`;

  test("another agent (going back to gardener-node-agent) is installed once it starts here, and the log says its configuration was not checked", async () => {
    const { check } = await setup();
    const lines: string[] = [];
    const log = createLogger({ level: "info", write: (line) => lines.push(line) });
    expect(await checkSelfUpdate(desiredWith([fileOf(selfBinary, otherAgent, 0o755)]), { ...check, log })).toBeUndefined();
    expect(lines.map((l) => JSON.parse(l))).toContainEqual(
      expect.objectContaining({ msg: "the new agent binary is not trellis: it starts on this machine, its configuration cannot be checked", version: "Kubernetes v1.150.0", sha256: sha256Hex(otherAgent) }),
    );
  });

  test("another agent that does not start here is refused", async () => {
    const { check } = await setup();
    const problem = await checkSelfUpdate(desiredWith([fileOf(selfBinary, otherAgent.replace("--version)", "--never)"), 0o755)]), check);
    expect(problem).toContain(`spec.files (${selfBinary}): the new agent binary`);
  });

  test("a trellis binary whose check-config fails is refused, though it would print a version", async () => {
    const { check } = await setup();
    const trellisLike = `#!/bin/sh
case "$1" in
version) echo '{"version":"9.9.9","commit":"abc"}' ;;
--version) echo "trellis 9.9.9" ;;
*) echo "config-v2.yaml: not readable" >&2; exit 1 ;;
esac
`;
    const problem = await checkSelfUpdate(desiredWith([fileOf(selfBinary, trellisLike, 0o755)]), check);
    expect(problem).toContain("cannot start with this node's configuration");
    expect(problem).toContain("config-v2.yaml: not readable");
  });

  test("the check leaves nothing behind", async () => {
    const { root, check } = await setup();
    await checkSelfUpdate(desiredWith([fileOf(selfBinary, newAgent, 0o755)]), check);
    expect(readdirSync(`${root}/var/lib/gardener-node-agent/tmp`)).toEqual([]);
  });
});
