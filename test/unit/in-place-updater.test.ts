// The node's side of an in-place update (src/controllers/in-place.ts) as a reconcile of a new OSC of an
// in-place pool ends it, against a temporary root and a stand-in for the API server that records what the
// agent asks of it: machine-controller-manager is told the result whatever the OSC's in-place work was (as
// gardener-node-agent, reconciler.go performInPlaceUpdate), a service-account key rotation never fails on a
// token Secret, and each part is recorded done as it is. Against real components: test/e2e/in-place*.test.ts.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { Buffer } from "node:buffer";
import { mkdtempSync } from "node:fs";
import type { V1Node } from "@kubernetes/client-node";
import { parseOscBytes } from "../../src/api/desired.ts";
import { inPlaceStatePath, type InPlaceState } from "../../src/api/in-place-state.ts";
import { paths } from "../../src/api/paths.ts";
import { createInPlaceUpdater, type InPlaceUpdaterDeps } from "../../src/controllers/in-place.ts";
import { createFiles, type Files } from "../../src/host/files.ts";
import type { Kube } from "../../src/kube/client.ts";
import { createLogger } from "../../src/log.ts";
import { kubeletConfigPath, noInPlaceChanges } from "../../src/plan/in-place.ts";
import { runDir } from "../harness/exec.ts";
import { testKube } from "../harness/test-kube.ts";

type Call = { method: string; path: string; body?: unknown };
let calls: Call[] = [];
/** The Node as the API server has it (the agent's watch may lag it). */
let apiNode: V1Node;
let server: ReturnType<typeof Bun.serve>;
let kube: Kube;
const nodeName = "node-a";

beforeAll(() => {
  server = Bun.serve({
    port: 0,
    hostname: "127.0.0.1",
    async fetch(req) {
      const url = new URL(req.url);
      const body = req.method === "PATCH" ? await req.json() : undefined;
      calls.push({ method: req.method, path: `${url.pathname}${url.search}`, ...(body ? { body } : {}) });
      if (req.method === "GET" && url.pathname === `/api/v1/nodes/${nodeName}`) return Response.json(apiNode);
      if (req.method === "GET" && url.pathname === "/api/v1/pods") {
        return Response.json({ kind: "PodList", apiVersion: "v1", metadata: {}, items: [{ metadata: { namespace: "kube-system", name: "left-by-drain" }, spec: { nodeName } }] });
      }
      if (req.method === "DELETE") return Response.json({ kind: "Pod", apiVersion: "v1", metadata: { namespace: "kube-system", name: "left-by-drain" } });
      if (req.method === "PATCH") return Response.json({ kind: "Node", apiVersion: "v1", metadata: { name: nodeName } });
      return new Response("not found", { status: 404 });
    },
  });
  kube = testKube({ server: `http://127.0.0.1:${server.port}`, token: "t" });
});
afterAll(() => server?.stop(true));

const resultLabel = "node.machine.sapcloud.io/update-result";
const failedReason = "node.machine.sapcloud.io/update-failed-reason";
const updatingOs = "node-agent.gardener.cloud/updating-operating-system-version";

const drained = (labels: Record<string, string> = {}, annotations: Record<string, string> = {}): V1Node => ({
  metadata: { name: nodeName, labels, annotations },
  status: { conditions: [{ type: "InPlaceUpdate", status: "True", reason: "ReadyForUpdate" }] },
});

const kubeletConfig = Buffer.from("apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nmaxPods: 110\n").toString("base64");
const oscYaml = (version: string, extra = "") => `apiVersion: extensions.gardener.cloud/v1alpha1
kind: OperatingSystemConfig
spec:
  inPlaceUpdates: {operatingSystemVersion: "${version}", kubelet: 1.35.4}
  files:
  - path: ${kubeletConfigPath}
    content: {inline: {encoding: b64, data: ${kubeletConfig}}}
${extra}`;

async function setUp(node: V1Node, tokens: InPlaceUpdaterDeps["tokens"], certificate?: InPlaceUpdaterDeps["certificate"]) {
  calls = [];
  apiNode = { kind: "Node", apiVersion: "v1", ...node };
  const files: Files = createFiles(mkdtempSync(`${runDir("in-place-updater-unit")}/root-`));
  await files.writeAtomic("/etc/os-release", 'PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\n', 0o644);
  const updater = createInPlaceUpdater({
    kube,
    files,
    systemd: { restart: async () => {} },
    node: { current: () => node, subscribe: () => () => {}, found: Promise.resolve(node), listed: Promise.resolve() },
    log: createLogger({ write: () => {} }),
    tokens,
    certificate,
    apiServer: { server: "https://api.invalid", ca: { data: "" } },
    signal: new AbortController().signal,
    boot: () => "boot-1",
  });
  const state = async (): Promise<InPlaceState> => JSON.parse(new TextDecoder().decode((await files.read(inPlaceStatePath)) ?? new TextEncoder().encode("{}")));
  return { files, updater, state };
}

