// Which units the restart annotation asks for (the controller against real components: test/integration/restart.test.ts).
import { expect, test } from "bun:test";
import { requestedUnits } from "../../src/controllers/restart.ts";

test.each([
  ["kubelet,containerd.service", ["kubelet.service", "containerd.service"]],
  [" kubelet , ,containerd ,", ["kubelet.service", "containerd.service"]],
  ["kubelet,kubelet.service", ["kubelet.service"]],
  ["logrotate.timer,docker.socket,var-lib.mount,web@1", ["logrotate.timer", "docker.socket", "var-lib.mount", "web@1.service"]],
  ["gardener-node-agent", ["gardener-node-agent.service"]],
  ["", []],
])("%j → %j", (value, units) => {
  expect(requestedUnits(value)).toEqual(units);
});
