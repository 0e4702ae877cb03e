// Nodes and registries outlive the test process that started them (nodes are detached on purpose).
// Every test stops what it started in its teardown; these hooks are the backstop for a test process
// that crashes or is interrupted before it gets there. Hooks must be synchronous (they run in 'exit').
const hooks = new Set<() => void>();

/** Runs every pending hook now (test/harness/preload.ts calls it: `bun test` emits no 'exit' event). */
export function runHooks(): void {
  for (const hook of hooks) {
    try {
      hook();
    } catch {
      // best effort: one failing hook must not keep the others from running
    }
  }
  hooks.clear();
}

let installed = false;

/** Runs `hook` when the process exits or is interrupted; call the returned function once cleaned up normally. */
export function atExit(hook: () => void): () => void {
  if (!installed) {
    installed = true;
    process.once("exit", runHooks);
    for (const [signal, code] of [["SIGINT", 130], ["SIGTERM", 143]] as const) {
      process.once(signal, () => {
        runHooks();
        process.exit(code);
      });
    }
  }
  hooks.add(hook);
  return () => hooks.delete(hook);
}
