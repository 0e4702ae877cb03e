// The agent's credentials at its start (src/cli/bootstrap.ts ensureAgentCredentials), without an API
// server: what is left on disk by a run that ended between writing the kubeconfig and removing its
// certificate request. Requesting against a real kube-apiserver is test/e2e/bootstrap.test.ts.
import { expect, test } from "bun:test";
import { parseAgentConfig } from "../../src/api/agent-config.ts";
import { paths } from "../../src/api/paths.ts";
import { ensureAgentCredentials } from "../../src/cli/bootstrap.ts";
import { createFiles } from "../../src/host/files.ts";
import { pendingRequestPath } from "../../src/kube/csr.ts";
import { renderKubeconfig } from "../../src/kube/csr-kubeconfig.ts";
import { createLogger } from "../../src/log.ts";
import { issueClientCert } from "../harness/certs.ts";
import { runDir } from "../harness/exec.ts";

const parsed = parseAgentConfig("apiVersion: nodeagent.config.gardener.cloud/v1alpha1\nkind: NodeAgentConfiguration\napiServer: {server: https://127.0.0.1:1}\ncontrollers:\n  operatingSystemConfig: {secretName: osc, kubernetesVersion: 1.35.4}\n", "test");
if (!parsed.ok) throw new Error(parsed.errors.join("\n"));
const config = parsed.config;

test("a valid kubeconfig whose key is the pending request's: the request is done, and removed; another pending request (a renewal under way) stays", async () => {
  const dir = runDir("agent-credentials");
  const files = createFiles(dir);
  const hour = 3_600_000;
  const cert = await issueClientCert({ dir, commonName: "gardener.cloud:node-agent:machine:m", organizations: ["gardener.cloud:node-agents"], notBefore: new Date(Date.now() - hour), notAfter: new Date(Date.now() + 24 * hour) });
  await files.writeAtomic(paths.kubeconfig, renderKubeconfig({ server: "https://127.0.0.1:1", ca: { file: "/ca.crt" }, certPem: cert.certPem, keyPem: cert.keyPem }), 0o600);
  const lines: string[] = [];
  const log = createLogger({ write: (l) => void lines.push(l) });
  const ensure = () => ensureAgentCredentials({ config, files, log, waitMs: 1000, hostName: "m", env: {} });

  const other = await issueClientCert({ dir, commonName: "gardener.cloud:node-agent:machine:m", organizations: ["gardener.cloud:node-agents"], notBefore: new Date(), notAfter: new Date(Date.now() + hour) });
  await files.writeAtomic(pendingRequestPath, JSON.stringify({ machineName: "m", keyPem: other.keyPem, requestPem: "x", name: "node-agent-csr-x" }), 0o600);
  expect(await ensure()).toBe(false);
  expect(await files.stat(pendingRequestPath)).toBeDefined();

  await files.writeAtomic(pendingRequestPath, JSON.stringify({ machineName: "m", keyPem: cert.keyPem, requestPem: "x", name: "node-agent-csr-y" }), 0o600);
  expect(await ensure()).toBe(false);
  expect(await files.stat(pendingRequestPath)).toBeUndefined();
  expect(lines.join("")).toContain("removed the certificate request the kubeconfig was issued for");
});
