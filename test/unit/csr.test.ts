// The hand-built PKCS#10 request (verified by openssl, the reference reader), gardener-node-agent's CSR
// name, the pending request file, and the kubeconfigs the bootstrap and the renewal write.
import { describe, expect, test } from "bun:test";
import { writeFileSync } from "node:fs";
import { createPrivateKey, createPublicKey, generateKeyPairSync } from "node:crypto";
import { KubeConfig } from "@kubernetes/client-node";
import { agentUnitContent } from "../../src/api/agent-unit.ts";
import { createFiles } from "../../src/host/files.ts";
import { csrObjectName, machineName, newKeyAndRequest, nodeAgentSubject, pendingRequest } from "../../src/kube/csr.ts";
import { kubeconfigProblem, readClientCertificate, renderKubeconfig, renderTokenKubeconfig } from "../../src/kube/csr-kubeconfig.ts";
import { bitString, certificateRequest, integer, oid, sequence, utf8String } from "../../src/kube/csr-pem.ts";
import { createLogger } from "../../src/log.ts";
import { issueClientCert } from "../harness/certs.ts";
import { run, runDir } from "../harness/exec.ts";

const hex = (b: Uint8Array) => Buffer.from(b).toString("hex");
const quiet = createLogger({ write: () => {} });

describe("DER", () => {
  test.each([
    ["1.2.840.10045.4.3.2", "06082a8648ce3d040302"], // ecdsa-with-SHA256
    ["2.5.4.3", "0603550403"], // commonName
    ["1.2.840.113549.1.1.11", "06092a864886f70d01010b"], // sha256WithRSAEncryption: a 3-byte arc
  ])("OID %s", (dotted, want) => expect(hex(oid(dotted))).toBe(want));

  test.each([
    [0, "020100"],
    [127, "02017f"],
    [128, "02020080"], // a high bit would mean negative: a leading zero byte
    [256, "02020100"],
  ])("INTEGER %d", (n, want) => expect(hex(integer(n))).toBe(want));

  test("lengths: short form below 128 bytes, long form above", () => {
    expect(hex(utf8String("a".repeat(127))).slice(0, 4)).toBe("0c7f");
    expect(hex(utf8String("a".repeat(128))).slice(0, 6)).toBe("0c8180");
    const big = sequence(bitString(new Uint8Array(300)));
    expect(hex(big.subarray(0, 4))).toBe("30820131"); // 305 = 0x0131: 4 + 301
    expect(hex(big.subarray(4, 8))).toBe("0382012d"); // 301 = 0x012d: 1 unused-bits byte + 300
  });
});

/** openssl's reading of a PEM CSR: the text dump with its verdict on the self-signature ("verify OK"). */
async function openssl(pem: string): Promise<{ code: number; text: string }> {
  const file = `${runDir("csr-unit")}/req-${Math.random().toString(36).slice(2)}.pem`;
  writeFileSync(file, pem);
  const r = await run(["openssl", "req", "-verify", "-noout", "-text", "-in", file]);
  return { code: r.code, text: r.stdout + r.stderr };
}

