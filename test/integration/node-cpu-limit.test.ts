// The node harness's CPU limit (NODE_CPU_MAX, test/harness/node/boot.sh), which the side-by-side benchmark's
// --cpu-limit relies on: the node's units run under the quota, and an exec'd command only when asked to.
import { afterAll, expect, test } from "bun:test";
import { readThrottling } from "../bench/lib/cpu-limit.ts";
import { waitFor } from "../harness/exec.ts";
import { bootNode, type Node } from "../harness/node.ts";

let node: Node | undefined;
afterAll(() => node?.stop(), 60_000);

test("a node booted with NODE_CPU_MAX holds its units to the quota, and exec'd commands with underCpuLimit", async () => {
  process.env.NODE_CPU_MAX = "20000 100000";
  try {
    node = await bootNode("cpulimit");
  } finally {
    delete process.env.NODE_CPU_MAX;
  }
  const n = node;
  expect(n.cpuLimit?.path).toBe(`/trellis-${n.name}`);
  await n.execOk(["systemd-run", "--unit", "busy", "sh", "-c", "while :; do :; done"]);
  const pid = Number((await n.execOk(["systemctl", "show", "-P", "MainPID", "busy"])).trim());
  // readThrottling also checks that the unit's process is inside the limited cgroup.
  const t = await waitFor("CFS to throttle the busy unit", () => {
    const r = readThrottling(n, pid);
    return r.nrThrottled >= 5 ? r : undefined;
  }, 30_000, 100);
  expect(t).toMatchObject({ quotaUs: 20000, periodUs: 100000 });
  // In the node's cgroup namespace the limited cgroup is the root: "/" inside it, "/.." outside.
  const cpuLine = (out: string) => out.split("\n").find((l) => `,${l.split(":")[1]},`.includes(",cpu,"));
  expect(cpuLine(await n.execOk(["cat", "/proc/self/cgroup"], { underCpuLimit: true }))).toMatch(/:\/$/);
  expect(cpuLine(await n.execOk(["cat", "/proc/self/cgroup"]))).toMatch(/:\/\.\.$/);
}, 90_000);
