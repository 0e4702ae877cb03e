// From a parsed OSC to this node's desired state: fetch what the OSC only points at (kube-system
// Secrets, files inside images, containerd's current configuration, registry readiness), then resolve
// it all without further I/O. Shared by the agent and by `trellis plan`/`apply`, so they agree.
import { relative } from "node:path";
import {
  type Desired,
  type ImageFileResult,
  imageKey,
  imageRefsOf,
  maxFileBytes,
  resolveDesired,
  secretRefsOf,
} from "../api/desired.ts";
import type { Provenance } from "../api/layers.ts";
import { managesContainerd, type RegistryConfig } from "../api/cri-config.ts";
import type { OperatingSystemConfig } from "../api/osc.ts";
import { dropInPath, unitFilePath } from "../api/paths.ts";
import { containerdVersion, defaultContainerdSocket } from "../host/containerd.ts";
import { caCertPath, containerdDefaultConfig, probeRegistryHosts } from "../host/containerd-defaults.ts";
import { FileError, type Files, hostPathUnder } from "../host/files.ts";
import type { ImageStore } from "../host/registry/store.ts";
import { describeError, type Logger } from "../log.ts";
import { containerdConfigFile, type ContainerdDesired, containerdDesired, hostsTomlPath, needsContainerdVersion, needsDefaultConfig, renderHostsToml, upstreamProblem } from "../plan/containerd.ts";
import { withContainerd } from "../plan/with-containerd.ts";

export type SecretData = Readonly<Record<string, Uint8Array>>;

export type NodeInputs = {
  files: Files;
  hostName: string;
  /** Reads kube-system Secrets (undefined: not found). Without a cluster: none exist. */
  readSecret?: (name: string) => Promise<SecretData | undefined>;
  /** Where imageRef files come from. */
  images: ImageStore;
  log: Logger;
  /** Aborts image downloads (the agent is stopping). */
  signal?: AbortSignal;
  /** Where each unit and file came from, when the Secret's overlays were layered onto the OSC. */
  provenance?: Provenance;
  /** Asks the node's containerd for its version; default: its API on /run/containerd/containerd.sock under the root. */
  containerdVersion?: () => Promise<string>;
  /** What parsing the OSC did not read (parseOsc's `ignored`): reported with the rest of `unsupported`. */
  ignored?: readonly string[];
};

/** At most this many images are fetched at once: enough to overlap round trips, few enough for a small node. */
const imageConcurrency = 4;

/** A registry whose readiness probe has not answered (its upstream), and why not. */
export type RegistryWait = { registry: string; why: string };

/**
 * `retry`: an image could not be fetched, or containerd did not say its version: a registry or containerd
 * coming back can fix that without an OSC change.
 * `waitingFor`: registries whose mirrors did not pass their readiness probe yet (applied without them).
 */
export type NodeDesired = { ok: true; value: Desired; waitingFor: RegistryWait[] } | { ok: false; errors: string[]; retry: boolean };

/** How long a registry's readiness probe may take per host. */
const probeTimeoutMs = 5_000;
/** How long containerd may take to say its version. */
const versionTimeoutMs = 10_000;

export async function desiredForNode(osc: OperatingSystemConfig, source: string, inputs: NodeInputs): Promise<NodeDesired> {
  const secrets = new Map<string, SecretData | undefined>();
  for (const name of secretRefsOf(osc, inputs.hostName)) secrets.set(name, await inputs.readSecret?.(name));
  const criWhere = `${source}: spec.criConfig`;
  const cd = await containerdFor(osc, criWhere, inputs);
  if (cd && !cd.ok) return cd;
  // The OSC's own mirrors serve its images, also on the first apply that writes them.
  const hostsToml = new Map(cd?.value.hostsFiles.map((h) => [h.upstream, h.content]));
  const images = await fetchImages(osc, inputs, hostsToml);
  const resolved = resolveDesired(osc, { hostName: inputs.hostName, secrets, images, source, ...(inputs.provenance ? { provenance: inputs.provenance } : {}) });
  if (!resolved.ok) return { ...resolved, retry: [...images.values()].some((i) => !i.ok) };
  const base: Desired = { ...resolved.value, unsupported: [...(inputs.ignored ?? []), ...resolved.value.unsupported] };
  let desired: Desired;
  let waitingFor: RegistryWait[] = [];
  if (!cd) {
    const other = osc.spec.criConfig?.name;
    // Like gardener-node-agent, trellis configures only containerd; another CRI is said, not refused.
    const unsupported = other && other !== "containerd" ? [`${source}: spec.criConfig.name: "${other}" is not configured by trellis (only containerd is)`] : [];
    desired = { ...base, unsupported: [...base.unsupported, ...unsupported] };
  } else {
    const merged = withContainerd(base, cd.value, criWhere);
    if (!merged.ok) return { ok: false, errors: merged.errors.map((e) => inSource(source, e)), retry: false };
    desired = merged.value;
    waitingFor = cd.value.pendingRegistries.map((registry) => ({ registry, why: cd.notReady.get(registry) ?? "not probed" }));
  }
  const unwritable = await unwritablePaths(desired, source, inputs.files);
  return unwritable.length > 0 ? { ok: false, errors: unwritable, retry: false } : { ok: true, value: desired, waitingFor };
}

