// Removes the bootstrap credentials once they have served: kubelet's bootstrap kubeconfig and the
// agent's bootstrap token. Not right after the first successful apply: kubelet starts with that apply
// and needs the bootstrap kubeconfig until its own client certificate was issued, and a kubelet that is
// slow, or restarted before its certificate request was approved, would never join. So, as
// gardener-node-agent does, only once the Node is registered, and beyond it, only once kubelet holds
// its own credentials (a Node can exist before kubelet registered it: created by a provider or a test).
//
// And not only once: as gardener-node-agent deletes them at every reconcile, they are looked at again after
// every reconcile of the OSC controller. A certificate authority rotation gives kubelet a bootstrap
// kubeconfig again, holding its old client key, and it must not stay on disk once kubelet has its new
// certificate. The check runs between reconciles, never during one: the rotation writes that kubeconfig
// before it removes kubelet's own, and a check in between would take the one kubelet is to bootstrap with.
import { kubelet, paths } from "../api/paths.ts";
import type { StateStore } from "../apply/state-store.ts";
import type { Files } from "../host/files.ts";
import { describeError, type Logger } from "../log.ts";
import { later } from "../loops.ts";
import type { OscController } from "./osc/controller.ts";
import type { Controller, NodeSource } from "./types.ts";

export type BootstrapCredentialsDeps = {
  files: Files;
  node: NodeSource;
  store: StateStore;
  log: Logger;
  /** The OSC controller: the check runs between its reconciles, and after each of them. */
  osc: Pick<OscController, "between" | "onReconciled">;
  /** How often the conditions are looked at while credentials remain (default 5 s, as gardener-node-agent requeues). */
  intervalMs?: number;
};

export function startBootstrapCredentialsCleanup(deps: BootstrapCredentialsDeps): Controller {
  const log = deps.log.with({ controller: "bootstrap-credentials" });
  // The agent never authenticates with the token itself: it runs with its own client certificate.
  const targets = [kubelet.bootstrapKubeconfig, paths.bootstrapToken];
  const next = later(() => void tick());
  let stopped = false;
  let waitingFor = "";

  // Why the credentials must stay, or undefined once they may go.
  const stillNeeded = async (): Promise<string | undefined> => {
    if (!(await deps.store.read()).lastApplied) return "no OSC applied yet";
    if (!deps.node.current()) return "kubelet has not registered the Node yet";
    for (const credential of [kubelet.realKubeconfig, kubelet.clientCertificate]) if (await deps.files.stat(credential)) return undefined;
    return "kubelet has no client certificate yet";
  };

  const check = async (): Promise<boolean> => {
    const present = (await Promise.all(targets.map(async (t) => ((await deps.files.stat(t)) ? t : undefined)))).filter((t) => t !== undefined);
    if (present.length === 0) return true;
    const why = await stillNeeded();
    if (why) {
      if (why !== waitingFor) log.info("keeping the bootstrap credentials", { why, paths: present });
      waitingFor = why;
      return false;
    }
    for (const path of present) if (await deps.files.remove(path)) log.info("removed bootstrap credentials: kubelet has joined with its own", { path });
    return true;
  };

  const tick = async () => {
    next.cancel();
    const done = await deps.osc.between(check).catch((err: unknown) => {
      if (stopped) return true;
      log.warn("could not check or remove the bootstrap credentials", { error: describeError(err) });
      return false;
    });
    if (!done && !stopped) next.in(deps.intervalMs ?? 5_000);
  };
  void tick();
  const unsubscribe = deps.osc.onReconciled(() => void tick());

  return {
    stop: async () => {
      stopped = true;
      unsubscribe();
      next.cancel();
    },
  };
}
