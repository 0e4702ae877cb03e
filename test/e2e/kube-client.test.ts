// The compiled binary connects to a real kube-apiserver the ways a node can be configured to:
// client certificate, bearer token (inline, token file, client-go's tokenFile), API server URL +
// CA + token file, and refuses a server its CA did not sign.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { readFileSync, writeFileSync } from "node:fs";
import { CoreV1Api } from "@kubernetes/client-node";
import { kubeFromConnection } from "../../src/kube/client.ts";
import { whoami } from "../../src/kube/whoami.ts";
import { trellisBinary } from "../harness/binary.ts";
import { type Cluster, startCluster } from "../harness/cluster.ts";
import { run, runOk } from "../harness/exec.ts";

let cluster: Cluster;
let bin: string;
let core: CoreV1Api;

beforeAll(async () => {
  [cluster, bin] = await Promise.all([startCluster({ controllerManager: false }), trellisBinary()]);
  core = cluster.admin().makeApiClient(CoreV1Api);
}, 180_000);
afterAll(async () => {
  await cluster?.stop();
});

async function trellisWhoami(...args: string[]) {
  return trellisWhoamiIn(undefined, ...args);
}
async function trellisWhoamiIn(cwd: string | undefined, ...args: string[]) {
  const r = await run([bin, "whoami", "--json", ...args], cwd ? { cwd } : {});
  return { ...r, me: r.code === 0 ? JSON.parse(r.stdout) : undefined };
}

/** A ServiceAccount token from the TokenRequest API: a real bearer token the server validates. */
async function serviceAccountToken(name: string): Promise<string> {
  await core.createNamespacedServiceAccount({ namespace: "default", body: { metadata: { name } } });
  const tr = await core.createNamespacedServiceAccountToken({ name, namespace: "default", body: { spec: { expirationSeconds: 3600, audiences: [] } } });
  return tr.status?.token as string;
}

function kubeconfig(file: string, user: Record<string, string>, cluster_: Record<string, string | boolean>) {
  writeFileSync(
    file,
    JSON.stringify({
      apiVersion: "v1",
      kind: "Config",
      clusters: [{ name: "c", cluster: cluster_ }],
      users: [{ name: "u", user }],
      contexts: [{ name: "x", context: { cluster: "c", user: "u" } }],
      "current-context": "x",
    }),
    { mode: 0o600 },
  );
  return file;
}

