// Which in-place update an OSC change asks for (src/plan/in-place.ts), as gardener-node-agent v1.150
// computes it: only between two OSCs that both carry spec.inPlaceUpdates.
import { describe, expect, test } from "bun:test";
import { Buffer } from "node:buffer";
import type { V1Node } from "@kubernetes/client-node";
import * as v from "valibot";
import { awaitsResult, endsInPlace, mayUpdateInPlace } from "../../src/controllers/in-place.ts";
import { type OperatingSystemConfig, OperatingSystemConfigSchema } from "../../src/api/osc.ts";
import type { Plan, Step } from "../../src/api/plan.ts";
import { carryOver, cpuManagerState, hasInPlaceChanges, inPlaceChanges, kubeletConfigPath, noInPlaceChanges, osVersionOf, partsOf, removingCpuManagerState } from "../../src/plan/in-place.ts";

const SOURCE = "Secret kube-system/gardener-node-agent-worker";
const kubeletConfig = (extra = "") =>
  `apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\ncpuManagerPolicy: none\nmaxPods: 110\nevictionHard:\n  memory.available: 100Mi\n  nodefs.available: 5%\nkubeReserved:\n  cpu: 80m\n  memory: 1Gi\n${extra}`;

function osc(inPlace: Record<string, unknown> | undefined, config = kubeletConfig()): OperatingSystemConfig {
  return v.parse(OperatingSystemConfigSchema, {
    apiVersion: "extensions.gardener.cloud/v1alpha1",
    kind: "OperatingSystemConfig",
    spec: {
      files: [{ path: kubeletConfigPath, content: { inline: { encoding: "b64", data: Buffer.from(config).toString("base64") } } }],
      ...(inPlace ? { inPlaceUpdates: inPlace } : {}),
    },
  });
}
const base = { operatingSystemVersion: "12", kubelet: "1.34.3" };
const changes = (before: OperatingSystemConfig | undefined, after: OperatingSystemConfig, os = "12") => {
  const r = inPlaceChanges(before, after, os, SOURCE);
  if (!r.ok) throw new Error(r.errors.join("\n"));
  return r.value;
};

