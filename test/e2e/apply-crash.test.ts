// kill -9 of `trellis apply` at many moments of a large apply inside a real node: no file is ever
// torn, the state file always parses, and the next apply finishes the work — including the restarts
// the killed apply still owed, and a unit's drop-in directory whose removal the kill cut short.
import { afterAll, beforeAll, expect, test } from "bun:test";
import { createHash } from "node:crypto";
import { stringify } from "yaml";
import { trellisBinary } from "../harness/binary.ts";
import { bootNode, type Node } from "../harness/node.ts";

let node: Node;
beforeAll(async () => {
  node = await bootNode("crash");
  await node.install(await trellisBinary(), "/opt/bin/trellis");
}, 60_000);
afterAll(async () => {
  await node?.stop();
});

const fileCount = 300;
// 300 files of ~3 KB: an OSC of ~0.9 MB, within what a Secret carries (trellis refuses more than 1 MiB).
const content = (i: number, version: number) => `file ${i} version ${version}\n${"x".repeat(3000)}\n`;
const sha = (s: string) => createHash("sha256").update(s).digest("hex");

function osc(version: number) {
  return {
    apiVersion: "extensions.gardener.cloud/v1alpha1",
    kind: "OperatingSystemConfig",
    spec: {
      units: [
        {
          name: "sleeper.service",
          command: "start",
          // Records which content of the file it lists it started with: the invariant under test.
          // The sweep restarts it dozens of times in seconds: beyond systemd's default start limit.
          content: `[Unit]\nStartLimitIntervalSec=0\n[Service]\nExecStart=/bin/sh -c 'sha256sum < /etc/crash/f${fileCount - 1} > /run/sleeper-started-with; exec sleep infinity'\n[Install]\nWantedBy=multi-user.target\n`,
          filePaths: [`/etc/crash/f${fileCount - 1}`],
        },
      ],
      files: Array.from({ length: fileCount }, (_, i) => ({
        path: `/etc/crash/f${i}`,
        permissions: 0o644,
        content: { inline: { encoding: "", data: content(i, version) } },
      })),
    },
  };
}

/**
 * Starts `trellis apply` inside the node, waits until it has persisted its plan for `checksum` (so the
 * kill certainly lands during the apply, however slow the machine), then SIGKILLs it `ms` later.
 */
async function applyKilledDuring(checksum: string, ms: number): Promise<void> {
  const state = "/var/lib/gardener-node-agent/trellis/state.json";
  const script = [
    "/opt/bin/trellis apply --osc /root/osc.yaml >/dev/null 2>&1 & pid=$!",
    `until ! kill -0 $pid 2>/dev/null || grep -q '"progress":{"checksum":"${checksum}"' ${state} 2>/dev/null; do :; done`,
    `sleep ${ms / 1000}; kill -9 $pid 2>/dev/null; wait $pid; true`,
  ].join("\n");
  await node.exec(["sh", "-c", script], { timeoutMs: 60_000 });
}

const isTemp = (name: string) => name.includes(".trellis-tmp-");

/** Every file is one complete version; temp files of a killed writer are allowed only if `tempAllowed`. */
async function checkNoTornFiles(versions: number[], tempAllowed: boolean): Promise<void> {
  const allowed = new Map(Array.from({ length: fileCount }, (_, i) => [`f${i}`, new Set(versions.map((v) => sha(content(i, v))))]));
  const listing = await node.execOk(["sh", "-c", "cd /etc/crash 2>/dev/null && for f in * .*; do [ -f \"$f\" ] && echo \"$f $(sha256sum < \"$f\" | cut -d' ' -f1)\"; done; true"]);
  for (const line of listing.trim().split("\n").filter(Boolean)) {
    const [name, digest] = line.split(" ") as [string, string];
    if (tempAllowed && isTemp(name)) continue;
    expect({ name, ok: allowed.get(name)?.has(digest) ?? false }).toEqual({ name, ok: true });
  }
  const state = await node.exec(["cat", "/var/lib/gardener-node-agent/trellis/state.json"]);
  if (state.code === 0) expect(() => JSON.parse(state.stdout)).not.toThrow();
}

