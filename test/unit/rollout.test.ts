// The pure parts of fleet rollouts: settings on the Secret, budget arithmetic, maintenance windows (time
// zones, daylight saving, past midnight), label selectors, and which plans are disruptive.
import { describe, expect, test } from "bun:test";
import { parseRolloutSettings, rolloutKeys } from "../../src/api/rollout.ts";
import { budgetSlots } from "../../src/rollout/pool.ts";
import { matches, parseSelector } from "../../src/api/selector.ts";
import { inWindow, nextOpening, openWindow, parseWindows, type Window } from "../../src/api/windows.ts";
import { carriesOf, changesOf, disruptedUnits, disruptionOf } from "../../src/plan/disruption.ts";
import type { Desired } from "../../src/api/desired.ts";
import type { Plan } from "../../src/api/plan.ts";
import { prng } from "../harness/prng.ts";

const src = "Secret kube-system/pool";
const settings = (a: Record<string, string>) => parseRolloutSettings(a, src);
const ok = <T>(r: { ok: true; value: T } | { ok: false; errors: string[] }): T => {
  if (!r.ok) throw new Error(r.errors.join("\n"));
  return r.value;
};

describe("rollout settings on the Secret", () => {
  test("none: nothing changes (no budget, no windows, no canary)", () => {
    expect(ok(settings({ "other/annotation": "x" }))).toEqual({ disruptiveUnits: ["*"], settleMs: 60_000, healthTimeoutMs: 300_000, probeTimeoutMs: 10_000, rollback: false, serialHoldLimitMs: 600_000 });
  });

  test("all of them", () => {
    const s = ok(
      settings({
        [rolloutKeys.maxDisrupted]: "10%",
        [rolloutKeys.disruptiveUnits]: "kubelet.service, app-*.service",
        [rolloutKeys.settleTime]: "45s",
        [rolloutKeys.healthTimeout]: "10m",
        [rolloutKeys.probe]: "exec /usr/bin/test -e /run/ok",
        [rolloutKeys.probeTimeout]: "2s",
        [rolloutKeys.rollback]: "true",
        [rolloutKeys.windows]: "Mon-Fri 22:00-06:00 Europe/Berlin",
        [rolloutKeys.canary]: "pool.example/canary=true",
      }),
    );
    expect(s).toMatchObject({ budget: { percent: 10 }, disruptiveUnits: ["kubelet.service", "app-*.service"], settleMs: 45_000, healthTimeoutMs: 600_000, probeTimeoutMs: 2000, rollback: true });
    expect(s.probe).toEqual({ kind: "exec", argv: ["/usr/bin/test", "-e", "/run/ok"] });
    expect(s.windows?.[0]?.zone).toBe("Europe/Berlin");
    expect(s.canary?.text).toBe("pool.example/canary=true");
  });

  test.each([
    [{ [rolloutKeys.maxDisrupted]: "0" }, `${src}: annotation ${rolloutKeys.maxDisrupted}: "0" is not a number of nodes (≥ 1) or a percentage (1%–100%)`],
    [{ [rolloutKeys.maxDisrupted]: "0%" }, "is not a number of nodes"],
    [{ [rolloutKeys.maxDisrupted]: "101%" }, "is not a number of nodes"],
    [{ [rolloutKeys.maxDisrupted]: "-1" }, "is not a number of nodes"],
    [{ [rolloutKeys.maxDisrupted]: "one" }, "is not a number of nodes"],
    [{ [`${"rollout.trellis.dev/"}max-disruption`]: "1" }, "annotation rollout.trellis.dev/max-disruption: unknown setting"],
    [{ [rolloutKeys.rollback]: "true" }, `annotation ${rolloutKeys.rollback}: takes effect only with ${rolloutKeys.maxDisrupted}`],
    [{ [rolloutKeys.maxDisrupted]: "1", [rolloutKeys.rollback]: "yes" }, '"yes" is not "true" or "false"'],
    [{ [rolloutKeys.maxDisrupted]: "1", [rolloutKeys.settleTime]: "soon" }, `annotation ${rolloutKeys.settleTime}: "soon" is not a duration`],
    [{ [rolloutKeys.maxDisrupted]: "1", [rolloutKeys.settleTime]: "10m" }, `annotation ${rolloutKeys.healthTimeout}: must be longer than the settle time`],
    [{ [rolloutKeys.maxDisrupted]: "1", [rolloutKeys.probe]: "curl localhost" }, 'is neither "http(s)://…" nor "exec /absolute/command [args…]"'],
    [{ [rolloutKeys.maxDisrupted]: "1", [rolloutKeys.probe]: "exec ./relative" }, "is neither"],
    [{ [rolloutKeys.windows]: "Mon-Fri 22:00-06:00 Europe/Atlantis" }, `annotation ${rolloutKeys.windows}: window "Mon-Fri 22:00-06:00 Europe/Atlantis": "Europe/Atlantis" is not a time zone`],
    [{ [rolloutKeys.windows]: "Funday 10:00-11:00" }, '"Funday" is not a day'],
    [{ [rolloutKeys.windows]: "Mon 10:00-10:00" }, "is empty"],
    [{ [rolloutKeys.windows]: "Mon 9:00-10:00" }, "is not a time range"],
    [{ [rolloutKeys.windows]: "Mon 10:00-24:01" }, "is not a time range"],
    [{ [rolloutKeys.windows]: " ; " }, "no window in it"],
    [{ [rolloutKeys.canary]: "a in (b" }, `annotation ${rolloutKeys.canary}: "a in (b": unbalanced parentheses`],
    [{ [rolloutKeys.canary]: "a==b==c" }, "not a requirement"],
    [{ [rolloutKeys.canary]: "-bad-=x" }, "not a label key"],
    [{ [rolloutKeys.disruptiveUnits]: "kubelet service" }, "is not a comma-separated list of unit name patterns"],
  ])("bad: %j", (a, message) => {
    const r = settings(a);
    expect(r.ok).toBe(false);
    if (!r.ok) expect(r.errors.join("\n")).toContain(message);
  });

  test("every problem at once, each naming its annotation", () => {
    const r = settings({ [rolloutKeys.maxDisrupted]: "0", [rolloutKeys.windows]: "x", [rolloutKeys.canary]: "!" });
    if (r.ok) throw new Error("accepted");
    expect(r.errors.map((e) => /annotation (\S+):/.exec(e)?.[1])).toEqual([rolloutKeys.maxDisrupted, rolloutKeys.windows, rolloutKeys.canary]);
  });
});

