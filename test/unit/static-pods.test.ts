// Whether an OSC's static pods are rolled out and Ready (src/plan/static-pods.ts), the decision gardener-node-agent
// makes before it sets checksum/cloud-config-data (v1.150.0 reconciler.go, ensureStaticPodsReconciledAndReady).
import { describe, expect, test } from "bun:test";
import type { DesiredFile } from "../../src/api/desired.ts";
import { desiredStaticPods, type MirrorPod, staticPodsWaiting } from "../../src/plan/static-pods.ts";

const file = (path: string, text: string): DesiredFile => ({ path, mode: 0o640, content: new TextEncoder().encode(text), sha256: "", origin: `status.extensionFiles[0] (${path})` });
const manifest = (name: string, hash?: string) =>
  `apiVersion: v1\nkind: Pod\nmetadata:\n  name: ${name}\n  namespace: kube-system\n  labels: {static-pod: "true"}\n${hash === undefined ? "" : `  annotations: {gardener.cloud/config.mirror: "${hash}"}\n`}spec:\n  containers: [{name: c, image: i}]\n`;

describe("desiredStaticPods: which of the OSC's files are static pods", () => {
  test("files under /etc/kubernetes/manifests (a path prefix, as Gardener's) read as Pods: name → hash, none is the empty hash", () => {
    const pods = desiredStaticPods([
      file("/etc/kubernetes/manifests/kube-apiserver.yaml", manifest("kube-apiserver", "h1")),
      file("/etc/kubernetes/manifests/etcd.json", JSON.stringify({ apiVersion: "v1", kind: "Pod", metadata: { name: "etcd" } })),
      file("/etc/kubernetes/manifests-extra/x.yaml", manifest("x", "h3")),
      file("/etc/kubernetes/other/y.yaml", manifest("y", "h4")),
      file("/var/lib/kubelet/config.yaml", "kind: KubeletConfiguration\n"),
    ]);
    expect(pods).toEqual({ ok: true, value: new Map([["kube-apiserver", "h1"], ["etcd", ""], ["x", "h3"]]) });
  });
  test("a manifest without apiVersion and kind is a Pod (Go's decoder fills them in); an imageRef file is no static pod", () => {
    const imageRef: DesiredFile = { path: "/etc/kubernetes/manifests/img.yaml", mode: 0o640, content: { copyFrom: "/x", sha256: "s" }, sha256: "s", origin: "spec.files[1]" };
    expect(desiredStaticPods([file("/etc/kubernetes/manifests/a.yaml", "metadata: {name: a}\n"), imageRef])).toEqual({ ok: true, value: new Map([["a", ""]]) });
  });
  test("no manifests: no static pods", () => {
    expect(desiredStaticPods([file("/etc/x", "y")])).toEqual({ ok: true, value: new Map() });
  });
  test.each([
    ["another kind", "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: d}\n", "not a Pod: it is apps/v1 Deployment"],
    ["not YAML", "metadata: {name: [\n", "static pod manifest status.extensionFiles[0] (/etc/kubernetes/manifests/bad.yaml)"],
    ["a list", "- a\n- b\n", "not a Pod"],
    ["an annotation that is no string", "metadata: {name: a, annotations: {gardener.cloud/config.mirror: 12}}\n", "metadata.annotations.gardener.cloud/config.mirror"],
  ])("a manifest that is not a Pod is an error naming the file: %s", (_, text, message) => {
    const r = desiredStaticPods([file("/etc/kubernetes/manifests/bad.yaml", text)]);
    expect(r.ok).toBe(false);
    if (!r.ok) expect(r.errors.join("\n")).toContain(message);
  });
});

describe("staticPodsWaiting: rolled out (names and hashes equal) and every mirror pod Running and Ready", () => {
  const node = "cp-0";
  const mirror = (name: string, hash: string, o: Partial<MirrorPod> = {}): MirrorPod => ({ namespace: "kube-system", name: `${name}-${node}`, nodeName: node, hash, phase: "Running", ready: true, ...o });
  const want = new Map([
    ["kube-apiserver", "h1"],
    ["etcd", "e1"],
  ]);
  test.each<[string, MirrorPod[], string[]]>([
    ["rolled out, Running and Ready: nothing to wait for", [mirror("kube-apiserver", "h1"), mirror("etcd", "e1")], []],
    ["a Succeeded mirror pod that is Ready counts", [mirror("kube-apiserver", "h1", { phase: "Succeeded" }), mirror("etcd", "e1")], []],
    ["a mirror pod missing", [mirror("kube-apiserver", "h1")], ["etcd: no mirror pod yet"]],
    ["kubelet still runs the old manifest (another hash)", [mirror("kube-apiserver", "h0"), mirror("etcd", "e1")], ["kube-apiserver: mirror pod kube-system/kube-apiserver-cp-0 runs hash h0, the manifest has hash h1"]],
    ["a mirror pod without the hash annotation", [mirror("kube-apiserver", ""), mirror("etcd", "e1")], ["kube-apiserver: mirror pod kube-system/kube-apiserver-cp-0 runs no hash, the manifest has hash h1"]],
    [
      "a mirror pod of a static pod the OSC no longer has",
      [mirror("kube-apiserver", "h1"), mirror("etcd", "e1"), mirror("old", "o1")],
      ["old: mirror pod kube-system/old-cp-0 of a static pod the OSC does not have"],
    ],
    ["rolled out but Pending", [mirror("kube-apiserver", "h1", { phase: "Pending" }), mirror("etcd", "e1")], ["kube-system/kube-apiserver-cp-0: phase Pending"]],
    ["rolled out, Running, not Ready", [mirror("kube-apiserver", "h1"), mirror("etcd", "e1", { ready: false })], ["kube-system/etcd-cp-0: not Ready"]],
    ["Failed and not Ready: its phase is what is said", [mirror("kube-apiserver", "h1", { phase: "Failed", ready: false }), mirror("etcd", "e1")], ["kube-system/kube-apiserver-cp-0: phase Failed"]],
    ["readiness is looked at only once all are rolled out", [mirror("kube-apiserver", "h1", { ready: false })], ["etcd: no mirror pod yet"]],
  ])("%s", (_, pods, waiting) => {
    expect(staticPodsWaiting(want, pods)).toEqual(waiting);
  });
  test("the mirror pod's namespace does not matter, its name less -<node> does (as Gardener's map by name)", () => {
    expect(staticPodsWaiting(new Map([["web", ""]]), [{ ...mirror("web", ""), namespace: "default" }])).toEqual([]);
    expect(staticPodsWaiting(new Map([["web", ""]]), [{ ...mirror("web", ""), name: "web-other-node" }])).toEqual([
      "web: no mirror pod yet",
      "web-other-node: mirror pod kube-system/web-other-node of a static pod the OSC does not have",
    ]);
  });
});
