// What the OSC controller's stages share: its dependencies, and everything it keeps between reconciles,
// in one explicit object (the wiring is controller.ts; the stages are module functions over this).
import type { V1Secret } from "@kubernetes/client-node";
import type { DelayStart } from "../../api/delay-start.ts";
import type { Step } from "../../api/plan.ts";
import type { SerialHoldState } from "../../api/serial-hold.ts";
import type { BootClockReading } from "../../host/boot-clock.ts";
import type { ImageStore } from "../../host/registry/store.ts";
import type { Logger } from "../../log.ts";
import type { Counter, Gauge, Registry } from "../../metrics.ts";
import type { SecretRefs } from "../../kube/secret-refs.ts";
import { backoffDelay } from "../../time.ts";
import type { createInPlaceUpdater, InPlaceUpdaterDeps } from "../in-place.ts";
import type { Rollout } from "../rollout/controller.ts";
import type { OscWorkDeps } from "../types.ts";
import type { createOscParser } from "./parse.ts";

export type OscControllerDeps = OscWorkDeps & {
  metrics: Registry;
  kubernetesVersion: string;
  syncPeriodMs: number;
  hostName: string;
  selfUnit: string;
  /** Node path of the agent's own binary, and its --config-dir: an OSC replacing the binary is checked first. */
  selfBinary: string;
  configDir: string;
  images: ImageStore;
  /** Fleet rollouts: admission, health gate, rollback (src/controllers/rollout/). */
  rollout: Rollout;
  /** The monotonic clock every wait and duration is measured by. */
  clock?: () => number;
  /** What the reconciliation delay is measured by, across agent restarts and reboots. */
  bootClock?: () => BootClockReading;
  /** What in-place updates need besides (src/controllers/in-place.ts). */
  tokens: InPlaceUpdaterDeps["tokens"];
  certificate: InPlaceUpdaterDeps["certificate"];
  apiServer: InPlaceUpdaterDeps["apiServer"];
};

export type OscStatus = {
  synced: boolean;
  lastChecksum?: string;
  /** held: held back on this node (delay, serial lease, paused, canary, window, slot, health gate, in-place wait). */
  lastResult?: "applied" | "failed" | "invalid" | "waiting" | "held";
  lastError?: string;
  /**
   * The OSC is applied as the Node and this node's record say (a restarted agent's first reconcile,
   * recorded.ts); the check of the node itself is the next reconcile. Any other result clears it.
   */
  nodeCheckPending: boolean;
  reconciles: number;
};

/** When to reconcile again, on the monotonic clock. */
export type Wait = { atMs: number; why: string };

/** What the controller keeps between reconciles. */
export type OscState = {
  /**
   * The Secret as the watch last delivered it; without its data once its OSC was applied and its parse
   * kept in the state directory (`letGo` is then osc.yaml's checksum): a reconcile that needs the bytes
   * again reads the Secret again.
   */
  secret?: V1Secret;
  /** osc.yaml's checksum, once the Secret's data was let go of. */
  letGo?: string;
  /** The problems this agent reported for the OSC it sees now (replaced when the OSC changes, so nothing piles up). */
  seen?: { checksum: string; reported: Set<string> };
  /** When this node first saw the OSC, for the reconciliation delay (persisted too). */
  firstSeen?: DelayStart;
  /** The serial lease's hold and give-up (persisted; read once). */
  serial?: SerialHoldState;
  /** Whether this agent process's first reconcile with a Secret has run (recorded.ts: it may trust the record). */
  startedWithSecret: boolean;
  /** A reconcile ran before the Node was known (its arrival then wakes the controller). */
  ranWithoutNode: boolean;
  /** Failed reconciles in a row, for the backoff. */
  failures: number;
  leftoverLeaseChecked: boolean;
  /** The Secret has overlays: the Node's labels matter. */
  layeredSecret: boolean;
  /** What the current reconcile's apply did, for the listeners. */
  executed: readonly Step[];
  /** The OSC last applied completely (a metric). */
  appliedChecksum?: string;
  /**
   * A rollback's report to the Node that failed (cut off from the API server): made at the next reconcile,
   * else the Node would name the failed OSC while the node runs its last good one.
   */
  reportOwed?: () => Promise<void>;
  status: OscStatus;
};

export type OscContext = {
  deps: OscControllerDeps;
  log: Logger;
  now: () => number;
  bootClock: () => BootClockReading;
  /** Aborted when the agent stops: a long image download must not hold up its shutdown. */
  stopping: AbortSignal;
  state: OscState;
  inPlace: ReturnType<typeof createInPlaceUpdater>;
  parser: ReturnType<typeof createOscParser>;
  /** The Secrets secretRef files name, from their watches. */
  secretRefs: Pick<SecretRefs, "read" | "keepOnly">;
  metrics: { restarts: Counter; serialGivenUp: Counter; notActedOn: Gauge };
};

export const periodic = (ctx: OscContext): Wait => ({ atMs: ctx.now() + ctx.deps.syncPeriodMs, why: "periodic re-check" });

export function retryWait(ctx: OscContext, why: string): Wait {
  ctx.state.failures++;
  // 1 s doubling per failure in a row, up to 256 s; not jittered: one node's retries concern no other.
  const ms = backoffDelay(ctx.state.failures, { initialMs: 1000, maxMs: 256_000 }, 1);
  return { atMs: ctx.now() + ms, why: `retry after ${why}` };
}

/** What was reported already for `checksum` (a fresh record when the OSC changed). */
export function noted(ctx: OscContext, checksum: string): { checksum: string; reported: Set<string> } {
  if (ctx.state.seen?.checksum !== checksum) ctx.state.seen = { checksum, reported: new Set() };
  return ctx.state.seen;
}

/** The Secret without its data: what the watch and the controller keep of it once its OSC is applied and kept. */
export function withoutData(secret: V1Secret): V1Secret {
  const { data: _data, stringData: _stringData, ...rest } = secret;
  return rest;
}

/** Sets the result the status board shows. */
export function result(ctx: OscContext, r: NonNullable<OscStatus["lastResult"]>, error?: string): void {
  ctx.state.status.lastResult = r;
  ctx.state.status.lastError = error;
  ctx.state.status.nodeCheckPending = false;
}
