// The object store behind the model's in-memory Kubernetes API: what etcd plus kube-apiserver's storage
// layer give the agents — one global resourceVersion counter, uid per object, optimistic concurrency on
// writes (409 on a stale resourceVersion, AlreadyExists on create), a change log that watches resume
// from (410 once a version fell out of it), label selectors, and ownerReference garbage collection.
// Everything here is synchronous and atomic: interleaving is decided by whoever calls it (memory-api.ts
// queues each client's requests and the model's scheduler delivers them one at a time).
//
// Stored objects are never mutated in place, so a reference handed out by `peek` stays a consistent
// snapshot of one version. The store takes what it is given without copying it (callers hand over
// fresh objects: parsed JSON, or objects built for the call) and nobody mutates what it hands out.

export type OwnerReference = { apiVersion?: string; kind: string; name: string; uid: string; controller?: boolean };
export type Meta = {
  name?: string;
  namespace?: string;
  uid?: string;
  resourceVersion?: string;
  creationTimestamp?: string;
  labels?: Record<string, string>;
  annotations?: Record<string, string>;
  ownerReferences?: OwnerReference[];
  [key: string]: unknown;
};
export type KObject = { apiVersion?: string; kind?: string; metadata?: Meta; spec?: unknown; status?: unknown; [key: string]: unknown };

/** Resources the model serves: plural name → kind, and whether writes to the main resource leave status alone. */
export const resources = {
  leases: { kind: "Lease", apiVersion: "coordination.k8s.io/v1", namespaced: true, statusSubresource: false },
  nodes: { kind: "Node", apiVersion: "v1", namespaced: false, statusSubresource: true },
  secrets: { kind: "Secret", apiVersion: "v1", namespaced: true, statusSubresource: false },
  events: { kind: "Event", apiVersion: "v1", namespaced: true, statusSubresource: false },
} as const;
export type Resource = keyof typeof resources;

/** A Kubernetes Status failure: HTTP code and the Status reason. */
export class ApiError extends Error {
  override name = "ApiError";
  constructor(
    readonly code: 400 | 404 | 409 | 410 | 422,
    readonly reason: "BadRequest" | "NotFound" | "AlreadyExists" | "Conflict" | "Expired" | "Invalid",
    message: string,
  ) {
    super(message);
  }
}

export type ChangeType = "ADDED" | "MODIFIED" | "DELETED";
export type Change = { rv: number; resource: Resource; namespace: string; type: ChangeType; object: KObject; old?: KObject };

const keyOf = (resource: Resource, namespace: string, name: string) => `${resource}/${namespace}/${name}`;

export class MemoryStore {
  private rv = 0;
  private uids = 0;
  private readonly objects = new Map<string, KObject>();
  private readonly log: Change[] = [];
  /** The oldest resourceVersion a watch can still resume from. */
  private horizon = 0;
  private readonly listeners = new Set<(c: Change) => void>();

  constructor(private readonly opts: { now: () => number; historyLimit?: number }) {}

  resourceVersion(): string {
    return String(this.rv);
  }

  /** The stored object itself (a snapshot: never mutated); undefined if absent. */
  peek(resource: Resource, namespace: string, name: string): KObject | undefined {
    return this.objects.get(keyOf(resource, scope(resource, namespace), name));
  }

  get(resource: Resource, namespace: string, name: string): KObject {
    const o = this.peek(resource, namespace, name);
    if (!o) throw notFound(resource, name);
    return o;
  }

  create(resource: Resource, namespace: string, body: KObject): KObject {
    const ns = scope(resource, namespace);
    const name = body.metadata?.name;
    if (!name) throw new ApiError(422, "Invalid", `${resources[resource].kind}: metadata.name is required`);
    if (body.metadata?.namespace && body.metadata.namespace !== ns) throw new ApiError(400, "BadRequest", "the namespace of the object does not match the namespace of the request");
    const key = keyOf(resource, ns, name);
    if (this.objects.has(key)) throw new ApiError(409, "AlreadyExists", `${resource} "${name}" already exists`);
    const stored: KObject = {
      ...body,
      apiVersion: resources[resource].apiVersion,
      kind: resources[resource].kind,
      metadata: {
        ...body.metadata,
        name,
        ...(resources[resource].namespaced ? { namespace: ns } : {}),
        uid: `uid-${++this.uids}`,
        creationTimestamp: new Date(this.opts.now()).toISOString().replace(/\.\d+Z$/, "Z"),
        resourceVersion: String(++this.rv),
      },
    };
    if (!resources[resource].namespaced) delete stored.metadata?.namespace;
    this.objects.set(key, stored);
    this.emit({ rv: this.rv, resource, namespace: ns, type: "ADDED", object: stored });
    return stored;
  }

