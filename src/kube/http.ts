// GETs whose answer is read as a stream (a watch, a list read with a bound on its size): kubeFetch without
// a timeout of its own (the watch has its own idle rule), and the error a non-2xx answer makes.
import { ApiException } from "@kubernetes/client-node/dist/gen/apis/exception.js";
import { type Kube, kubeFetch } from "./client.ts";
import { explainKubeError, type KubeError } from "./errors.ts";

export function kubeGet(kube: Kube, path: string, query: Record<string, string>, signal: AbortSignal): Promise<Response> {
  return kubeFetch(kube, { method: "GET", path, query, signal });
}

/** A non-2xx answer (or an ERROR watch event's Status) as the KubeError errors.ts would make of it. */
export function statusError(kube: Pick<Kube, "server" | "caSource">, what: string, code: number, body: unknown): KubeError {
  return explainKubeError(new ApiException(code, "", body, {}), { server: kube.server, caSource: kube.caSource, what });
}