describe("the certificate request", () => {
  test("openssl verifies it and reads the node agent's subject, an EC P-256 key and ecdsa-with-SHA256", async () => {
    const { privateKey } = generateKeyPairSync("ec", { namedCurve: "P-256" });
    const { pem } = certificateRequest(privateKey, nodeAgentSubject("machine-1"));
    expect(pem).toStartWith("-----BEGIN CERTIFICATE REQUEST-----\n");
    const { code, text } = await openssl(pem);
    expect(text).toContain("verify OK");
    expect(code).toBe(0);
    expect(text).toContain("Subject: O = gardener.cloud:node-agents, CN = gardener.cloud:node-agent:machine:machine-1");
    expect(text).toContain("Public Key Algorithm: id-ecPublicKey");
    expect(text).toContain("NIST CURVE: P-256");
    expect(text).toContain("Signature Algorithm: ecdsa-with-SHA256");
    expect(text).toContain("Attributes:");
    // The public key in the request is the key's own.
    const spki = createPublicKey(privateKey).export({ type: "spki", format: "pem" }).toString();
    const file = `${runDir("csr-unit")}/pub.pem`;
    writeFileSync(file, pem);
    const r = await run(["openssl", "req", "-pubkey", "-noout", "-in", file]);
    expect(r.stdout).toBe(spki);
  });

  test("several organizations and a UTF-8 name survive; a long subject takes the long length form", async () => {
    const { privateKey } = generateKeyPairSync("ec", { namedCurve: "P-256" });
    const cn = `gardener.cloud:node-agent:machine:${"m".repeat(150)}-größe`;
    const { pem } = certificateRequest(privateKey, { commonName: cn, organizations: ["a", "b:c"] });
    const { code, text } = await openssl(pem);
    expect(code).toBe(0);
    expect(text).toContain("verify OK");
    expect(text).toContain("O = a, O = b:c, CN = gardener.cloud:node-agent:machine:mmm");
    expect(text).toContain("-gr\\C3\\B6\\C3\\9Fe"); // openssl escapes the UTF-8 bytes of ö and ß
  });

  test("a tampered request fails openssl's verification", async () => {
    const { privateKey } = generateKeyPairSync("ec", { namedCurve: "P-256" });
    const { der } = certificateRequest(privateKey, nodeAgentSubject("m1"));
    const bad = Buffer.from(der);
    const at = bad.indexOf(Buffer.from("m1")); // inside the signed part
    bad[at] = "n".charCodeAt(0);
    const pem = `-----BEGIN CERTIFICATE REQUEST-----\n${bad.toString("base64").match(/.{1,64}/g)?.join("\n")}\n-----END CERTIFICATE REQUEST-----\n`;
    // openssl 3.0 exits 0 either way: its verdict is the line it prints.
    const { text } = await openssl(pem);
    expect(text).toContain("verify failure");
    expect(text).not.toContain("verify OK");
  });

  test("only EC P-256 keys and a common name are accepted", () => {
    const rsa = generateKeyPairSync("rsa", { modulusLength: 1024 }).privateKey;
    expect(() => certificateRequest(rsa, nodeAgentSubject("m"))).toThrow("EC P-256");
    const p384 = generateKeyPairSync("ec", { namedCurve: "P-384" }).privateKey;
    expect(() => certificateRequest(p384, nodeAgentSubject("m"))).toThrow("EC P-256");
    const p256 = generateKeyPairSync("ec", { namedCurve: "P-256" }).privateKey;
    expect(() => certificateRequest(p256, { commonName: "", organizations: [] })).toThrow("common name");
  });
});

describe("the CSR's name", () => {
  // Computed with gardener-node-agent's ComputeDigestedName (Go: sha512.New512_256, RawURLEncoding) for this key.
  const keyPem = `-----BEGIN PRIVATE KEY-----
MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQgUXEU0gizFNpFZVDk
aIhDL7WkSdu4TY8HncD7F84qUdahRANCAASFcMlPHkW3BFYdsBcWKJr7OdzKcdAL
D2mEjbaV4VFjrmnkaD2hQZIEdj+B+narg6VFHyntI2IEUiP7QeaUx0v3
-----END PRIVATE KEY-----
`;

  test("is gardener-node-agent's digest of key, subject and usages", () => {
    const spki = createPublicKey(createPrivateKey(keyPem)).export({ type: "spki", format: "der" });
    expect(csrObjectName(spki, nodeAgentSubject("m1"))).toBe("node-agent-csr-akX5XUl-OkNEU1_xr01qK7OERZAn5DlVyfoF-PkXOZw");
  });

  test("differs per key and per machine", () => {
    const a = newKeyAndRequest("m1");
    const b = newKeyAndRequest("m1");
    expect(a.name).toMatch(/^node-agent-csr-[A-Za-z0-9_-]{43}$/);
    expect(a.name).not.toBe(b.name);
    const spki = createPublicKey(createPrivateKey(a.keyPem)).export({ type: "spki", format: "der" });
    expect(csrObjectName(spki, nodeAgentSubject("m2"))).not.toBe(a.name);
    expect(a.keyPem).toStartWith("-----BEGIN EC PRIVATE KEY-----"); // SEC1, as gardener-node-agent writes it
  });
});

