// Preloaded by `bun test` (bunfig.toml): Bun 1.4.5's test runner emits no process 'exit' event, so the
// backstop of cleanup.ts (stop the nodes and registries a failed test left) runs from a global afterAll.
import { afterAll } from "bun:test";
import { runHooks } from "./cleanup.ts";

afterAll(runHooks);
