// Cutting one bridge node off from servers on the host (the API server's relays), as a network fault does:
// packets between the node and those host ports are dropped both ways, so new connections and established
// ones (watches, kept-alive requests) hang as they do when a link goes away — no reset, no refusal. Only the
// node's own network namespace is touched: its iptables, entered from the host through the node's PID 1
// (nsenter --net), never the host's; heal() deletes exactly the rules cut() added. Other host ports (the
// registry's relay) stay reachable, and so do the node's other neighbours.
import { runOk } from "./exec.ts";
import type { Node } from "./node.ts";

export type Cut = {
  /** Date.now() once every rule was in place. */
  at: number;
  /** Deletes the rules; returns Date.now() once they are gone. A no-op the second time. */
  heal(): Promise<number>;
};

/** A comment on every rule, so that a look at the node's iptables tells them from kubelet's or CNI's. */
const tag = "trellis-e2e-cut";

/** Drops the node's traffic to and from `host`:`ports` (TCP) until heal(). */
export async function cutOff(node: Node, host: string, ports: number[]): Promise<Cut> {
  const rules = ports.flatMap((port) => [
    ["OUTPUT", "-d", host, "-p", "tcp", "--dport", String(port)],
    ["INPUT", "-s", host, "-p", "tcp", "--sport", String(port)],
  ]);
  const iptables = (op: "-I" | "-D", rule: string[]) => runOk(["nsenter", `--net=/proc/${node.pid}/ns/net`, "iptables", "-w", op, ...rule, "-m", "comment", "--comment", tag, "-j", "DROP"]);
  const added: string[][] = [];
  try {
    for (const rule of rules) {
      await iptables("-I", rule);
      added.push(rule);
    }
  } catch (err) {
    for (const rule of added) await iptables("-D", rule).catch(() => undefined);
    throw err;
  }
  let healed: number | undefined;
  return {
    at: Date.now(),
    async heal() {
      if (healed === undefined) {
        for (const rule of added) await iptables("-D", rule);
        healed = Date.now();
      }
      return healed;
    },
  };
}
