// Plain GETs for what client-node's generated API cannot do: a path given as data, and a body read
// as a stream (watch). They go through client-node's own HTTP library on purpose: that module's
// `undici` import is what the Bun build and test preload rewrite to the TLS shim, and under Deno it is
// the real undici, so the kubeconfig's CA and client certificate apply either way. The global fetch
// would need that TLS material dug out of the kubeconfig and passed in each runtime's own way.
import { ApiException, HttpMethod, IsomorphicFetchHttpLibrary, RequestContext, type ResponseContext } from "@kubernetes/client-node";
import type { Kube } from "./client.ts";
import { explainKubeError, type KubeError } from "./errors.ts";

const library = new IsomorphicFetchHttpLibrary();

export async function kubeGet(kube: Kube, path: string, query: Record<string, string>, signal: AbortSignal): Promise<ResponseContext> {
  const url = new URL(kube.server + path);
  for (const [k, v] of Object.entries(query)) url.searchParams.set(k, v);
  const ctx = new RequestContext(url.toString(), HttpMethod.GET);
  ctx.setHeaderParam("Accept", "application/json");
  ctx.setSignal(signal);
  await kube.throttle?.(signal);
  await kube.config.applySecurityAuthentication(ctx);
  return library.send(ctx).toPromise();
}

/** A non-2xx answer (or an ERROR watch event's Status) as the KubeError errors.ts would make of it. */
export function statusError(kube: Pick<Kube, "server" | "caSource">, what: string, code: number, body: unknown): KubeError {
  return explainKubeError(new ApiException(code, "", body, {}), { server: kube.server, caSource: kube.caSource, what });
}