describe("in-place changes", () => {
  test("none on a fresh node, or unless both OSCs carry spec.inPlaceUpdates", () => {
    expect(changes(undefined, osc({ ...base, operatingSystemVersion: "13" }))).toEqual(noInPlaceChanges);
    expect(changes(osc(undefined), osc({ ...base, kubelet: "1.35.4" }))).toEqual(noInPlaceChanges);
    expect(changes(osc(base), osc(undefined))).toEqual(noInPlaceChanges);
  });

  test("nothing in place when only other things changed, or kubelet's patch version, or a setting that is not a rolling-update trigger", () => {
    const c = changes(osc(base), osc({ ...base, kubelet: "1.34.4" }, kubeletConfig("maxPods: 50\n").replace("maxPods: 110\n", "")));
    expect(c).toEqual(noInPlaceChanges);
    expect(hasInPlaceChanges(c)).toBe(false);
  });

  test("an OS update: the node's os-release version is not the OSC's (12 = 12.0)", () => {
    expect(changes(osc(base), osc({ ...base, operatingSystemVersion: "12.0" }))).toEqual(noInPlaceChanges);
    const c = changes(osc(base), osc({ ...base, operatingSystemVersion: "13" }));
    expect(c.operatingSystem).toEqual({ from: "12", to: "13" });
    expect(partsOf(c)).toEqual([{ part: "operatingSystem", what: "an OS update from 12 to 13" }]);
  });

  test("a kubelet minor version update, and kubelet settings Gardener rolls out in place", () => {
    expect(changes(osc(base), osc({ ...base, kubelet: "1.35.0" })).kubeletMinorVersion).toEqual({ from: "1.34.3", to: "1.35.0" });
    const reserved = changes(osc(base), osc(base, kubeletConfig().replace("cpu: 80m", "cpu: 90m")));
    expect(reserved).toEqual({ ...noInPlaceChanges, kubeletConfig: true });
    expect(changes(osc(base), osc(base, kubeletConfig().replace("memory.available: 100Mi", "memory.available: 200Mi"))).kubeletConfig).toBe(true);
    const policy = changes(osc(base), osc(base, kubeletConfig().replace("cpuManagerPolicy: none", "cpuManagerPolicy: static")));
    expect(policy).toEqual({ ...noInPlaceChanges, cpuManagerPolicy: true });
    expect(partsOf(policy)).toEqual([{ part: "kubelet", what: `a kubelet update (cpuManagerPolicy in ${kubeletConfigPath})` }]);
  });

  test("CA and service-account key rotations: a first or a new lastInitiationTime", () => {
    const ca = (t: string) => ({ ...base, credentialsRotation: { certificateAuthorities: { lastInitiationTime: t }, serviceAccountKey: { lastInitiationTime: null } } });
    expect(changes(osc(base), osc(ca("2026-11-25T10:00:00Z")))).toEqual({ ...noInPlaceChanges, certificateAuthorities: true });
    expect(changes(osc(ca("2026-11-25T10:00:00Z")), osc(ca("2026-11-25T10:00:00.000Z")))).toEqual(noInPlaceChanges);
    expect(changes(osc(ca("2026-11-25T10:00:00Z")), osc(ca("2026-11-26T10:00:00Z")))).toEqual({ ...noInPlaceChanges, certificateAuthorities: true });
    const sa = { ...base, credentialsRotation: { serviceAccountKey: { lastInitiationTime: "2026-11-25T11:00:00Z" } } };
    expect(partsOf(changes(osc(base), osc(sa)))).toEqual([{ part: "serviceAccountKey", what: "a service-account key rotation" }]);
  });

  test("errors name the source and field", () => {
    const r = inPlaceChanges(osc(base), osc({ ...base, operatingSystemVersion: "bookworm" }), undefined, SOURCE);
    expect(r).toEqual({ ok: false, errors: [`${SOURCE}: spec.inPlaceUpdates.operatingSystemVersion: the node's OS version cannot be read from /etc/os-release (PRETTY_NAME)`] });
    const noConfig = v.parse(OperatingSystemConfigSchema, { apiVersion: "extensions.gardener.cloud/v1alpha1", kind: "OperatingSystemConfig", spec: { inPlaceUpdates: base } });
    const r2 = inPlaceChanges(osc(base), noConfig, "12", SOURCE);
    expect(r2.ok ? [] : r2.errors).toEqual([`${SOURCE}: spec.files (${kubeletConfigPath}): an in-place update needs kubelet's configuration inline in spec.files`]);
  });

  test("the OS version as kubelet reads it: the first number in PRETTY_NAME", () => {
    expect(osVersionOf('PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\nNAME="Debian GNU/Linux"\nVERSION_ID="12"\n')).toBe("12");
    expect(osVersionOf('NAME="Garden Linux"\nPRETTY_NAME="Garden Linux 1592.1"\n')).toBe("1592.1");
    expect(osVersionOf("NAME=x\n")).toBeUndefined();
  });
});

describe("machine-controller-manager's part", () => {
  const node = (labels: Record<string, string>, reason?: string): V1Node => ({
    metadata: { labels },
    status: { conditions: reason ? [{ type: "InPlaceUpdate", status: "True", reason }] : [] },
  });
  test("an in-place update waits for the drain (InPlaceUpdate=ReadyForUpdate), unless its last attempt failed", () => {
    expect(mayUpdateInPlace(undefined)).toBe(false);
    expect(mayUpdateInPlace(node({}, "SelectedForUpdate"))).toBe(false);
    expect(mayUpdateInPlace(node({}, "ReadyForUpdate"))).toBe(true);
    expect(mayUpdateInPlace(node({ "node.machine.sapcloud.io/update-result": "failed" }))).toBe(true);
  });
  test("the result is told while machine-controller-manager waits for it, once", () => {
    expect(awaitsResult(node({}, "ReadyForUpdate"))).toBe(true);
    expect(awaitsResult(node({ "node.machine.sapcloud.io/update-result": "successful" }, "ReadyForUpdate"))).toBe(false);
    expect(awaitsResult(node({ "node.machine.sapcloud.io/update-result": "failed" }))).toBe(true);
    expect(awaitsResult(node({}))).toBe(false);
  });
});

