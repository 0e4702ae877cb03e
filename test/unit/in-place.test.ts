// Which in-place update an OSC change asks for (src/plan/in-place.ts), as gardener-node-agent v1.150
// computes it: only between two OSCs that both carry spec.inPlaceUpdates.
import { describe, expect, test } from "bun:test";
import { Buffer } from "node:buffer";
import type { V1Node } from "@kubernetes/client-node";
import * as v from "valibot";
import { awaitsResult, mayUpdateInPlace } from "../../src/controllers/in-place.ts";
import { type OperatingSystemConfig, OperatingSystemConfigSchema } from "../../src/api/osc.ts";
import { hasInPlaceChanges, inPlaceChanges, kubeletConfigPath, noInPlaceChanges, osVersionOf, partsOf } from "../../src/plan/in-place.ts";

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