const noTokens = { resync: async () => [] };
const parse = (yaml: string) => {
  const r = parseOscBytes(new TextEncoder().encode(yaml), "test");
  if (!r.ok) throw new Error(r.errors.join("\n"));
  return r.value;
};

describe("the end of a reconcile of a new OSC of an in-place pool", () => {
  test("no in-place work, the node drained: the Pods left on it deleted, then update-result=successful with the failure's marks cleared", async () => {
    const { updater } = await setUp(drained(), noTokens);
    expect(await updater.finish("c2", noInPlaceChanges, undefined)).toBeUndefined();
    expect(calls.map((c) => `${c.method} ${c.path}`)).toEqual([
      `GET /api/v1/nodes/${nodeName}`,
      `GET /api/v1/pods?fieldSelector=${encodeURIComponent(`spec.nodeName=${nodeName}`)}`,
      "DELETE /api/v1/namespaces/kube-system/pods/left-by-drain",
      `PATCH /api/v1/nodes/${nodeName}`,
    ]);
    expect(calls[3]?.body).toEqual({ metadata: { labels: { [resultLabel]: "successful" }, annotations: { [failedReason]: null, [updatingOs]: null } } });
  });

  test("the watch's Node still without the result this agent reported a moment ago: the Node as it is now says so, and its Pods are not deleted again", async () => {
    const { updater } = await setUp(drained(), noTokens);
    apiNode = { ...apiNode, metadata: { ...apiNode.metadata, labels: { [resultLabel]: "successful" } } };
    expect(await updater.finish("c2", noInPlaceChanges, undefined)).toBeUndefined();
    expect(calls.map((c) => `${c.method} ${c.path}`)).toEqual([`GET /api/v1/nodes/${nodeName}`]);
  });

  test("no in-place work, machine-controller-manager not waiting (no drain, no failure): nothing asked of the API server", async () => {
    const { updater } = await setUp({ metadata: { name: nodeName }, status: { conditions: [] } }, noTokens);
    expect(await updater.finish("c2", noInPlaceChanges, undefined)).toBeUndefined();
    expect(calls).toEqual([]);
  });

  test("an OSC that reverts the version of a failed OS update: no in-place work left, and update-result=successful, the attempt forgotten", async () => {
    const node = drained({ [resultLabel]: "failed" }, { [failedReason]: "OS update might have failed and rolled back", [updatingOs]: "13" });
    const { files, updater, state } = await setUp(node, noTokens);
    // The failed update's OSC is the last applied one, its OS update recorded as pending and failed.
    await files.writeAtomic(paths.lastAppliedOsc, oscYaml("13"), 0o600);
    const failed: InPlaceState = { pending: { checksum: "c13", changes: { ...noInPlaceChanges, operatingSystem: { from: "12", to: "13" } } }, osUpdate: { version: "13", boot: "boot-1", finished: false, failed: "rolled back" } };
    await files.writeAtomic(inPlaceStatePath, JSON.stringify(failed), 0o600);
    const work = await updater.work(parse(oscYaml("12", "  units: []\n")), "c12", "test");
    expect(work).toEqual({ ok: true, value: noInPlaceChanges });
    expect(await updater.finish("c12", noInPlaceChanges, undefined)).toBeUndefined();
    expect(calls.at(-1)?.body).toEqual({ metadata: { labels: { [resultLabel]: "successful" }, annotations: { [failedReason]: null, [updatingOs]: null } } });
    expect(await state()).toEqual({});
  });

  test("a service-account key rotation whose token Secret is missing: done, update-result=successful (gardener-node-agent only asks its token controller to sync again)", async () => {
    const asked: string[] = [];
    const tokens = {
      resync: async () => {
        asked.push("resync");
        return ["/var/lib/gardener-node-agent/credentials/token: Secret kube-system/gardener-node-agent not found"];
      },
    };
    const { updater } = await setUp(drained(), tokens);
    expect(await updater.finish("c2", { ...noInPlaceChanges, serviceAccountKey: true }, undefined)).toBeUndefined();
    expect(asked).toEqual(["resync"]);
    expect(calls.at(-1)?.body).toMatchObject({ metadata: { labels: { [resultLabel]: "successful" } } });
  });

  test("each part is recorded done as it is: a CA rotation that fails after the service-account key rotation leaves only itself to do", async () => {
    const certificate = { renewNow: () => Promise.reject(new Error("the CSR was denied")) };
    const { updater } = await setUp(drained(), noTokens, certificate);
    const changes = { ...noInPlaceChanges, serviceAccountKey: true, certificateAuthorities: true };
    await updater.begin("c2", changes);
    const outcome = await updater.finish("c2", changes, undefined);
    expect(outcome).toEqual({ failed: "certificate authority rotation: the agent's client certificate: the CSR was denied", final: false });
    expect(calls.at(-1)?.body).toEqual({ metadata: { labels: { [resultLabel]: "failed" }, annotations: { [failedReason]: "certificate authority rotation: the agent's client certificate: the CSR was denied" } } });
    expect(await updater.work(parse(oscYaml("12")), "c2", "test")).toEqual({ ok: true, value: { ...noInPlaceChanges, certificateAuthorities: true } });
  });
});