  /**
   * An update (PUT). body.metadata.resourceVersion, when given, is the precondition (409 when stale);
   * `subresource` "status" changes only the status, the main resource everything but the status.
   */
  replace(resource: Resource, namespace: string, name: string, body: KObject, subresource?: "status"): KObject {
    const old = this.get(resource, namespace, name);
    precondition(old, body.metadata?.resourceVersion, body.metadata?.uid, resource, name);
    if (body.metadata?.name !== undefined && body.metadata.name !== name) throw new ApiError(400, "BadRequest", `the name of the object (${body.metadata.name}) does not match the name on the URL (${name})`);
    return this.store(resource, namespace, old, body, subresource);
  }

  /** A patch: `apply` computes the new object from the stored one (without changing it); `rv` (from the patch body) is its precondition. */
  patch(resource: Resource, namespace: string, name: string, apply: (old: KObject) => KObject, rv?: string, subresource?: "status"): KObject {
    const old = this.get(resource, namespace, name);
    precondition(old, rv, undefined, resource, name);
    return this.store(resource, namespace, old, apply(old), subresource);
  }

  /** Deletes the object (precondition: `uid`, if given) and, as the garbage collector does, what it owns. */
  delete(resource: Resource, namespace: string, name: string, opts: { uid?: string; rv?: string } = {}): KObject {
    const old = this.get(resource, namespace, name);
    precondition(old, opts.rv, opts.uid, resource, name);
    const ns = scope(resource, namespace);
    this.objects.delete(keyOf(resource, ns, name));
    this.emit({ rv: ++this.rv, resource, namespace: ns, type: "DELETED", object: { ...old, metadata: { ...old.metadata, resourceVersion: String(this.rv) } } });
    this.collect(old.metadata?.uid as string);
    return old;
  }

  list(resource: Resource, namespace: string | undefined, selector?: string): { items: KObject[]; resourceVersion: string } {
    const match = selector ? parseSelector(selector) : () => true;
    const prefix = namespace === undefined || !resources[resource].namespaced ? `${resource}/` : `${resource}/${namespace}/`;
    const items: KObject[] = [];
    for (const [key, o] of this.objects) if (key.startsWith(prefix) && match(o.metadata?.labels ?? {})) items.push(o);
    items.sort((a, b) => ((a.metadata?.name ?? "") < (b.metadata?.name ?? "") ? -1 : 1));
    return { items, resourceVersion: String(this.rv) };
  }

  /** The changes after `rv`, oldest first; "gone" when the log no longer reaches back that far (410). */
  changesSince(rv: number): Change[] | "gone" {
    if (rv < this.horizon) return "gone";
    const i = this.log.findIndex((c) => c.rv > rv);
    return i < 0 ? [] : this.log.slice(i);
  }

  /** Called synchronously with every change; returns the unsubscribe. */
  subscribe(listener: (c: Change) => void): () => void {
    this.listeners.add(listener);
    return () => void this.listeners.delete(listener);
  }

  /** Drops the change log up to now (a compaction): watches from older versions get 410. */
  compact(): void {
    this.log.length = 0;
    this.horizon = this.rv;
  }

  private store(resource: Resource, namespace: string, old: KObject, next: KObject, subresource?: "status"): KObject {
    const ns = scope(resource, namespace);
    const name = old.metadata?.name as string;
    const base = resources[resource].statusSubresource ? (subresource === "status" ? { ...old, status: next.status } : { ...next, status: old.status }) : next;
    const stored: KObject = {
      ...base,
      apiVersion: old.apiVersion,
      kind: old.kind,
      metadata: {
        ...(subresource === "status" ? old.metadata : base.metadata),
        name,
        ...(resources[resource].namespaced ? { namespace: ns } : {}),
        uid: old.metadata?.uid as string,
        creationTimestamp: old.metadata?.creationTimestamp as string,
        resourceVersion: String(++this.rv),
      },
    };
    if (stored.status === undefined) delete stored.status;
    this.objects.set(keyOf(resource, ns, name), stored);
    this.emit({ rv: this.rv, resource, namespace: ns, type: "MODIFIED", object: stored, old });
    return stored;
  }