describe("budget arithmetic", () => {
  test.each([
    ["1", 3, 1],
    ["3", 3, 3],
    ["10%", 50, 5],
    ["10%", 9, 1], // rounded down, but at least one node may move
    ["5%", 50, 2],
    ["100%", 7, 7],
    ["34%", 3, 1],
  ])("%s of %i nodes → %i slot(s)", (text, pool, k) => {
    const budget = ok(settings({ [rolloutKeys.maxDisrupted]: text })).budget;
    expect(budget && budgetSlots(budget, pool)).toBe(k);
  });

  test("a count above the pool's size (autoscaled below it) is the pool's size: disruptive updates go on (issue 19 item 8)", () => {
    const budget = ok(settings({ [rolloutKeys.maxDisrupted]: "4" })).budget;
    expect(budget && budgetSlots(budget, 3)).toBe(3);
  });

  test("property: a percentage never gives 0 slots nor more than the pool", () => {
    const rand = prng(7);
    for (let i = 0; i < 2000; i++) {
      const pool = 1 + rand.int(2000);
      const pct = 1 + rand.int(100);
      const k = budgetSlots({ text: `${pct}%`, percent: pct }, pool);
      expect(k).toBeGreaterThanOrEqual(1);
      expect(k).toBeLessThanOrEqual(pool);
      expect(k).toBe(Math.max(1, Math.floor((pct * pool) / 100)));
    }
  });
});