describe("the pending request", () => {
  test("is written 0600, read back by the next run for the same machine, replaced for another", async () => {
    const files = createFiles(runDir("csr-pending"));
    const path = "/var/lib/gardener-node-agent/credentials/csr-pending.json";
    const first = await pendingRequest(files, "m1", quiet, path);
    expect((await files.stat(path))?.mode).toBe(0o600);
    expect(await pendingRequest(files, "m1", quiet, path)).toEqual(first);
    const other = await pendingRequest(files, "m2", quiet, path);
    expect(other.name).not.toBe(first.name);
    await files.writeAtomic(path, "{not json", 0o600);
    expect((await pendingRequest(files, "m2", quiet, path)).name).not.toBe(other.name);
  });

  test("the machine name is the machine-name file's first line, else the host name", async () => {
    const files = createFiles(runDir("csr-machine"));
    expect(await machineName(files, "host-1")).toBe("host-1");
    await files.writeAtomic("/var/lib/gardener-node-agent/machine-name", "shoot--p--s-worker-abc12-z1\nignored\n", 0o640);
    expect(await machineName(files, "host-1")).toBe("shoot--p--s-worker-abc12-z1");
    await files.writeAtomic("/var/lib/gardener-node-agent/machine-name", "\n", 0o640);
    expect(await machineName(files, "host-1")).toBe("host-1");
  });
});

