// The differences trellis issue 20 already names (items 1–14), for the report only: they still fail the
// test until fixed, but the report says which item each belongs to, so that only news reads as news.
import type { Matcher } from "./match.ts";

export type KnownItem = { item: string; title: string; match: Matcher[] };

/** The steps whose OSC gardener-node-agent takes and trellis refused at d167130 (issue 20 item 1). */
const refusedSteps = "unknown-field-content|unknown-field-spec|unknown-top-level-anchor|dropin-repeated|dropin-not-conf|same-path-spec-status|big-osc";

export const knownItems: KnownItem[] = [
  { item: "1", title: "refusals that block a pool (unknown fields, drop-in names, a path in spec and status, the YAML token cap)", match: [{ step: refusedSteps }] },
  { item: "7", title: "trellis writes worker.gardener.cloud/gardener-node-agent-secret-name", match: [{ area: "label", key: "worker\\.gardener\\.cloud/gardener-node-agent-secret-name", gna: "absent" }] },
  {
    item: "8",
    title: "containerd plugins: deep merge instead of replacing top-level keys",
    match: [
      { step: "cri-plugins-replace", area: "file", key: "/etc/containerd/config\\.toml" },
      { step: "cri-plugins-replace", area: "restarted", key: "containerd\\.service" },
    ],
  },
  { item: "4", title: "the checksum is written before registries with a readiness probe answer", match: [{ step: "readiness-probe-unreachable" }] },
  { item: "12", title: "serial rollout: lease identity, delay and serial stacked", match: [{ step: "serial|delayed-serial", area: "lease" }] },
  { item: "9", title: "a unit left with no drop-ins keeps its .d directory", match: [{ area: "file", key: "/etc/systemd/system/parity-a\\.service\\.d", gna: "absent" }] },
];