describe("maintenance windows", () => {
  const windows = (text: string): Window[] => ok(parseWindows(text));
  const at = (iso: string) => new Date(iso);

  test("days, ranges, lists and names", () => {
    expect([...(windows("Mon-Fri 10:00-11:00")[0]?.days ?? [])]).toEqual([1, 2, 3, 4, 5]);
    expect([...(windows("Fri-Mon 10:00-11:00")[0]?.days ?? [])].sort()).toEqual([0, 1, 5, 6]);
    expect([...(windows("Sat,Sunday 10:00-11:00")[0]?.days ?? [])].sort()).toEqual([0, 6]);
    expect(windows("daily 00:00-24:00")[0]?.days.size).toBe(7);
    expect(windows("Mon 10:00-11:00; Tue 12:00-13:00 Asia/Tokyo").map((w) => w.zone)).toEqual(["UTC", "Asia/Tokyo"]);
  });

  test("a range past midnight belongs to the day it starts on", () => {
    const [fri] = windows("Fri 22:00-06:00 UTC");
    if (!fri) throw new Error("no window");
    expect(inWindow(fri, at("2026-11-27T21:59:00Z"))).toBe(false); // Friday 21:59
    expect(inWindow(fri, at("2026-11-27T22:00:00Z"))).toBe(true);
    expect(inWindow(fri, at("2026-11-28T05:59:00Z"))).toBe(true); // Saturday morning
    expect(inWindow(fri, at("2026-11-28T06:00:00Z"))).toBe(false);
    expect(inWindow(fri, at("2026-11-28T22:30:00Z"))).toBe(false); // Saturday night is not Friday's
    expect(inWindow(fri, at("2026-11-27T03:00:00Z"))).toBe(false); // Friday morning belongs to Thursday
  });

  test("the zone's wall clock decides: 22:00 in Berlin is 21:00 UTC in winter, 20:00 in summer", () => {
    const [w] = windows("Mon-Sun 22:00-23:00 Europe/Berlin");
    if (!w) throw new Error("no window");
    expect(inWindow(w, at("2026-01-15T21:30:00Z"))).toBe(true);
    expect(inWindow(w, at("2026-01-15T20:30:00Z"))).toBe(false);
    expect(inWindow(w, at("2026-07-15T20:30:00Z"))).toBe(true);
    expect(inWindow(w, at("2026-07-15T21:30:00Z"))).toBe(false);
  });

  test("daylight saving: a window in the skipped hour is empty that night, one in the repeated hour opens on the first pass", () => {
    // Europe/Berlin: 2026-03-29 02:00 → 03:00 (skipped), 2026-10-25 03:00 → 02:00 (repeated).
    const [skipped] = windows("Sun 02:00-03:00 Europe/Berlin");
    if (!skipped) throw new Error("no window");
    const springNight = [...Array(24 * 60).keys()].map((m) => new Date(Date.parse("2026-03-28T22:00:00Z") + m * 60_000));
    expect(springNight.filter((d) => inWindow(skipped, d))).toEqual([]);
    const opening = nextOpening([skipped], at("2026-03-28T22:00:00Z"));
    expect(opening?.toISOString()).toBe("2026-04-05T00:00:00.000Z"); // the next Sunday, 02:00 CEST
    expect(nextOpening([skipped], at("2026-10-24T22:00:00Z"))?.toISOString()).toBe("2026-10-25T00:00:00.000Z"); // 02:00 CEST, first pass
    const autumnNight = [...Array(6 * 60).keys()].map((m) => new Date(Date.parse("2026-10-24T22:00:00Z") + m * 60_000));
    expect(autumnNight.filter((d) => inWindow(skipped, d)).length).toBe(120); // both passes of 02:00-03:00
  });

  test("the next opening, and none when already in a window", () => {
    const ws = windows("Sat 10:00-11:00 UTC; Wed 18:00-19:00 America/New_York");
    expect(openWindow(ws, at("2026-11-28T10:30:00Z"))?.text).toBe("Sat 10:00-11:00 UTC");
    expect(nextOpening(ws, at("2026-11-25T12:00:00Z"))?.toISOString()).toBe("2026-11-25T23:00:00.000Z"); // Wed 18:00 EST
    expect(nextOpening(ws, at("2026-11-26T00:30:00Z"))?.toISOString()).toBe("2026-11-28T10:00:00.000Z");
  });
});

describe("label selectors", () => {
  test.each([
    ["a=b", { a: "b" }, true],
    ["a==b", { a: "c" }, false],
    ["a!=b", {}, true],
    ["a!=b", { a: "b" }, false],
    ["a", { a: "" }, true],
    ["!a", { a: "x" }, false],
    ["!a", {}, true],
    ["a in (x, y),b notin (z)", { a: "y" }, true],
    ["a in (x,y),b notin (z)", { a: "y", b: "z" }, false],
    ["pool.example/canary=true,kubernetes.io/hostname in (n1,n2)", { "pool.example/canary": "true", "kubernetes.io/hostname": "n2" }, true],
    ["", {}, false],
  ])("%p on %j → %p", (text, labels, expected) => {
    const s = parseSelector(text);
    if (!s.ok) {
      expect(expected).toBe(false);
      return;
    }
    expect(matches(s.value, labels)).toBe(expected);
  });
});

