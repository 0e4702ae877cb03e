// The smallest round trip that proves a connection works end to end: the server's version
// (TLS and reachability) and a SelfSubjectReview (the credentials, as the server sees them).
import { createSelfSubjectReview, serverVersion } from "./api.ts";
import type { Kube } from "./client.ts";
import { rethrow } from "./errors.ts";

export type WhoAmI = { server: string; serverVersion: string; username: string; groups: string[] };

export async function whoami(kube: Kube): Promise<WhoAmI> {
  const info = await serverVersion(kube).catch(rethrow(kube, "reading the server version"));
  const review = await createSelfSubjectReview(kube).catch(rethrow(kube, "asking who trellis is (SelfSubjectReview)"));
  const user = review.status?.userInfo;
  return { server: kube.server, serverVersion: info.gitVersion, username: user?.username ?? "", groups: user?.groups ?? [] };
}