// resolveDesired names its entries within the OSC ("spec.files[2] (/etc/x)"); errors name the OSC too.
const inSource = (source: string, text: string) => (text.startsWith(source) ? text : `${source}: ${text}`);

// Checked before anything is written, so that an OSC naming a path the node cannot take (an existing
// directory, a path below a regular file, a symlink another user planted) changes nothing at all,
// instead of failing halfway through its apply.
async function unwritablePaths(desired: Desired, source: string, files: Files): Promise<string[]> {
  const named = (origin: string) => inSource(source, origin);
  const targets = [
    ...desired.files.map((f) => ({ path: f.path, origin: named(f.origin) })),
    ...desired.units.flatMap((u) => [
      ...(u.content !== undefined ? [{ path: unitFilePath(u.name), origin: `${source}: unit ${u.name}` }] : []),
      ...u.dropIns.map((d) => ({ path: dropInPath(u.name, d.name), origin: `${source}: unit ${u.name}.dropIns[${d.name}]` })),
    ]),
  ];
  // The disk cannot show one target below another (an apply would write the first, then fail on the
  // second), nor two that are one file through a symlink (each apply would write both, for ever).
  const checks = await files.writeChecks(targets.map((t) => t.path));
  const placed = targets.map((t) => ({ ...t, at: checks.get(t.path)?.landsAt ?? t.path }));
  const written = new Set(placed.map((t) => t.at));
  const first = new Map<string, string>();
  const found = placed.map((t) => {
    const parent = ancestorsOf(t.at).find((a) => written.has(a));
    const same = first.get(t.at);
    if (same === undefined) first.set(t.at, t.path);
    return { ...t, problem: parent ? `${parent} is a file the OSC writes too` : same ? `it is ${same} too, through a symlink` : undefined };
  });
  return found.flatMap((t) => {
    const problem = t.problem ?? checks.get(t.path)?.problem;
    return problem ? [`${t.origin}: ${t.path} cannot be written: ${problem}`] : [];
  });
}

/** "/a/b/c" → ["/a", "/a/b"]. */
const ancestorsOf = (path: string) => path.split("/").slice(1, -1).map((_, i, segs) => `/${segs.slice(0, i + 1).join("/")}`);

async function containerdFor(osc: OperatingSystemConfig, where: string, inputs: NodeInputs): Promise<{ ok: true; value: ContainerdDesired; notReady: Map<string, string> } | { ok: false; errors: string[]; retry: boolean } | undefined> {
  const cri = osc.spec.criConfig;
  if (!managesContainerd(cri)) return undefined;
  const ready = await readyRegistries(cri.containerd.registries ?? [], `${where}.containerd.registries`, inputs);
  if (ready.errors.length > 0) return { ok: false, errors: ready.errors, retry: false };
  const bytes = await inputs.files.read(containerdConfigFile);
  const current = bytes ? new TextDecoder().decode(bytes) : undefined;
  const defaultConfig = needsDefaultConfig(current) ? (await containerdDefaultConfig({ log: inputs.log })).config : "";
  let version: string | undefined;
  if (needsContainerdVersion(current, defaultConfig)) {
    // As gardener-node-agent, through containerd's API: the daemon that will read the file, not a binary on PATH.
    const ask = inputs.containerdVersion ?? (() => containerdVersion(hostPathUnder(inputs.files.root, defaultContainerdSocket), versionTimeoutMs).then((v) => v.version));
    try {
      version = await ask();
    } catch (err) {
      return { ok: false, errors: [`${where}: containerd's version is needed to choose between cni.bin_dir and cni.bin_dirs: ${describeError(err)}`], retry: true };
    }
  }
  const cd = containerdDesired(
    {
      criConfig: cri,
      ...(current !== undefined ? { current } : {}),
      defaultConfig,
      readyRegistries: ready.ready,
      ...(version !== undefined ? { containerdVersion: version } : {}),
    },
    where,
  );
  return cd.ok ? { ...cd, notReady: ready.notReady } : { ...cd, retry: false };
}

