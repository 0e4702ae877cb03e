// bun --preload ./build/shims/preload.ts test/bench/drift-idle.ts [seconds=120] — what the drift
// watches cost an idle agent: two nodes at once (the same machine load for both), each running the
// compiled agent on the benchmark OSC (500 files in 50 directories, 50 units: 51 directories
// watched), one with controllers.drift.mode repair (the default), one with disabled; the agents' CPU
// (utime + stime) over `seconds` once both applied it.
import { mainPid, putOscSecret, startAgentNode, waitApplied } from "../harness/agent.ts";
import { startCluster } from "../harness/cluster.ts";
import { oscYaml } from "./lib/bench-osc.ts";
import { cpuSeconds, initClockTicks, machineInfo } from "./lib/proc.ts";

const seconds = Number(process.argv[2] ?? 120);
await initClockTicks();
const cluster = await startCluster({ controllerManager: false });
const modes = ["repair", "disabled"] as const;
try {
  const agents = await Promise.all(
    modes.map((mode) => startAgentNode(cluster, { prefix: `idle-${mode}`, secretName: `gardener-node-agent-idle-${mode}`, controllers: `  drift: {mode: ${mode}}\n` })),
  );
  await Promise.all(agents.map(async (a, i) => waitApplied(a, await putOscSecret(cluster, `gardener-node-agent-idle-${modes[i]}`, oscYaml()), 120_000)));
  const pids = await Promise.all(agents.map((a) => mainPid(a, "gardener-node-agent.service")));
  const before = await Promise.all(agents.map((a, i) => cpuSeconds(a.node, pids[i] as number)));
  await Bun.sleep(seconds * 1000); // the measurement itself: idle for this long
  const after = await Promise.all(agents.map((a, i) => cpuSeconds(a.node, pids[i] as number)));
  const watches = await Promise.all(agents.map(async (a, i) => Number((await a.node.execOk(["sh", "-c", `cat /proc/${pids[i]}/fdinfo/* | grep -c '^inotify wd' || true`])).trim())));
  console.log(
    JSON.stringify(
      {
        machine: await machineInfo(),
        seconds,
        inotifyWatches: Object.fromEntries(modes.map((m, i) => [m, watches[i]])),
        cpuMs: Object.fromEntries(modes.map((m, i) => [m, Math.round(((after[i] as number) - (before[i] as number)) * 1000)])),
      },
      null,
      2,
    ),
  );
  await Promise.all(agents.map((a) => a.node.stop()));
} finally {
  await cluster.stop();
}
