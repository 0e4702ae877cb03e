// The source under Deno as the agent: `deno run src/main.ts run` as gardener-node-agent.service in a
// systemd node, against a real kube-apiserver with the client-certificate kubeconfig the compiled agent
// uses. Deno loads client-node's real undici (no shim), so this is what shows that the certificate is
// sent: the API server's audit log names the agent's user, and RBAC lets only that user apply.
import { afterAll, beforeAll, expect, test } from "bun:test";
import { chmodSync, existsSync, rmSync, writeFileSync } from "node:fs";
import { stringify } from "yaml";
import { type AgentNode, nodeEvents, putOscSecret, startAgentNode, waitApplied } from "../harness/agent.ts";
import { repoRoot } from "../harness/binary.ts";
import { type Cluster, startCluster } from "../harness/cluster.ts";
import { runDir, runOk, waitFor } from "../harness/exec.ts";
import { auditOf } from "../harness/rbac.ts";

const secretName = "gardener-node-agent-worker-deno";
const deno = "node_modules/deno/deno";
// A node has its own /tmp and /run: a checkout there (CI's may be) is hard-linked to a path it sees.
const hidden = ["/tmp/", "/run/"].some((p) => `${repoRoot}/`.startsWith(p));
const tree = hidden ? `/var/tmp/trellis-deno-${process.pid}` : repoRoot;

let cluster: Cluster;
let agent: AgentNode;

beforeAll(async () => {
  if (hidden) {
    rmSync(tree, { recursive: true, force: true });
    await runOk(["mkdir", "-p", tree]);
    await runOk(["cp", "-al", "--dereference", `${repoRoot}/src`, `${repoRoot}/package.json`, `${repoRoot}/deno.json`, `${repoRoot}/node_modules`, tree]);
  }
  if (!existsSync(`${tree}/${deno}`)) throw new Error(`${tree}/${deno} is missing: run bun install`);
  const wrapper = `${runDir("deno-agent")}/gardener-node-agent`;
  writeFileSync(wrapper, `#!/bin/sh\nexport DENO_NO_UPDATE_CHECK=1 NO_COLOR=1\ncd ${tree}\nexec ${tree}/${deno} run -A src/main.ts run "$@"\n`);
  chmodSync(wrapper, 0o755);
  cluster = await startCluster({ controllerManager: false });
  agent = await startAgentNode(cluster, { prefix: "deno", secretName, binary: wrapper });
}, 180_000);
afterAll(async () => {
  await agent?.node.stop();
  await cluster?.stop();
  if (hidden) rmSync(tree, { recursive: true, force: true });
});

test("`deno run src/main.ts run` applies an OSC on a node and reports it, over client-certificate TLS", async () => {
  const osc = stringify({
    apiVersion: "extensions.gardener.cloud/v1alpha1",
    kind: "OperatingSystemConfig",
    spec: {
      units: [{ name: "deno-demo.service", command: "start", content: "[Service]\nExecStart=/bin/sleep infinity\n[Install]\nWantedBy=multi-user.target\n", filePaths: ["/etc/deno-demo/conf"] }],
      files: [{ path: "/etc/deno-demo/conf", permissions: 0o640, content: { inline: { encoding: "b64", data: Buffer.from("from deno\n").toString("base64") } } }],
    },
  });
  await waitApplied(agent, await putOscSecret(cluster, secretName, osc), 120_000);
  expect(await agent.node.readFile("/etc/deno-demo/conf")).toBe("from deno\n");
  expect((await agent.node.execOk(["stat", "-c", "%a", "/etc/deno-demo/conf"])).trim()).toBe("640");
  expect((await agent.node.execOk(["systemctl", "is-active", "deno-demo.service"])).trim()).toBe("active");
  await waitFor("the OSCApplied event", async () => ((await nodeEvents(agent)).some((e) => e.reason === "OSCApplied") ? true : undefined), 30_000);

  // It is Deno that runs as the agent, and the API server saw the agent's certificate user.
  const pid = (await agent.node.execOk(["systemctl", "show", "-P", "MainPID", "gardener-node-agent.service"])).trim();
  expect((await agent.node.execOk(["readlink", `/proc/${pid}/exe`])).trim()).toEndWith("/deno");
  const requests = auditOf(cluster, agent.user);
  expect(requests.some((e) => e.objectRef?.resource === "nodes" && e.verb === "patch" && e.responseStatus?.code === 200)).toBe(true);
  expect(auditOf(cluster, "system:anonymous")).toEqual([]);
}, 180_000);