/**
 * A registry with a readiness probe is probed whenever its hosts.toml would change (new, or its configuration
 * changed: gardener-node-agent probes a registry that is new or differs from the last applied OSC's,
 * changes.go computeContainerdRegistryDiffs); its hosts.toml is written once every host answers. One already
 * configured as the OSC has it is not probed again: a mirror that is briefly down must not take the
 * configuration away. `where`: the registries' field, for errors.
 */
async function readyRegistries(registries: RegistryConfig[], where: string, inputs: NodeInputs): Promise<{ ready: Set<string>; notReady: Map<string, string>; errors: string[] }> {
  const ready = new Set<string>();
  const notReady = new Map<string, string>();
  const errors: string[] = [];
  for (const [i, r] of registries.entries()) {
    // A bad upstream has no hosts.toml path to look at; containerdDesired refuses it, naming the field.
    if (r.readinessProbe !== true || upstreamProblem(r.upstream)) continue;
    if (await configuredAlready(r, inputs.files)) {
      ready.add(r.upstream);
      continue;
    }
    const ca = await readCaCerts(r, `${where}[${i}]`, inputs.files);
    if ("errors" in ca) {
      errors.push(...ca.errors);
      continue;
    }
    const probe = ca.missing ? { ready: false as const, error: `its CA file ${ca.missing} does not exist (yet)` } : await probeRegistryHosts(r, probeTimeoutMs, ca.pem);
    if (probe.ready) ready.add(r.upstream);
    else {
      notReady.set(r.upstream, probe.error);
      inputs.log.debug("registry mirror not ready yet; its hosts.toml waits", { registry: r.upstream, error: probe.error });
    }
  }
  return { ready, notReady, errors };
}

/** The registry's hosts.toml on the node is the one the OSC asks for (anything unreadable there is not). */
async function configuredAlready(r: RegistryConfig, files: Files): Promise<boolean> {
  const want = renderHostsToml(r);
  const have = await files.read(hostsTomlPath(r.upstream), { maxBytes: new TextEncoder().encode(want).byteLength }).catch(() => undefined);
  return have !== undefined && new TextDecoder().decode(have) === want;
}

/**
 * The CA files a registry's hosts name (caCerts), read for its readiness probe as any file trellis reads
 * from the node: through Files, a regular file of at most maxFileBytes (an OSC could name /dev/zero, a
 * FIFO, or a file of gigabytes). A missing one may be on its way (a file of the OSC): the probe waits.
 */
async function readCaCerts(r: RegistryConfig, where: string, files: Files): Promise<{ pem: (string[] | undefined)[]; missing?: string } | { errors: string[] }> {
  const pem: (string[] | undefined)[] = [];
  const errors: string[] = [];
  let missing: string | undefined;
  for (const [j, host] of (r.hosts ?? []).entries()) {
    const texts: string[] = [];
    for (const [k, caCert] of (host.caCerts ?? []).entries()) {
      const path = caCertPath(r.upstream, caCert);
      try {
        const bytes = await files.read(path, { maxBytes: maxFileBytes });
        if (bytes) texts.push(new TextDecoder().decode(bytes));
        else missing ??= path;
      } catch (err) {
        errors.push(`${where}.hosts[${j}].caCerts[${k}]: ${err instanceof FileError ? `${path} ${err.reason}` : describeError(err)}`);
      }
    }
    pem.push(texts);
  }
  return errors.length > 0 ? { errors } : { pem, ...(missing ? { missing } : {}) };
}

async function fetchImages(osc: OperatingSystemConfig, inputs: NodeInputs, hostsToml: ReadonlyMap<string, string>): Promise<Map<string, ImageFileResult>> {
  const out = new Map<string, ImageFileResult>();
  const todo = imageRefsOf(osc, inputs.hostName);
  const { images } = inputs;
  // The apply copies each file from the cache: making room for one must not evict another of this OSC.
  const inUse = new Set<string>();
  const worker = async () => {
    for (let ref = todo.shift(); ref; ref = todo.shift()) {
      try {
        const got = await images.extract(ref, { hostsToml, inUse, ...(inputs.signal ? { signal: inputs.signal } : {}) });
        // The cache lives on the node; Files wants node paths (they differ under `plan --root`).
        const copyFrom = `/${relative(inputs.files.root, got.blobPath)}`;
        out.set(imageKey(ref), { ok: true, content: { copyFrom, sha256: got.sha256 }, size: got.size });
      } catch (err) {
        out.set(imageKey(ref), { ok: false, error: describeError(err) });
      }
    }
  };
  await Promise.all(Array.from({ length: Math.min(imageConcurrency, todo.length) }, worker));
  return out;
}