describe("kubeconfigs", () => {
  const day = 86_400_000;

  async function cert(cn = "gardener.cloud:node-agent:machine:m1", from = Date.now() - day, to = Date.now() + 29 * day) {
    return issueClientCert({ dir: runDir("csr-kubeconfig"), commonName: cn, organizations: ["gardener.cloud:node-agents"], notBefore: new Date(from), notAfter: new Date(to) });
  }

  test("the agent's: one node-agent cluster, user and context, certificate and key embedded, the CA by path", async () => {
    const c = await cert();
    const text = renderKubeconfig({ server: "https://api.example:6443", ca: { file: "/var/lib/gardener-node-agent/cluster-ca.crt" }, certPem: c.certPem, keyPem: c.keyPem });
    const kc = new KubeConfig();
    kc.loadFromString(text);
    expect(kc.currentContext).toBe("node-agent");
    expect(kc.getCurrentCluster()).toMatchObject({ name: "node-agent", server: "https://api.example:6443", caFile: "/var/lib/gardener-node-agent/cluster-ca.crt" });
    expect(Buffer.from(kc.getCurrentUser()?.certData ?? "", "base64").toString()).toBe(c.certPem);
    expect(Buffer.from(kc.getCurrentUser()?.keyData ?? "", "base64").toString()).toBe(c.keyPem);
    const read = readClientCertificate(text);
    expect(read).toMatchObject({ commonName: "gardener.cloud:node-agent:machine:m1", server: "https://api.example:6443", ca: { file: "/var/lib/gardener-node-agent/cluster-ca.crt" } });
    expect(Math.abs((read?.notAfter.getTime() ?? 0) - (Date.now() + 29 * day))).toBeLessThan(2000);
  });

  test("an embedded CA stays embedded (the renewal keeps what the kubeconfig had)", async () => {
    const c = await cert();
    const text = renderKubeconfig({ server: "https://api:443", ca: { data: "-----BEGIN CERTIFICATE-----\nCA\n" }, certPem: c.certPem, keyPem: c.keyPem });
    expect(readClientCertificate(text)?.ca).toEqual({ data: "-----BEGIN CERTIFICATE-----\nCA\n" });
    expect(text).toContain("certificate-authority-data:");
  });

  test("what makes the bootstrap ask for a new certificate", async () => {
    const c = await cert();
    const good = renderKubeconfig({ server: "https://api:443", ca: { file: "/ca.crt" }, certPem: c.certPem, keyPem: c.keyPem });
    const other = await cert("gardener.cloud:node-agent:machine:other");
    const notAfter = readClientCertificate(good)?.notAfter.getTime() as number;
    expect(kubeconfigProblem(good, Date.now())).toBeUndefined();
    expect(kubeconfigProblem(undefined, Date.now())).toBe("missing");
    expect(kubeconfigProblem("{{{", Date.now())).toStartWith("unusable: not YAML");
    expect(kubeconfigProblem("apiVersion: v1\nkind: Config\n", Date.now())).toBe("unusable: no current-context");
    expect(kubeconfigProblem(good.replace(Buffer.from(c.keyPem).toString("base64"), Buffer.from(other.keyPem).toString("base64")), Date.now())).toBe(
      "unusable: client-key-data is not the key of client-certificate-data",
    );
    expect(kubeconfigProblem(good, notAfter + 1000)).toBe(`its client certificate expired at ${new Date(notAfter).toISOString()}`);
    // A token kubeconfig is someone else's: taken as it is.
    expect(kubeconfigProblem(renderTokenKubeconfig({ name: "x", server: "https://api:443", ca: { file: "/ca.crt" }, token: "t" }), Date.now())).toBeUndefined();
  });

  test("a damaged key is reported without quoting it", async () => {
    const c = await cert();
    const text = renderKubeconfig({ server: "https://api:443", ca: undefined, certPem: c.certPem, keyPem: "-----BEGIN EC PRIVATE KEY-----\nc2VjcmV0\n-----END EC PRIVATE KEY-----\n" });
    expect(() => readClientCertificate(text)).toThrow(/^client-key-data is not a private key$/);
  });

  test("kubelet's bootstrap kubeconfig: gardener-node-agent's kubelet-bootstrap shape with the token and the CA by path", () => {
    const text = renderTokenKubeconfig({ name: "kubelet-bootstrap", server: "https://api:443", ca: { file: "/var/lib/gardener-node-agent/cluster-ca.crt" }, token: "abcdef.0123456789abcdef" });
    const kc = new KubeConfig();
    kc.loadFromString(text);
    expect(kc.currentContext).toBe("kubelet-bootstrap");
    expect(kc.getCurrentCluster()).toMatchObject({ name: "kubelet-bootstrap", server: "https://api:443", caFile: "/var/lib/gardener-node-agent/cluster-ca.crt" });
    expect(kc.getCurrentUser()).toMatchObject({ name: "kubelet-bootstrap", token: "abcdef.0123456789abcdef" });
  });
});

describe("the agent's unit", () => {
  test("gardener-node-agent's unit with the config dir trellis was given", () => {
    const text = agentUnitContent({ configDir: "/var/lib/gardener-node-agent" });
    expect(text).toContain("ExecStart=/opt/bin/gardener-node-agent --config-dir=/var/lib/gardener-node-agent\n");
    expect(text).toContain("Restart=always\nRestartSec=5\n");
    expect(text).toContain("[Install]\nWantedBy=multi-user.target\n");
    expect(agentUnitContent({ restartSec: 1 })).toContain("RestartSec=1\n");
  });

  test("a config dir systemd would split or expand is refused", () => {
    for (const dir of ["/a b", "relative", "/x/%h", "/x/$HOME"]) expect(() => agentUnitContent({ configDir: dir })).toThrow("must be an absolute path");
  });
});
