// Restores the Node's InternalIP when kubelet lost it, as gardener-node-agent's kubelet health check does
// (healthcheck/kubelet.go, ensureNodeInternalIP): a kubelet whose cloud provider call times out at start-up
// can leave its Node with no address at all. While the Node has an InternalIP, the agent remembers it (the
// last one listed; in memory, as gardener-node-agent does, so a restarted agent knows none until it sees one
// again). When the Node has neither an InternalIP nor an ExternalIP, a Warning says so, and if the remembered
// address is still one of this host's, the Node's addresses are set to it alone. The write carries the
// resourceVersion the decision was made on (gardener-node-agent updates the Node it read): a conflict is
// tried again at the next look; any other failure restarts kubelet, which registers its addresses anew.
// Looked at on every update of the Node and every health check, as gardener-node-agent's health check runs.
import { networkInterfaces } from "node:os";
import type { V1Node, V1NodeAddress } from "@kubernetes/client-node";
import type { Systemd } from "../host/systemd.ts";
import type { Kube } from "../kube/client.ts";
import { KubeError } from "../kube/errors.ts";
import { type EventRecorder, nodeRef } from "../kube/events.ts";
import { restoreNodeInternalIP } from "../kube/node.ts";
import { describeError, type Logger } from "../log.ts";

export type AddressDecision =
  /** The Node has an InternalIP: the one to restore should it be lost. */
  | { do: "remember"; ip: string }
  /** The Node's InternalIP is no IP address: the one remembered before stays. */
  | { do: "ignore"; invalid: string }
  /** Only an ExternalIP: nothing to do. */
  | { do: "nothing" }
  /** Neither: said, and `restore` is the remembered InternalIP when it is still one of this host's. */
  | { do: "report"; restore?: string; hostAddressesError?: string };

/**
 * What the Node's addresses call for, given the InternalIP remembered and this host's addresses (asked
 * only when the Node has neither kind). As gardener-node-agent reads them: the last address of each type
 * counts, and an empty one is none.
 */
export function decideAddresses(addresses: readonly V1NodeAddress[] | undefined, remembered: string | undefined, hostAddresses: () => readonly string[]): AddressDecision {
  let internal = "";
  let external = "";
  for (const a of addresses ?? []) {
    if (a.type === "InternalIP") internal = a.address;
    else if (a.type === "ExternalIP") external = a.address;
  }
  if (internal !== "") {
    const ip = canonicalIp(internal);
    return ip === undefined ? { do: "ignore", invalid: internal } : { do: "remember", ip };
  }
  if (external !== "") return { do: "nothing" };
  if (remembered === undefined) return { do: "report" };
  let host: readonly string[];
  try {
    host = hostAddresses();
  } catch (err) {
    return { do: "report", hostAddressesError: describeError(err) };
  }
  return host.some((a) => canonicalIp(a) === remembered) ? { do: "report", restore: remembered } : { do: "report" };
}

/**
 * An IP address in one spelling (IPv6 as the URL standard writes it: lower case, the longest run of zero
 * groups shortened), so that two spellings of one address compare equal; undefined when it is none.
 */
export function canonicalIp(text: string): string | undefined {
  if (/^(25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)(\.(25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)){3}$/.test(text)) return text;
  if (!text.includes(":") || !/^[0-9A-Fa-f:.]+$/.test(text)) return undefined;
  try {
    return new URL(`http://[${text}]/`).hostname.slice(1, -1);
  } catch {
    return undefined;
  }
}

/** Every address of this host's interfaces, as Go's net.InterfaceAddrs lists them. */
export function hostInterfaceAddresses(): string[] {
  return Object.values(networkInterfaces()).flatMap((list) => (list ?? []).map((a) => a.address));
}

export type InternalIpDeps = {
  kube: Kube;
  systemd: Systemd;
  events: EventRecorder;
  log: Logger;
  hostAddresses?: () => readonly string[];
};

export function createInternalIpKeeper(deps: InternalIpDeps) {
  const hostAddresses = deps.hostAddresses ?? hostInterfaceAddresses;
  let remembered: string | undefined;

  async function restore(node: V1Node, ip: string): Promise<void> {
    const name = node.metadata?.name as string;
    try {
      await restoreNodeInternalIP(deps.kube, node, ip);
      deps.log.info("restored the Node's lost InternalIP", { ip });
      await deps.events.record({ node: nodeRef(node), type: "Normal", reason: "NodeInternalIPRestored", message: `Set the Node's lost InternalIP to ${ip}, the last one it had.` });
    } catch (err) {
      // The Node changed since it was read: looked at again with its next update or health check.
      if (err instanceof KubeError && err.reason === "conflict") return;
      deps.log.error("could not restore the Node's InternalIP; restarting kubelet to register its addresses again", { node: name, ip, error: describeError(err) });
      const restarted = await deps.systemd.restart("kubelet.service").then(
        () => "Restarted kubelet.service.",
        (restartErr: unknown) => `Restarting kubelet.service failed: ${describeError(restartErr)}`,
      );
      await deps.events.record({ node: nodeRef(node), type: "Warning", reason: "NodeInternalIPRestoreFailed", message: `Could not set the Node's InternalIP to ${ip}: ${describeError(err)}. ${restarted}` });
    }
  }

  return {
    /** The InternalIP that would be restored. */
    remembered: () => remembered,
    async look(node: V1Node): Promise<void> {
      const d = decideAddresses(node.status?.addresses, remembered, hostAddresses);
      switch (d.do) {
        case "remember":
          if (d.ip !== remembered) deps.log.info("remembering the Node's InternalIP, to restore it should kubelet lose it", { ip: d.ip });
          remembered = d.ip;
          return;
        case "ignore":
          deps.log.warn("the Node's InternalIP is not an IP address; not remembered", { address: d.invalid, remembered });
          return;
        case "nothing":
          return;
        case "report": {
          const why =
            remembered === undefined
              ? "no InternalIP of it was seen since the agent started"
              : d.restore
                ? `restoring the last one it had, ${remembered}, which is still this host's`
                : d.hostAddressesError
                  ? `this host's addresses could not be listed (${d.hostAddressesError}) to tell whether the last one it had, ${remembered}, is still this host's`
                  : `the last one it had, ${remembered}, is no longer this host's`;
          deps.log.warn("the Node has neither an InternalIP nor an ExternalIP", { remembered, restore: d.restore !== undefined });
          await deps.events.record({ node: nodeRef(node), type: "Warning", reason: "NodeAddressesMissing", message: `The Node has neither an InternalIP nor an ExternalIP: ${why}.` });
          if (d.restore) await restore(node, d.restore);
        }
      }
    },
  };
}
