// The agent's wall clock jumping an hour forward and back again (libfaketime in the agent's process only,
// through its unit's environment; the host's clock is never touched, and CLOCK_MONOTONIC stays real). A
// jump below the real time is not made: the test cluster's certificates are issued "now" and would not be
// valid yet. After each jump: the Lease is renewed on its 10 s cadence with the new time, the status file
// keeps being written, a Secret change is applied at once, /readyz is 200 and no unit restarted.
import type { Scenario } from "../scenario.ts";
import type { Node } from "../../harness/node.ts";
import { waitFor } from "../../harness/exec.ts";
import { agentUnit, applyChange, iterate, leaseRenewTime, maxFigures, startRig, unitRestarts, unitStates, waitAgentReady, waitLeaseRenewed } from "../lib-control-plane.ts";

const libfaketime = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";
const offsetFile = "/var/lib/chaos-faketime";

/** Sets the agent's clock offset; libfaketime reads the file on every call (FAKETIME_NO_CACHE). */
const setOffset = (node: Node, seconds: number) =>
  node.execOk(["sh", "-c", `printf '%s' '${seconds >= 0 ? "+" : ""}${seconds}' > ${offsetFile}.new && mv ${offsetFile}.new ${offsetFile}`]);

/** The status file's mtime in ms (the kernel's real clock, not the agent's). */
const statusMtime = async (node: Node) => Number((await node.execOk(["stat", "-c", "%.3Y", "/run/trellis/status.json"])).trim()) * 1000;

export const scenario: Scenario = {
  id: "clock-jump",
  fault: "wall clock jumps ±1 h (libfaketime)",
  async run({ long, log }) {
    const iterations = long ? 4 : 2;
    const rig = await startRig({
      prefix: "cp-clock",
      beforeStart: async (node) => {
        await setOffset(node, 0);
        await node.writeFile(
          `/etc/systemd/system/${agentUnit}.d/50-faketime.conf`,
          `[Service]\nEnvironment=LD_PRELOAD=${libfaketime} FAKETIME_TIMESTAMP_FILE=${offsetFile} FAKETIME_NO_CACHE=1 DONT_FAKE_MONOTONIC=1\n`,
          0o644,
        );
        await node.execOk(["systemctl", "daemon-reload"]);
      },
    });
    const figures: Record<string, number>[] = [];
    try {
      const result = await iterate(iterations, log, async (i) => {
        const problems: string[] = [];
        const offset = i % 2 === 1 ? 3600 : 0;
        const before = await unitStates(rig.node);
        const leaseBefore = await leaseRenewTime(rig);
        await setOffset(rig.node, offset);
        const jumpedAt = Date.now();
        log(`iteration ${i}: the agent's clock jumped ${offset ? "forward" : "back"} to real time ${offset ? "+1 h" : "+0"}`);
        // Watched from the jump on, alongside the renewals (each renewal reports, and a report is written within 1 s).
        const statusWritten = waitFor("the status file rewritten after the jump", async () => (await statusMtime(rig.node)) > jumpedAt + 1000, 20_000, 250).then(() => Date.now() - jumpedAt, () => -1);
        const lease = await waitLeaseRenewed(rig, leaseBefore, 30_000);
        if (lease.ms > 12_000) problems.push(`the first renewal after the jump came ${lease.ms} ms later (interval 10 s)`);
        // The proof that the compiled agent runs on the faked clock: the renewTime it wrote is off by the offset.
        const skewS = Math.round((Date.parse(lease.renewTime) - jumpedAt) / 1000);
        if (Math.abs(skewS - offset) > 30) problems.push(`renewTime ${lease.renewTime} is ${skewS} s from real time, not ≈ ${offset} s: the agent's clock did not jump`);
        const next = await waitLeaseRenewed(rig, lease.renewTime, 30_000);
        if (next.ms > 12_000) problems.push(`the renewal after that came ${next.ms} ms later (interval 10 s)`);
        const statusWrittenMs = await statusWritten;
        if (statusWrittenMs < 0) problems.push("/run/trellis/status.json was not rewritten within 20 s of the jump (it is, at least every lease renewal, normally)");
        const appliedMs = await applyChange(rig, `clock-${i}`, 30_000);
        if (appliedMs > 10_000) problems.push(`a Secret change was applied in ${appliedMs} ms (limit 10000)`);
        const readyMs = await waitAgentReady(rig, 30_000);
        problems.push(...unitRestarts(before, await unitStates(rig.node)).map((r) => `unexpected restart: ${r}`));
        figures.push({ firstRenewalMs: lease.ms, nextRenewalMs: next.ms, statusFileWrittenMs: statusWrittenMs, appliedMs, readyMs });
        log(`iteration ${i}: ${JSON.stringify({ skewS, ...figures.at(-1) })}`);
        return problems;
      });
      return { checked: "renewTime follows the jumped clock, renewals stay 10 s apart, status file still written, Secret change applied ≤ 10 s, /readyz 200, no unit restarted", iterations, ...result, figures: maxFigures(figures) };
    } finally {
      await rig.stop();
    }
  },
};