  private emit(c: Change): void {
    this.log.push(c);
    const limit = this.opts.historyLimit ?? 2000;
    if (this.log.length > limit) {
      const dropped = this.log.splice(0, this.log.length - limit);
      this.horizon = dropped.at(-1)?.rv ?? this.horizon;
    }
    for (const l of this.listeners) l(c);
  }

  private collect(ownerUid: string): void {
    const owned = [...this.objects.values()].filter((o) => o.metadata?.ownerReferences?.some((r) => r.uid === ownerUid));
    for (const o of owned) {
      const resource = (Object.keys(resources) as Resource[]).find((r) => resources[r].kind === o.kind);
      if (resource && this.peek(resource, o.metadata?.namespace ?? "", o.metadata?.name ?? "")) this.delete(resource, o.metadata?.namespace ?? "", o.metadata?.name as string);
    }
  }
}

const scope = (resource: Resource, namespace: string) => (resources[resource].namespaced ? namespace : "");

function notFound(resource: Resource, name: string): ApiError {
  return new ApiError(404, "NotFound", `${resource}${resource === "leases" ? ".coordination.k8s.io" : ""} "${name}" not found`);
}

function precondition(old: KObject, rv: string | undefined, uid: string | undefined, resource: Resource, name: string): void {
  if (uid !== undefined && uid !== old.metadata?.uid) throw new ApiError(409, "Conflict", `Precondition failed: UID in precondition: ${uid}, UID in object meta: ${old.metadata?.uid}`);
  if (rv !== undefined && rv !== "" && rv !== old.metadata?.resourceVersion) {
    throw new ApiError(409, "Conflict", `Operation cannot be fulfilled on ${resource} "${name}": the object has been modified; please apply your changes to the latest version and try again`);
  }
}

/** Equality-based label selectors: `a=b`, `a==b`, `a!=b`, `a` (exists), `!a`, comma-separated (all must hold). */
export function parseSelector(text: string): (labels: Readonly<Record<string, string>>) => boolean {
  const terms = text
    .split(",")
    .map((t) => t.trim())
    .filter((t) => t !== "")
    .map((t): ((l: Readonly<Record<string, string>>) => boolean) => {
      const ne = /^([^!=]+)!=(.*)$/.exec(t);
      if (ne) return (l) => l[(ne[1] as string).trim()] !== (ne[2] as string).trim();
      const eq = /^([^!=]+)==?(.*)$/.exec(t);
      if (eq) return (l) => l[(eq[1] as string).trim()] === (eq[2] as string).trim();
      if (t.startsWith("!")) return (l) => !(t.slice(1) in l);
      return (l) => t in l;
    });
  return (labels) => terms.every((term) => term(labels));
}

/** RFC 7386 JSON merge patch: objects merge recursively, null removes a key, anything else replaces. */
export function mergePatch(target: unknown, patch: unknown): unknown {
  if (!isObject(patch)) return patch;
  const out: Record<string, unknown> = isObject(target) ? { ...target } : {};
  for (const [k, v] of Object.entries(patch)) {
    if (v === null) delete out[k];
    else out[k] = mergePatch(out[k], v);
  }
  return out;
}

/**
 * A strategic merge patch as far as Nodes need it: like a merge patch, except that lists whose items
 * have a merge key (conditions by type, addresses by type) merge item by item.
 */
export function strategicMergePatch(target: unknown, patch: unknown): unknown {
  if (!isObject(patch)) return patch;
  const out: Record<string, unknown> = isObject(target) ? { ...target } : {};
  for (const [k, v] of Object.entries(patch)) {
    if (v === null) delete out[k];
    else if (Array.isArray(v) && (k === "conditions" || k === "addresses") && Array.isArray(out[k])) out[k] = mergeByKey(out[k] as unknown[], v, "type");
    else out[k] = strategicMergePatch(out[k], v);
  }
  return out;
}

function mergeByKey(target: unknown[], patch: unknown[], key: string): unknown[] {
  const out = [...target];
  for (const item of patch) {
    const i = isObject(item) ? out.findIndex((o) => isObject(o) && o[key] === item[key]) : -1;
    if (i >= 0) out[i] = strategicMergePatch(out[i], item);
    else out.push(item);
  }
  return out;
}

const isObject = (x: unknown): x is Record<string, unknown> => typeof x === "object" && x !== null && !Array.isArray(x);
