// The agent implementations the model can run (`bun test/model/run.ts --target <name>`). A new design
// adds its driver here.
import type { Driver } from "./driver.ts";
import { mutexDriver } from "./mutex-driver.ts";
import { newDriver } from "./new-driver.ts";
import { oldDriver } from "./old-driver.ts";

export const targets: Record<string, () => Driver> = {
  old: oldDriver,
  /** The new design: src/rollout, src/kube/pool-*, src/controllers/rollout. */
  new: newDriver,
  /** The harness's self-test agent: correct only without faults (profile calm). */
  mutex: mutexDriver,
};
