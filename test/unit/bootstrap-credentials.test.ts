// The removal of the bootstrap credentials (src/controllers/bootstrap-credentials.ts) against a temporary
// root: once kubelet has joined with its own, and again after every reconcile, as gardener-node-agent deletes
// them at every reconcile (a CA rotation gives kubelet a bootstrap kubeconfig again, with its old key); never
// during a reconcile, which may be the rotation itself. Against a real kubelet: test/e2e/bootstrap.test.ts.
import { expect, test } from "bun:test";
import { mkdtempSync } from "node:fs";
import type { V1Node } from "@kubernetes/client-node";
import { kubelet, paths } from "../../src/api/paths.ts";
import type { Step } from "../../src/api/plan.ts";
import { emptyState } from "../../src/api/state.ts";
import { createStateStore } from "../../src/apply/state-store.ts";
import { startBootstrapCredentialsCleanup } from "../../src/controllers/bootstrap-credentials.ts";
import { createFiles } from "../../src/host/files.ts";
import { createLogger } from "../../src/log.ts";
import { singleFlight } from "../../src/loops.ts";
import { runDir, waitFor } from "../harness/exec.ts";

/** The OSC controller's reconciles, as far as the cleanup sees them: one at a time, each ending with its listeners. */
function oscReconciles() {
  const listeners = new Set<(executed: readonly Step[]) => void>();
  let release = () => {};
  let inPass = false;
  const passes = singleFlight(async () => {
    inPass = true;
    await new Promise<void>((done) => (release = done));
    inPass = false;
    for (const l of listeners) l([]);
  });
  return {
    osc: {
      between: <T>(fn: (reconcile: (why: string) => Promise<boolean>) => Promise<T>) => passes.exclusive(() => fn(async () => true)),
      onReconciled: (listener: (executed: readonly Step[]) => void) => {
        listeners.add(listener);
        return () => void listeners.delete(listener);
      },
    },
    /** Starts a reconcile, which runs until `end` is called. */
    start: () => passes.trigger("test"),
    end: () => release(),
    inPass: () => inPass,
  };
}

test("the bootstrap kubeconfig is removed once kubelet has its own credentials, and again when a later reconcile (a CA rotation) wrote it anew — never during that reconcile", async () => {
  const files = createFiles(mkdtempSync(`${runDir("bootstrap-credentials-unit")}/root-`));
  await createStateStore(files).write({ ...emptyState(), lastApplied: { checksum: "c1", at: new Date().toISOString() } });
  for (const [path, text] of [[kubelet.bootstrapKubeconfig, "bootstrap"], [paths.bootstrapToken, "token"], [kubelet.realKubeconfig, "real"]] as const) await files.writeAtomic(path, text, 0o600);
  const node: V1Node = { metadata: { name: "node-a" } };
  const r = oscReconciles();
  const removedDuringAReconcile: string[] = [];
  const remove = files.remove.bind(files);
  files.remove = async (path: string) => {
    if (r.inPass()) removedDuringAReconcile.push(path);
    return remove(path);
  };
  const cleanup = startBootstrapCredentialsCleanup({
    files,
    node: { current: () => node, subscribe: () => () => {}, found: Promise.resolve(node), listed: Promise.resolve() },
    store: createStateStore(files),
    log: createLogger({ write: () => {} }),
    osc: r.osc,
  });
  try {
    const gone = (path: string) => async () => ((await files.stat(path)) ? undefined : true);
    await waitFor("the bootstrap credentials removed", async () => ((await gone(kubelet.bootstrapKubeconfig)()) && (await gone(paths.bootstrapToken)()) ? true : undefined), 5_000, 10);

    // A reconcile rotates the CA: kubelet bootstraps again with its current certificate.
    r.start();
    await waitFor("the reconcile running", () => (r.inPass() ? true : undefined), 5_000, 5);
    await files.writeAtomic(kubelet.bootstrapKubeconfig, "bootstrap with the old key", 0o600);
    // The cleanup's next look waits for the reconcile's end.
    const late = r.osc.between(async () => files.stat(kubelet.bootstrapKubeconfig));
    r.end();
    expect(await late).toBeDefined();
    await waitFor("the rebootstrap kubeconfig removed after the reconcile", gone(kubelet.bootstrapKubeconfig), 5_000, 10);
    expect(removedDuringAReconcile).toEqual([]);
    expect(await files.stat(kubelet.realKubeconfig)).toBeDefined();
  } finally {
    await cleanup.stop();
  }
}, 30_000);