test("kill -9 during applies at many points: nothing torn, the next apply converges and restarts what it owed", async () => {
  await node.writeFile("/root/osc.yaml", stringify(osc(1)));
  expect((await node.exec(["/opt/bin/trellis", "apply", "--osc", "/root/osc.yaml"], { timeoutMs: 60_000 })).code).toBe(0);

  // Each round asks for the other version, so every round has work to be interrupted; the kill comes
  // 0–240 ms after the plan was persisted: in the writes, at the unit steps, or around the end.
  let version = 1;
  let interrupted = 0; // kills that left a persisted, unfinished plan behind
  for (let ms = 0; ms <= 240; ms += 10) {
    version = version === 1 ? 2 : 1;
    const text = stringify(osc(version));
    await node.writeFile("/root/osc.yaml", text);
    await applyKilledDuring(sha(text), ms);
    await checkNoTornFiles([1, 2], true);
    const state = await node.exec(["cat", "/var/lib/gardener-node-agent/trellis/state.json"]);
    if (state.code === 0 && JSON.parse(state.stdout).progress) interrupted++;
  }
  expect(interrupted).toBeGreaterThan(3);

  const final = await node.exec(["/opt/bin/trellis", "apply", "--osc", "/root/osc.yaml"], { timeoutMs: 60_000 });
  expect(final.stderr).not.toContain('"level":"error"');
  expect(final.code).toBe(0);
  await checkNoTornFiles([version], false);
  expect((await node.execOk(["sh", "-c", "ls /etc/crash | wc -l"])).trim()).toBe(String(fileCount));
  // The unit runs with the content its listed file has now, whichever apply wrote it and was killed.
  const startedWith = (await node.readFile("/run/sleeper-started-with")).split(" ")[0];
  expect(startedWith).toBe(sha(content(fileCount - 1, version)));
  const plan = await node.exec(["/opt/bin/trellis", "plan", "--osc", "/root/osc.yaml"], { timeoutMs: 30_000 });
  expect(plan.stdout).toContain("nothing to do");
}, 240_000);

const dropInDir = "/etc/systemd/system/dropper.service.d";
const dropInFiles = 3000;

/** dropper.service with no drop-ins in the OSC; `version` changes its unit file, so the unit changes. */
function dropperOsc(version: number) {
  return {
    apiVersion: "extensions.gardener.cloud/v1alpha1",
    kind: "OperatingSystemConfig",
    spec: {
      units: [{ name: "dropper.service", command: "start", content: `[Service]\nExecStart=/bin/sleep infinity\nEnvironment=V=${version}\n[Install]\nWantedBy=multi-user.target\n` }],
    },
  };
}

/** Drop-ins (and a subdirectory) someone else put there: many, so that removing them takes a while. */
async function fillDropInDir(): Promise<void> {
  await node.execOk(["sh", "-c", `rm -rf ${dropInDir} && mkdir -p ${dropInDir}/sub && cd ${dropInDir} && seq -f 'f%g.conf' 1 ${dropInFiles} | xargs touch && seq -f 'sub/g%g' 1 500 | xargs touch`]);
}

const entriesLeft = async () => Number((await node.execOk(["sh", "-c", `find ${dropInDir} 2>/dev/null | wc -l`])).trim());

test("kill -9 while a unit's drop-in directory is being removed: the next start of the same apply removes the rest", async () => {
  await node.writeFile("/root/osc.yaml", stringify(dropperOsc(0)));
  expect((await node.exec(["/opt/bin/trellis", "apply", "--osc", "/root/osc.yaml"], { timeoutMs: 60_000 })).code).toBe(0);
  let cutShort = 0;
  for (let ms = 0, version = 1; ms <= 300 && cutShort < 3; ms += 15, version++) {
    await fillDropInDir();
    const text = stringify(dropperOsc(version));
    await node.writeFile("/root/osc.yaml", text);
    await applyKilledDuring(sha(text), ms);
    const left = await entriesLeft();
    if (left > 0 && left < dropInFiles + 502) cutShort++; // 3000 drop-ins + sub + its 500 + the directory
    const next = await node.exec(["/opt/bin/trellis", "apply", "--osc", "/root/osc.yaml"], { timeoutMs: 60_000 });
    expect(next.stderr).not.toContain('"level":"error"');
    expect(next.code).toBe(0);
    expect({ ms, left: await entriesLeft() }).toEqual({ ms, left: 0 });
  }
  expect(cutShort).toBeGreaterThan(0);
  const plan = await node.exec(["/opt/bin/trellis", "plan", "--osc", "/root/osc.yaml"], { timeoutMs: 30_000 });
  expect(plan.stdout).toContain("nothing to do");
}, 240_000);