describe("disruptive plans", () => {
  const plan = (steps: Plan["steps"]): Plan => ({ checksum: "c", steps });
  const restart = (unit: string) => ({ kind: "restart" as const, unit, reason: "r" });
  const write = { kind: "write" as const, target: { type: "file" as const }, path: "/etc/x", mode: 0o644, sha256: "s", reason: "r" };

  test("a file no unit lists disrupts nothing", () => {
    expect(disruptedUnits(plan([write]), ["*"])).toEqual([]);
  });
  test("any restart or stop counts by default; enabling alone does not", () => {
    expect(disruptedUnits(plan([write, restart("web.service"), { kind: "stop", unit: "old.service", reason: "r" }, { kind: "enable", unit: "new.service", reason: "r" }]), ["*"])).toEqual(["web.service", "old.service"]);
  });
  test("with narrower patterns, kubelet and containerd still count", () => {
    const p = plan([restart("web.service"), restart("app-1.service"), restart("kubelet.service"), restart("containerd.service")]);
    expect(disruptedUnits(p, ["app-?.service"])).toEqual(["app-1.service", "kubelet.service", "containerd.service"]);
    expect(disruptedUnits(p, [])).toEqual(["kubelet.service", "containerd.service"]);
  });
  test("issue 19 item 9: a file a running process reads without a restart disrupts (static pod manifest, hosts.toml, CNI config); others do not", () => {
    const at = (path: string) => ({ ...write, path });
    const removed = { kind: "remove" as const, target: { type: "file" as const }, path: "/etc/cni/net.d/10-bridge.conflist", reason: "r" };
    const p = plan([at("/etc/kubernetes/manifests/kube-apiserver.yaml"), at("/etc/containerd/certs.d/registry.example/hosts.toml"), removed, at("/etc/kubernetes/manifests.bak"), at("/etc/x")]);
    expect(disruptionOf(p, ["*"])).toEqual({ units: [], paths: ["/etc/kubernetes/manifests/kube-apiserver.yaml", "/etc/containerd/certs.d/registry.example/hosts.toml", "/etc/cni/net.d/10-bridge.conflist"] });
  });
  test("what a plan changes: one digest per file written (with its content) or removed, the same whatever else the plan holds", () => {
    const bad = { ...write, path: "/etc/kubelet.conf", sha256: "bad" };
    const alone = changesOf(plan([bad, restart("kubelet.service")]));
    expect(alone).toHaveLength(1);
    const withMore = changesOf(plan([{ ...write, path: "/etc/token", sha256: "t2" }, bad, restart("kubelet.service")]));
    expect(withMore).toContain(alone[0] as string);
    expect(changesOf(plan([{ ...bad, sha256: "fixed" }]))).not.toContain(alone[0] as string);
    expect(changesOf(plan([{ kind: "remove", target: { type: "file" }, path: "/etc/kubelet.conf", reason: "r" }]))).not.toContain(alone[0] as string);
  });
  test("what the node is left with: every file, unit and drop-in of the desired state, digested as its write is", () => {
    const desired: Desired = {
      files: [{ path: "/etc/kubelet.conf", mode: 0o600, content: new Uint8Array(), sha256: "bad", origin: "o" }],
      units: [{ name: "kubelet.service", content: "", sha256: "u1", enable: true, dropIns: [{ name: "10-x.conf", content: "", sha256: "d1" }], filePaths: [] }],
      unsupported: [],
      keep: [],
    };
    const carried = carriesOf(desired);
    expect(carried).toHaveLength(3);
    expect(carried).toContain(changesOf(plan([{ ...write, path: "/etc/kubelet.conf", sha256: "bad" }]))[0] as string);
    expect(carried).toContain(changesOf(plan([{ ...write, target: { type: "unit", unit: "kubelet.service" }, path: "/etc/systemd/system/kubelet.service", sha256: "u1" }]))[0] as string);
    expect(carried).toContain(changesOf(plan([{ ...write, target: { type: "drop-in", unit: "kubelet.service", name: "10-x.conf" }, path: "/etc/systemd/system/kubelet.service.d/10-x.conf", sha256: "d1" }]))[0] as string);
  });
});
