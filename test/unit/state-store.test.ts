// src/apply/state-store.ts over a temporary root: the temp files an agent killed mid-write left in its
// own directories are removed at its next start (found by test/chaos/scenarios/agent-kill9.ts: a kill
// during a write of state.json left its temp file there for good, one more with every such kill).
import { expect, test } from "bun:test";
import { mkdirSync, mkdtempSync, readdirSync, writeFileSync } from "node:fs";
import { createStateStore, removeLeftoverTemp } from "../../src/apply/state-store.ts";
import { emptyState } from "../../src/api/state.ts";
import { createFiles } from "../../src/host/files.ts";
import { runDir } from "../harness/exec.ts";

test("temp files of a killed agent in its own directories are removed, everything else stays", async () => {
  const root = mkdtempSync(`${runDir("state-store-unit")}/root-`);
  const files = createFiles(root);
  await createStateStore(files).write(emptyState());
  // Writers that are gone (a live one's temp file stays: test/integration/state-lock.test.ts).
  const [a, b] = [Bun.spawnSync(["true"]).pid, Bun.spawnSync(["true"]).pid];
  const leftovers = [
    `/var/lib/gardener-node-agent/trellis/.state.json.trellis-tmp-${a}-bc85bc765b47`,
    `/var/lib/gardener-node-agent/.last-applied-osc.yaml.trellis-tmp-${b}-0123456789ab`,
    `/var/lib/gardener-node-agent/credentials/.token.trellis-tmp-${b}-0123456789ab`,
    `/run/trellis/.status.json.trellis-tmp-${b}-0123456789ab`,
  ];
  const kept = ["/var/lib/gardener-node-agent/config.yaml", "/var/lib/gardener-node-agent/trellis/.notes.tmp"];
  for (const p of [...leftovers, ...kept]) {
    mkdirSync(`${root}${p.slice(0, p.lastIndexOf("/"))}`, { recursive: true });
    writeFileSync(`${root}${p}`, "partial");
  }

  expect((await removeLeftoverTemp(files)).sort()).toEqual([...leftovers].sort());
  expect(readdirSync(`${root}/var/lib/gardener-node-agent/trellis`).sort()).toEqual([".notes.tmp", "state.json"]);
  expect(readdirSync(`${root}/var/lib/gardener-node-agent`).sort()).toEqual(["config.yaml", "credentials", "trellis"]);
  expect(readdirSync(`${root}/run/trellis`)).toEqual([]);
  expect(await removeLeftoverTemp(files)).toEqual([]);
});
