// The smallest round trip that proves a connection works end to end: the server's version
// (TLS and reachability) and a SelfSubjectReview (the credentials, as the server sees them).
import { AuthenticationV1Api, VersionApi } from "@kubernetes/client-node";
import { apiClient, type Kube } from "./client.ts";
import { rethrow } from "./errors.ts";

export type WhoAmI = { server: string; serverVersion: string; username: string; groups: string[] };

export async function whoami(kube: Kube): Promise<WhoAmI> {
  const info = await apiClient(kube, VersionApi).getCode().catch(rethrow(kube, "reading the server version"));
  const review = await apiClient(kube, AuthenticationV1Api)
    .createSelfSubjectReview({ body: { apiVersion: "authentication.k8s.io/v1", kind: "SelfSubjectReview" } })
    .catch(rethrow(kube, "asking who trellis is (SelfSubjectReview)"));
  const user = review.status?.userInfo;
  return { server: kube.server, serverVersion: info.gitVersion, username: user?.username ?? "", groups: user?.groups ?? [] };
}