describe("trellis whoami against a real kube-apiserver", () => {
  test("connects with a client certificate", async () => {
    const { kubeconfig: kc } = await cluster.clientCertUser("gardener.cloud:node-agent:machine:m1", ["gardener.cloud:node-agents"]);
    const r = await trellisWhoami("--kubeconfig", kc);
    expect(r.stderr).toBe("");
    expect(r.me).toEqual({
      server: cluster.server,
      serverVersion: "v1.35.4",
      username: "gardener.cloud:node-agent:machine:m1",
      groups: expect.arrayContaining(["gardener.cloud:node-agents", "system:authenticated"]),
    });
  });

  test("connects with a client certificate through a NodeAgentConfiguration (--config-dir)", async () => {
    const { kubeconfig: kc } = await cluster.clientCertUser("node-agent-cfgdir");
    const dir = `${cluster.dir}/config-dir`;
    await runOk(["mkdir", "-p", dir]);
    writeFileSync(
      `${dir}/config.yaml`,
      `apiVersion: nodeagent.config.gardener.cloud/v1alpha1
kind: NodeAgentConfiguration
clientConnection: {kubeconfig: ${kc}}
controllers:
  operatingSystemConfig: {secretName: osc, kubernetesVersion: 1.35.4}
`,
    );
    const r = await trellisWhoami("--config-dir", dir);
    expect(r.me?.username).toBe("node-agent-cfgdir");
  });

  test("connects with a bearer token: inline, token-file, client-go tokenFile, and --server/--ca-file/--token-file", async () => {
    const token = await serviceAccountToken("bearer");
    const tokenFile = `${cluster.dir}/bearer.token`;
    writeFileSync(tokenFile, `${token}\n`, { mode: 0o600 });
    const ca = { server: cluster.server, "certificate-authority": cluster.caFile };
    const variants = [
      ["--kubeconfig", kubeconfig(`${cluster.dir}/inline.kubeconfig`, { token }, ca)],
      ["--kubeconfig", kubeconfig(`${cluster.dir}/token-file.kubeconfig`, { "token-file": tokenFile }, ca)],
      ["--kubeconfig", kubeconfig(`${cluster.dir}/tokenFile.kubeconfig`, { tokenFile }, ca)],
      ["--server", cluster.server, "--ca-file", cluster.caFile, "--token-file", tokenFile],
    ];
    for (const args of variants) {
      const r = await trellisWhoami(...args);
      expect({ args, stderr: r.stderr, user: r.me?.username }).toEqual({ args, stderr: "", user: "system:serviceaccount:default:bearer" });
    }
  });

  test("a rotated token file is picked up by a running client without a restart", async () => {
    const [first, second] = [await serviceAccountToken("rotate-a"), await serviceAccountToken("rotate-b")];
    const tokenFile = `${cluster.dir}/rotating.token`;
    writeFileSync(tokenFile, first);
    const kube = kubeFromConnection({ kind: "token-file", server: cluster.server, ca: { file: cluster.caFile }, tokenFile });
    expect((await whoami(kube)).username).toBe("system:serviceaccount:default:rotate-a");
    writeFileSync(tokenFile, `${second}\n`);
    expect((await whoami(kube)).username).toBe("system:serviceaccount:default:rotate-b");
  });

  test("the CA as data (an older Gardener's apiServer.caBundle) verifies the server like the CA file", async () => {
    const tokenFile = `${cluster.dir}/ca-data.token`;
    writeFileSync(tokenFile, await serviceAccountToken("ca-data"));
    const kube = kubeFromConnection({ kind: "token-file", server: cluster.server, ca: { data: readFileSync(cluster.caFile, "utf8") }, tokenFile });
    expect(kube.caSource).toBe("the configured CA");
    expect((await whoami(kube)).username).toBe("system:serviceaccount:default:ca-data");
  });

  test("a token the server rejects is reported as such", async () => {
    const tokenFile = `${cluster.dir}/bogus.token`;
    writeFileSync(tokenFile, "abcdef.0123456789abcdef");
    const r = await trellisWhoami("--server", cluster.server, "--ca-file", cluster.caFile, "--token-file", tokenFile);
    expect(r.code).toBe(1);
    expect(r.stderr).toContain(`${cluster.server} did not accept trellis's credentials (401 Unauthorized)`);
  });

  test("refuses a server whose certificate is not signed by the configured CA", async () => {
    const otherCa = `${cluster.dir}/other-ca.crt`;
    await runOk(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", `${cluster.dir}/other-ca.key`, "-out", otherCa, "-days", "1", "-subj", "/CN=not-the-cluster-ca"]);
    const { certFile, keyFile } = await cluster.clientCertUser("wrong-ca-user");
    const kc = kubeconfig(`${cluster.dir}/wrong-ca.kubeconfig`, { "client-certificate": certFile, "client-key": keyFile }, { server: cluster.server, "certificate-authority": otherCa });
    // A .env in the working directory must not switch verification off (the binary never reads .env).
    const cwd = `${cluster.dir}/with-dotenv`;
    await runOk(["mkdir", "-p", cwd]);
    writeFileSync(`${cwd}/.env`, "NODE_TLS_REJECT_UNAUTHORIZED=0\n");
    const r = await trellisWhoamiIn(cwd, "--kubeconfig", kc);
    expect(r.code).toBe(1);
    expect(r.stdout).toBe("");
    expect(r.stderr).toContain(`refusing ${cluster.server}: its TLS certificate is not signed by the CA in ${otherCa}`);

    // With no CA configured at all the system trust store applies, which does not know the cluster CA either.
    const token = `${cluster.dir}/bearer.token`;
    const noCa = kubeconfig(`${cluster.dir}/no-ca.kubeconfig`, { "token-file": token }, { server: cluster.server });
    const r2 = await trellisWhoami("--kubeconfig", noCa);
    expect(r2.code).toBe(1);
    expect(r2.stderr).toContain("its TLS certificate is not signed by the CA in the system trust store");
  });
});
