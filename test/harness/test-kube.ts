// A Kube (src/kube/client.ts) for a test's own server: a kubeconfig made of these few settings, read as
// the agent reads one. An http:// server is reached without TLS (insecure-skip-tls-verify).
import { Buffer } from "node:buffer";
import { stringify } from "yaml";
import { type Kube, kubeFromKubeconfig } from "../../src/kube/client.ts";

export function testKube(o: { server: string; caPem?: string; token?: string; cert?: { certPem: string; keyPem: string }; impersonate?: string }): Kube {
  const b64 = (s: string) => Buffer.from(s).toString("base64");
  const cluster = { server: o.server, ...(o.caPem && { "certificate-authority-data": b64(o.caPem) }), ...(o.server.startsWith("http:") && { "insecure-skip-tls-verify": true }) };
  const user = {
    ...(o.token && { token: o.token }),
    ...(o.cert && { "client-certificate-data": b64(o.cert.certPem), "client-key-data": b64(o.cert.keyPem) }),
    ...(o.impersonate && { as: o.impersonate }),
  };
  const text = stringify({
    apiVersion: "v1",
    kind: "Config",
    clusters: [{ name: "c", cluster }],
    users: [{ name: "u", user }],
    contexts: [{ name: "x", context: { cluster: "c", user: "u" } }],
    "current-context": "x",
  });
  return kubeFromKubeconfig(text, "/", "the test's kubeconfig");
}
