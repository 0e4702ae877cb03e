// The decision whether `trellis run` executes itself again with the runtime variables it was built with.
import { describe, expect, test } from "bun:test";
import { decideRuntimeEnv, optOutVariable, parseReexecMarker, reexecGuard } from "../../src/runtime-env.ts";

const wanted = { BUN_GC_TIMER_DISABLE: "1", MIMALLOC_PURGE_HOLES_MIN_INTERVAL: "10000" };
const binary = "/opt/bin/gardener-node-agent 118683824 1764000000000";
const env = { PATH: "/usr/bin", NOTIFY_SOCKET: "/run/systemd/notify" };

describe("decideRuntimeEnv", () => {
  test("a fresh start executes itself with every wanted variable, the guard naming them, and the environment it had", () => {
    const d = decideRuntimeEnv({ wanted, env, binary, marker: undefined });
    expect(d).toEqual({
      action: "exec",
      set: wanted,
      env: { ...env, ...wanted, [reexecGuard]: "BUN_GC_TIMER_DISABLE,MIMALLOC_PURGE_HOLES_MIN_INTERVAL" },
      marker: { binary, set: wanted },
    });
  });

  test("the executed process does not execute again: it reports what was added and scrubs it (and the guard) for its children", () => {
    const d = decideRuntimeEnv({ wanted, env: { ...env, ...wanted, [reexecGuard]: "BUN_GC_TIMER_DISABLE,MIMALLOC_PURGE_HOLES_MIN_INTERVAL" }, binary, marker: { binary, set: wanted } });
    expect(d).toEqual({ action: "executed", set: wanted, scrub: [reexecGuard, "BUN_GC_TIMER_DISABLE", "MIMALLOC_PURGE_HOLES_MIN_INTERVAL"] });
  });

  test("an operator's own value wins: only the variables the environment lacks are added", () => {
    const d = decideRuntimeEnv({ wanted, env: { ...env, BUN_GC_TIMER_DISABLE: "0" }, binary, marker: undefined });
    expect(d.action).toBe("exec");
    if (d.action !== "exec") return;
    expect(d.set).toEqual({ MIMALLOC_PURGE_HOLES_MIN_INTERVAL: "10000" });
    expect(d.env.BUN_GC_TIMER_DISABLE).toBe("0");
    expect(d.env[reexecGuard]).toBe("MIMALLOC_PURGE_HOLES_MIN_INTERVAL");
    // ... and an empty value is the operator's too.
    expect(decideRuntimeEnv({ wanted, env: { BUN_GC_TIMER_DISABLE: "", MIMALLOC_PURGE_HOLES_MIN_INTERVAL: "" }, binary, marker: undefined })).toMatchObject({ action: "stay", reason: "the environment sets them all" });
  });

  test(`${optOutVariable}=off leaves the runtime's defaults alone; a build without variables has nothing to do`, () => {
    expect(decideRuntimeEnv({ wanted, env: { ...env, [optOutVariable]: "off" }, binary, marker: undefined })).toEqual({ action: "stay", reason: `${optOutVariable}=off` });
    expect(decideRuntimeEnv({ wanted: {}, env, binary, marker: undefined })).toEqual({ action: "stay", reason: "no runtime settings in this build" });
  });

  test("a marker of the same binary and variables left behind: the runtime refused them, so this start runs without them and warns", () => {
    const d = decideRuntimeEnv({ wanted, env, binary, marker: { binary, set: wanted } });
    expect(d.action).toBe("stay");
    if (d.action !== "stay") return;
    expect(d.warning).toContain("ended before trellis ran");
    expect(d.set).toEqual(wanted);
  });

  test("a marker of another binary or of other variables does not hold a new build or new settings back", () => {
    expect(decideRuntimeEnv({ wanted, env, binary, marker: { binary: `${binary}x`, set: wanted } }).action).toBe("exec");
    expect(decideRuntimeEnv({ wanted, env, binary, marker: { binary, set: { BUN_GC_TIMER_DISABLE: "1" } } }).action).toBe("exec");
    expect(decideRuntimeEnv({ wanted, env, binary, marker: { binary, set: { ...wanted, BUN_GC_TIMER_DISABLE: "0" } } }).action).toBe("exec");
  });
});

test("parseReexecMarker reads what the agent writes and ignores anything else", () => {
  expect(parseReexecMarker(JSON.stringify({ binary, set: wanted }))).toEqual({ binary, set: wanted });
  for (const bad of ["", "{", "null", "[]", JSON.stringify({ binary }), JSON.stringify({ binary, set: { A: 1 } }), JSON.stringify({ binary: 1, set: {} })]) {
    expect(parseReexecMarker(bad)).toBeUndefined();
  }
});
