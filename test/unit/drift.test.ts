import { describe, expect, test } from "bun:test";
import { emptyOwned } from "../../src/api/state.ts";
import { unitNameOfPath } from "../../src/host/systemd.ts";
import { driftInSteps, fileDrift, pathsUnder, recurringDrift, watchedDirs, writtenPaths } from "../../src/plan/drift.ts";

const sha = (c: string) => c.repeat(64);

describe("drift", () => {
  test("written paths: OSC files with their mode, unit files and drop-ins without", () => {
    const owned = emptyOwned();
    owned.files["/etc/web/index.html"] = { sha256: sha("a"), mode: 0o644 };
    owned.units["web.service"] = { sha256: sha("b"), dropIns: { "10-restart.conf": sha("c") } };
    owned.units["kubelet.service"] = { dropIns: {} }; // a host unit trellis only enables: no file of its own
    expect([...writtenPaths(owned)]).toEqual([
      ["/etc/web/index.html", { sha256: sha("a"), mode: 0o644 }],
      ["/etc/systemd/system/web.service", { sha256: sha("b") }],
      ["/etc/systemd/system/web.service.d/10-restart.conf", { sha256: sha("c") }],
    ]);
  });

  test("what differed: missing, content, mode, content and mode; nothing", () => {
    const want = { sha256: sha("a"), mode: 0o644 };
    expect(fileDrift("/f", want, undefined)).toMatchObject({ kind: "missing", detail: "/f: missing (deleted or not a regular file)" });
    expect(fileDrift("/f", want, { sha256: sha("b"), mode: 0o644 })).toEqual({
      target: "/f",
      kind: "content",
      detail: "/f: content differs (sha256 bbbbbbbbbbbb on disk, aaaaaaaaaaaa applied)",
    });
    expect(fileDrift("/f", want, { sha256: sha("a"), mode: 0o100600 })).toEqual({ target: "/f", kind: "mode", detail: "/f: mode 0600, applied 0644" });
    expect(fileDrift("/f", want, { sha256: sha("b"), mode: 0o600 })?.detail).toEndWith("; mode 0600, applied 0644");
    expect(fileDrift("/f", want, { sha256: sha("a"), mode: 0o100644 })).toBeUndefined();
    // A unit file's mode is not recorded: only its content counts.
    expect(fileDrift("/u", { sha256: sha("a") }, { sha256: sha("a"), mode: 0o777 })).toBeUndefined();
  });

  test("one watch per parent directory, bounded; what did not fit is named", () => {
    const paths = ["/etc/a/1", "/etc/a/2", "/etc/b/1", "/etc/c/1", "/etc/c/2"];
    expect(watchedDirs(paths, 10)).toEqual({ dirs: ["/etc/a", "/etc/b", "/etc/c"], unwatched: [] });
    expect(watchedDirs(paths, 2)).toEqual({ dirs: ["/etc/a", "/etc/b"], unwatched: ["/etc/c/1", "/etc/c/2"] });
  });

  test("an event in a directory concerns everything below it (a removed drop-in directory too)", () => {
    const paths = ["/etc/systemd/system/web.service", "/etc/systemd/system/web.service.d/10.conf", "/etc/systemd/systemx/y", "/etc/web/index.html"];
    expect(pathsUnder(paths, "/etc/systemd/system")).toEqual(paths.slice(0, 2));
  });

  test("recurring: N repairs of one target within the window; clears as they age out", () => {
    const history = new Map([
      ["/etc/f", [0, 1000, 2000]],
      ["/etc/g", [500]],
    ]);
    expect(recurringDrift(history, 2500, 3, 10_000)).toEqual({ recurring: [{ target: "/etc/f", count: 3 }], nextChangeAtMs: 10_000 });
    expect(recurringDrift(history, 10_000, 3, 10_000)).toEqual({ recurring: [], nextChangeAtMs: 10_500 });
    expect(recurringDrift(history, 12_000, 3, 10_000)).toEqual({ recurring: [] });
    expect(history.size).toBe(0);
  });
});

test("a unit's name from its D-Bus object path", () => {
  expect(unitNameOfPath("/org/freedesktop/systemd1/unit/web_2eservice")).toBe("web.service");
  expect(unitNameOfPath("/org/freedesktop/systemd1/unit/system_2dgetty_2eslice")).toBe("system-getty.slice");
  expect(unitNameOfPath("/org/freedesktop/systemd1/unit/a_5fb_40x_2eservice")).toBe("a_b@x.service");
});

test("the drift a reconcile repaired on its own: its writes for drift, not those for an OSC change", () => {
  const write = (path: string, reason: string) => ({ kind: "write" as const, target: { type: "file" as const }, path, mode: 0o644, sha256: sha("a"), reason });
  expect(
    driftInSteps([
      write("/a", "missing on disk (drift)"),
      write("/b", "content on disk differs from what trellis wrote (drift)"),
      write("/c", "content changed"),
      write("/d", "new"),
      { kind: "daemon-reload", reason: "unit files changed: x.service" },
    ]),
  ).toEqual([
    { target: "/a", kind: "missing", detail: "/a: missing" },
    { target: "/b", kind: "content", detail: "/b: content differs from what trellis wrote" },
  ]);
});
