// The agent talks to the API server through a Kube's transport (src/kube/client.ts kubeFetch). For the
// model, that transport is the in-memory API instead of a socket: each request becomes one queued
// MemoryApi request (delivered when the scheduler says), answered with the JSON a kube-apiserver would
// send (Status bodies for 404/409/410/422), or failing as a broken connection. The server URL names the
// client: https://<owner>.model.invalid.
//
// Served: Leases (coordination.k8s.io/v1, namespaced), Nodes and their status subresource, Secrets, and
// Events (accepted and dropped). GET, LIST (labelSelector), POST, PUT, PATCH (merge, strategic merge for
// Node conditions; metadata.resourceVersion in a patch is its precondition), DELETE. Not served: watch
// streams (today's rollout code does not watch; the new protocol watches through the LeaseApi port).
import type { Kube } from "../../src/kube/client.ts";
import { KubeAuth } from "../../src/kube/credentials.ts";
import type { MemoryApi } from "./memory-api.ts";
import { ApiError, type KObject, type MemoryStore, mergePatch, type Resource, resources, strategicMergePatch } from "./memory-store.ts";

const domain = ".model.invalid";

/** A Kube (src/kube/client.ts) whose requests reach the model `api` as `owner`. */
export function kubeFor(owner: string, api: MemoryApi): Kube {
  const server = `https://${owner}${domain}`;
  const auth = new KubeAuth(async () => ({ headers: {}, tls: { rejectUnauthorized: true } }));
  return { server, caSource: "the model", insecure: false, auth, transport: (url, init) => handle(api, url, init) };
}

type Answer = { status: number; body: string };

function handle(api: MemoryApi, target: string, init: RequestInit): Promise<Response> {
  const url = new URL(target);
  if (!url.hostname.endsWith(domain)) return Promise.reject(new Error(`the model serves only *${domain}, not ${url.hostname}`));
  const owner = url.hostname.slice(0, -domain.length);
  const method = init.method ?? "GET";
  const contentType = (init.headers as Record<string, string> | undefined)?.["Content-Type"] ?? "";
  const text = typeof init.body === "string" ? init.body : undefined;
  return api
    .request(owner, `${method} ${url.pathname}${url.search}`, () => serve(api.store, method, url, text, contentType))
    .catch((err: unknown) => {
      if (err instanceof ApiError) return { status: err.code, body: JSON.stringify(statusOf(err)) };
      throw err;
    })
    .then((a: Answer) => response(a));
}

function response(a: Answer): Response {
  return new Response(a.body, { status: a.status, headers: { "content-type": "application/json" } });
}

const statusOf = (e: ApiError) => ({ kind: "Status", apiVersion: "v1", metadata: {}, status: "Failure", message: e.message, reason: e.reason, code: e.code });

type Route = { resource: Resource; namespace: string; name?: string; subresource?: "status" };

const pathPattern = /^\/(?:api\/v1|apis\/[^/]+\/[^/]+)(?:\/namespaces\/([^/]+))?\/([^/]+)(?:\/([^/]+))?(?:\/(status))?$/;

function route(path: string): Route {
  const m = pathPattern.exec(path);
  const resource = m?.[2];
  if (!m || !resource || !(resource in resources)) throw new ApiError(404, "NotFound", `the server could not find the requested resource (${path})`);
  return { resource: resource as Resource, namespace: m[1] ?? "", ...(m[3] ? { name: m[3] } : {}), ...(m[4] ? { subresource: "status" as const } : {}) };
}

/** One request against the store, as kube-apiserver would answer it (runs when the request is delivered). */
function serve(store: MemoryStore, method: string, url: URL, body: string | undefined, contentType: string): Answer {
  const r = route(url.pathname);
  const parsed = body === undefined || body === "" ? undefined : (JSON.parse(body) as KObject);
  const ok = (status: number, o: unknown): Answer => ({ status, body: JSON.stringify(o) });
  if (r.name === undefined) {
    if (method === "GET") {
      if (url.searchParams.get("watch") === "true") throw new ApiError(400, "BadRequest", "the model serves no watch streams over HTTP; use the LeaseApi port");
      const list = store.list(r.resource, r.namespace || undefined, url.searchParams.get("labelSelector") ?? undefined);
      const { kind, apiVersion } = resources[r.resource];
      return ok(200, { kind: `${kind}List`, apiVersion, metadata: { resourceVersion: list.resourceVersion }, items: list.items.map(({ kind: _k, apiVersion: _a, ...rest }) => rest) });
    }
    if (method === "POST") {
      if (!parsed) throw new ApiError(400, "BadRequest", "a body is required");
      if (r.resource === "events") return ok(201, parsed);
      return ok(201, store.create(r.resource, r.namespace, parsed));
    }
  } else {
    switch (method) {
      case "GET":
        return ok(200, store.get(r.resource, r.namespace, r.name));
      case "PUT":
        if (!parsed) throw new ApiError(400, "BadRequest", "a body is required");
        return ok(200, store.replace(r.resource, r.namespace, r.name, parsed, r.subresource));
      case "PATCH": {
        if (!parsed) throw new ApiError(400, "BadRequest", "a body is required");
        const strategic = contentType.includes("strategic-merge-patch");
        const apply = (old: KObject) => (strategic ? strategicMergePatch(old, parsed) : mergePatch(old, parsed)) as KObject;
        return ok(200, store.patch(r.resource, r.namespace, r.name, apply, parsed.metadata?.resourceVersion, r.subresource));
      }
      case "DELETE": {
        const pre = parsed as { preconditions?: { uid?: string; resourceVersion?: string } } | undefined;
        return ok(200, store.delete(r.resource, r.namespace, r.name, { ...(pre?.preconditions?.uid ? { uid: pre.preconditions.uid } : {}), ...(pre?.preconditions?.resourceVersion ? { rv: pre.preconditions.resourceVersion } : {}) }));
      }
    }
  }
  throw new ApiError(400, "BadRequest", `${method} ${url.pathname}: not served by the model`);
}