describe("a new OSC while an older one's update is unfinished: what it owes is owed still (carryOver)", () => {
  const os = { from: "12", to: "13" };
  test("a failed OS update whose version the new OSC reverts: nothing in place (the OS update is told from the node's version alone)", () => {
    expect(carryOver({ ...noInPlaceChanges, operatingSystem: os }, noInPlaceChanges)).toEqual(noInPlaceChanges);
    expect(carryOver({ ...noInPlaceChanges, operatingSystem: os }, { ...noInPlaceChanges, operatingSystem: { from: "12", to: "14" } })).toEqual({ ...noInPlaceChanges, operatingSystem: { from: "12", to: "14" } });
  });
  test("a rotation or kubelet update not done yet stays, with the new OSC's own", () => {
    expect(carryOver({ ...noInPlaceChanges, certificateAuthorities: true }, { ...noInPlaceChanges, serviceAccountKey: true })).toEqual({ ...noInPlaceChanges, certificateAuthorities: true, serviceAccountKey: true });
    expect(carryOver({ ...noInPlaceChanges, cpuManagerPolicy: true }, noInPlaceChanges)).toEqual({ ...noInPlaceChanges, cpuManagerPolicy: true });
    const minor = (from: string, to: string) => ({ ...noInPlaceChanges, kubeletMinorVersion: { from, to } });
    expect(carryOver(minor("1.34.3", "1.35.0"), minor("1.35.0", "1.36.1"))).toEqual(minor("1.34.3", "1.36.1"));
    expect(carryOver(minor("1.34.3", "1.35.0"), { ...noInPlaceChanges, kubeletConfig: true })).toEqual({ ...minor("1.34.3", "1.35.0"), kubeletConfig: true });
  });
});

describe("the reconciles that end as gardener-node-agent's in-place one (endsInPlace): every new OSC of an in-place pool", () => {
  const inPlacePool = osc(base);
  test.each([
    ["an in-place pool's OSC the Node does not carry yet, in-place work or not", inPlacePool, "a", "b", true],
    ["a fresh node (no checksum on the Node)", inPlacePool, undefined, "b", true],
    ["the OSC the Node carries already (a re-check, drift repair)", inPlacePool, "b", "b", false],
    ["a pool without in-place updates", osc(undefined), "a", "b", false],
  ])("%s", (_what, o, nodeApplied, checksum, expected) => {
    expect(endsInPlace(o, nodeApplied, checksum)).toBe(expected);
  });
});

describe("kubelet's CPU manager state after a cpuManagerPolicy change (removingCpuManagerState)", () => {
  const write = (path: string, unit?: string): Step => ({ kind: "write", target: unit ? { type: "unit", unit } : { type: "file" }, path, mode: 0o600, sha256: "x", reason: "content changed" });
  const plan = (steps: Step[]): Plan => ({ checksum: "c", steps });
  const restartKubelet: Step = { kind: "restart", unit: "kubelet.service", reason: `file ${kubeletConfigPath} changed` };
  test("removed right after the writes (kubelet's configuration and unit), before any unit is touched", () => {
    const steps: Step[] = [
      write(kubeletConfigPath),
      write("/etc/systemd/system/kubelet.service", "kubelet.service"),
      { kind: "daemon-reload", reason: "unit files changed: kubelet.service" },
      { kind: "enable", unit: "kubelet.service", reason: "unit file written" },
      restartKubelet,
    ];
    const amended = removingCpuManagerState(plan(steps)).steps;
    expect(amended.map((s) => (s.kind === "write" || s.kind === "remove" ? `${s.kind} ${s.path}` : `${s.kind}${"unit" in s ? ` ${s.unit}` : ""}`))).toEqual([
      `write ${kubeletConfigPath}`,
      "write /etc/systemd/system/kubelet.service",
      `remove ${cpuManagerState}`,
      "daemon-reload",
      "enable kubelet.service",
      "restart kubelet.service",
    ]);
    expect(removingCpuManagerState(plan(amended)).steps).toEqual(amended);
  });
  test("not when the plan does not restart kubelet (gardener-node-agent: only when kubelet's unit changed)", () => {
    const p = plan([write("/etc/e2e/unrelated"), { kind: "restart", unit: "containerd.service", reason: "x" }]);
    expect(removingCpuManagerState(p)).toBe(p);
  });
});
