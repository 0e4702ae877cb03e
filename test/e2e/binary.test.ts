// The shipped artifact: one self-contained executable per architecture that knows what it is.
import { expect, test } from "bun:test";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import pkg from "../../package.json" with { type: "json" };
import { repoRoot, trellisBinary } from "../harness/binary.ts";
import { run, runOk } from "../harness/exec.ts";

test("`trellis version` prints the package version and the git commit it was built from", async () => {
  // Built here, so that the commit is this checkout's HEAD whatever dist/ holds.
  const bin = `${repoRoot}/dist/trellis-version-test`;
  await runOk(["bun", "run", "build", "--", "--outfile", "dist/trellis-version-test"], { cwd: repoRoot, timeoutMs: 300_000 });
  const head = (await runOk(["git", "rev-parse", "HEAD"], { cwd: repoRoot })).trim();
  const out = JSON.parse(await runOk([bin, "version", "--json"]));
  expect(out.version).toBe(pkg.version);
  expect(out.commit).toStartWith(head);
  expect(out.runtime).toBe(`bun ${pkg.devDependencies.bun}`);
  expect(await runOk([bin, "version"])).toStartWith(`trellis ${pkg.version} (commit ${head}`);
  rmSync(bin);
}, 300_000);

test("the binary runs with no node_modules or sources around it", async () => {
  const bin = await trellisBinary();
  const r = await run([bin, "version"], { cwd: "/", env: { PATH: "/usr/bin:/bin" } });
  expect(r.code).toBe(0);
});

test("an unknown command prints the usage and exits 2", async () => {
  const r = await run([await trellisBinary(), "frobnicate"]);
  expect(r.code).toBe(2);
  expect(r.stderr).toContain('unknown command "frobnicate"');
  expect(r.stderr).toContain("usage: trellis <command>");
});

test("`trellis run` with a bad configuration exits 1 naming the file and the field", async () => {
  const dir = mkdtempSync("/tmp/trellis-badconfig-");
  writeFileSync(
    `${dir}/config.yaml`,
    "apiVersion: nodeagent.config.gardener.cloud/v1alpha1\nkind: NodeAgentConfiguration\ncontrollers:\n  operatingSystemConfig: {kubernetesVersion: 1.35.4, syncPeriod: 5s}\n",
  );
  const r = await run([await trellisBinary(), "run", "--config-dir", dir]);
  expect(r.code).toBe(1);
  expect(r.stderr).toContain(`${dir}/config.yaml: controllers.operatingSystemConfig.secretName`);
  expect(r.stderr).toContain(`${dir}/config.yaml: controllers.operatingSystemConfig.syncPeriod: must be at least 15s`);
});
