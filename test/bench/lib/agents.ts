// The two agents the side-by-side benchmark runs: trellis (dist/trellis) and its peer, Gardener's
// gardener-node-agent built from the Go module proxy (test/peer/build.sh). Both get the same node, the
// same NodeAgentConfiguration, the same OSC Secret and the same API server; what differs is only what
// each needs to run at all: the config file's name, and the RBAC (gardener-node-agent's informers list
// and watch more, see below).
import { chmodSync, copyFileSync } from "node:fs";
import { agentRules, type AgentNodeOptions, agentUnitText } from "../../harness/agent.ts";
import { trellisBinary } from "../../harness/binary.ts";
import { runDir, runOk } from "../../harness/exec.ts";

export type AgentId = "trellis" | "gna";

export interface BenchAgent {
  id: AgentId;
  label: string;
  /** A private copy of the binary, taken at the start (a test run may rebuild dist/trellis meanwhile). */
  binary: string;
  version: string;
  configName: string;
  /**
   * The unit it runs under: trellis's (Type=notify: ready after its first reconcile) or Gardener's for
   * gardener-node-agent (a simple service; under trellis's it never reports ready, and `systemctl start`
   * would wait for ever).
   */
  unit: string;
  rules: (secrets: string[]) => NonNullable<AgentNodeOptions["rules"]>;
  /** The journal message that ends a reconcile that found nothing to do. */
  noopDoneMessage: string;
}

const peerBuildScript = new URL("../../peer/build.sh", import.meta.url).pathname;

/** gardener-node-agent's unit as Gardener v1.150.0 writes it (nodeagent.UnitContent), restarting after 1 s as trellis's does in the tests. */
const peerUnit = `[Unit]
Description=Gardener Node Agent
After=network-online.target

[Service]
LimitMEMLOCK=infinity
ExecStart=/opt/bin/gardener-node-agent --config-dir=/var/lib/gardener-node-agent
Restart=always
RestartSec=1
StandardOutput=journal+console
StandardError=journal

[Install]
WantedBy=multi-user.target
`;

/**
 * gardener-node-agent's RBAC, from what its manager's caches and controllers ask (Gardener grants it
 * through its node-agent authorizer webhook; this is the same set as plain RBAC): trellis's rules, and
 * on top a Lease informer, update on Node and nodes/status, a Pod informer (spec.nodeName=<node>), and
 * events in any namespace and in the events.k8s.io group.
 */
function peerRules(secrets: string[]) {
  return [
    ...agentRules(secrets),
    { namespace: "kube-system", rules: [{ apiGroups: ["coordination.k8s.io"], resources: ["leases"], verbs: ["list", "watch"] }] },
    {
      rules: [
        { apiGroups: [""], resources: ["nodes", "nodes/status"], verbs: ["update"] },
        { apiGroups: [""], resources: ["pods"], verbs: ["get", "list", "watch"] },
        { apiGroups: ["", "events.k8s.io"], resources: ["events"], verbs: ["create", "patch"] },
      ],
    },
  ];
}

export async function benchAgents(): Promise<BenchAgent[]> {
  const dir = runDir("bench-agents");
  const copy = (source: string, name: string) => {
    const target = `${dir}/${name}`;
    copyFileSync(source, target);
    chmodSync(target, 0o755);
    return target;
  };
  const trellis = copy(process.env.TRELLIS_BENCH_BINARY ?? (await trellisBinary()), "trellis");
  const peerSource = (await runOk(["bash", peerBuildScript], { timeoutMs: 60 * 60_000 })).trim().split("\n").at(-1) ?? "";
  const peer = copy(peerSource, "gardener-node-agent");
  const peerVersion = (await runOk([peer, "--version"])).trim().replace(/^Kubernetes /, "");
  return [
    {
      id: "trellis",
      label: "trellis",
      binary: trellis,
      version: JSON.parse(await runOk([trellis, "version", "--json"])).version,
      configName: "config.yaml",
      unit: agentUnitText,
      rules: agentRules,
      noopDoneMessage: "OSC applied",
    },
    {
      id: "gna",
      label: "gardener-node-agent",
      binary: peer,
      version: peerVersion,
      configName: `config-${peerVersion}.yaml`,
      unit: peerUnit,
      rules: peerRules,
      noopDoneMessage: "Configuration on this node is up to date, nothing to be done",
    },
  ];
}
