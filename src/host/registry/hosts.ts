// Which endpoints serve a registry, read the way containerd reads /etc/containerd/certs.d (its
// remotes/docker/config package), so the agent pulls through the same mirrors as the node's containerd:
// the directory `<host>_<port>_`, else `<host:port>`, else `_default`; in it `hosts.toml`'s
// `[host."URL"]` entries in file order, then `server` (default https://<registry>, for docker.io
// https://registry-1.docker.io). A directory without hosts.toml contributes Docker-style `*.crt` CA files.
// Unlike containerd, a hosts.toml that does not parse is an error rather than silently ignored: on an
// air-gapped node falling back to the upstream would only hide the typo.
import { isAbsolute, join } from "node:path";
import { parse as parseToml } from "smol-toml";
import { FileError, type Files } from "../files.ts";

export type Capability = "pull" | "resolve" | "push";

export type EndpointConfig = {
  /** "scheme://host[:port]" */
  origin: string;
  /** API root, e.g. "/v2"; "" when override_path made the URL's empty path the root. */
  path: string;
  capabilities: ReadonlySet<Capability>;
  skipVerify: boolean;
  /** CA certificate files, absolute (relative ones are taken relative to the host directory). */
  caFiles: string[];
  /** Client certificate [cert, key] files; key "" when the cert file holds both. */
  clientPairs: [string, string][];
  /** Extra request headers from `header`. */
  headers: Record<string, string[]>;
};

export type Endpoint = Omit<EndpointConfig, "caFiles" | "clientPairs"> & {
  /** PEM text of the CA files (added to the system roots, as containerd does). */
  ca: string[];
  /** PEM text of client certificates and keys. */
  clients: { cert: string; key: string }[];
  /** True unless this is the registry host itself (containerd then adds `?ns=<registry>`). */
  mirror: boolean;
  /** Where this endpoint came from, for messages: a hosts.toml path or "default". */
  source: string;
};

export class HostsConfigError extends Error {
  override name = "HostsConfigError";
}

const allCapabilities: ReadonlySet<Capability> = new Set(["pull", "resolve", "push"]);

/** Base URL of an endpoint as messages show it, e.g. "http://127.0.0.1:5000/v2". */
export const endpointUrl = (e: { origin: string; path: string }) => `${e.origin}${e.path}`;

/** containerd's directory candidates for `registry` under `hostsDir`, most specific first. */
export function hostDirCandidates(hostsDir: string, registry: string): string[] {
  const out: string[] = [];
  const colon = registry.lastIndexOf(":");
  if (colon > 0) out.push(join(hostsDir, `${registry.slice(0, colon)}_${registry.slice(colon + 1)}_`));
  out.push(join(hostsDir, registry), join(hostsDir, "_default"));
  return out;
}

/** The server containerd uses when nothing configures one. */
export function defaultServer(registry: string): EndpointConfig {
  const origin = registry === "docker.io" ? "https://registry-1.docker.io" : `https://${registry}`;
  return { origin, path: "/v2", capabilities: allCapabilities, skipVerify: false, caFiles: [], clientPairs: [], headers: {} };
}

type Table = Record<string, unknown>;
const isTable = (v: unknown): v is Table => typeof v === "object" && v !== null && !Array.isArray(v) && !(v instanceof Date);

/**
 * Parses hosts.toml text into endpoints in the order they are tried. `baseDir` anchors relative `ca` and
 * `client` paths. Throws HostsConfigError naming the key at fault.
 */
export function parseHostsToml(text: string, baseDir: string, registry: string, file = "hosts.toml"): EndpointConfig[] {
  let doc: Table;
  try {
    doc = parseToml(text) as Table;
  } catch (err) {
    throw new HostsConfigError(`${file}: not valid TOML: ${err instanceof Error ? err.message : String(err)}`, { cause: err });
  }
  const fail = (key: string, why: string): never => {
    throw new HostsConfigError(`${file}: ${key}: ${why}`);
  };
  const hosts = doc.host ?? {};
  if (!isTable(hosts)) fail("host", "must be a table of [host.\"URL\"] sections");
  const out: EndpointConfig[] = [];
  // JS objects keep string keys in insertion order, i.e. file order: the order containerd tries them in.
  for (const [url, section] of Object.entries(hosts as Table)) {
    if (!isTable(section)) fail(`host.${JSON.stringify(url)}`, "must be a table");
    out.push(hostConfig(url, section as Table, baseDir, `host.${JSON.stringify(url)}`, fail));
  }
  const server = doc.server;
  if (server !== undefined && typeof server !== "string") fail("server", "must be a string");
  if (typeof server !== "string" || server === "") {
    // containerd fills in the default server and gives it every capability, keeping the file's TLS settings.
    const defaults = defaultServer(registry);
    const own = hostConfig(defaults.origin, doc, baseDir, "(top level)", fail);
    out.push({ ...own, origin: defaults.origin, path: defaults.path, capabilities: allCapabilities });
  } else {
    out.push(hostConfig(server, doc, baseDir, "server", fail));
  }
  return out;
}

function hostConfig(url: string, t: Table, baseDir: string, where: string, fail: (key: string, why: string) => never): EndpointConfig {
  const scheme = /^([A-Za-z][A-Za-z0-9+.-]*):\/\//.exec(url)?.[1];
  if (scheme !== undefined && scheme !== "http" && scheme !== "https") fail(where, `${JSON.stringify(url)}: only http and https are supported`);
  const full = scheme === undefined ? `https://${url}` : url; // containerd: no scheme means https
  let u: URL;
  try {
    u = new URL(full);
  } catch {
    return fail(where, `${JSON.stringify(url)} is not a URL`);
  }
  if (u.protocol !== "http:" && u.protocol !== "https:") fail(where, `${JSON.stringify(url)}: only http and https are supported`);
  if (u.search || u.hash) fail(where, `${JSON.stringify(url)}: query and fragment are not allowed`);

  const overridePath = t.override_path ?? false;
  if (typeof overridePath !== "boolean") fail(`${where} override_path`, "must be a boolean");
  // As containerd: "/v2" is appended unless the path already ends in it or override_path says it is the root.
  let path = u.pathname === "/" ? "" : posixClean(u.pathname);
  if (!overridePath && !path.endsWith("/v2")) path = `${path}/v2`;

  let capabilities = allCapabilities;
  if (t.capabilities !== undefined) {
    const list = t.capabilities;
    if (!Array.isArray(list) || !list.every((c) => typeof c === "string")) fail(`${where} capabilities`, "must be an array of strings");
    const caps = new Set<Capability>();
    for (const c of list as string[]) {
      const lower = c.toLowerCase();
      if (lower !== "pull" && lower !== "resolve" && lower !== "push") fail(`${where} capabilities`, `unknown capability ${JSON.stringify(c)}`);
      caps.add(lower as Capability);
    }
    // An empty list means the default in containerd (its check is len(capabilities) > 0).
    if (caps.size > 0) capabilities = caps;
  }

  const skipVerify = t.skip_verify ?? false;
  if (typeof skipVerify !== "boolean") fail(`${where} skip_verify`, "must be a boolean");

  const abs = (p: string) => (isAbsolute(p) ? p : join(baseDir, p));
  const strings = (v: unknown, key: string): string[] => {
    if (typeof v === "string") return [v];
    if (Array.isArray(v) && v.every((s) => typeof s === "string")) return v as string[];
    return fail(`${where} ${key}`, "must be a string or an array of strings");
  };
  const caFiles = t.ca === undefined ? [] : strings(t.ca, "ca").map(abs);

  const clientPairs: [string, string][] = [];
  if (t.client !== undefined) {
    const items = typeof t.client === "string" ? [t.client] : Array.isArray(t.client) ? t.client : fail(`${where} client`, "must be a string or an array");
    for (const item of items as unknown[]) {
      if (typeof item === "string") clientPairs.push([abs(item), ""]);
      else if (Array.isArray(item) && item.length === 2 && item.every((s) => typeof s === "string")) clientPairs.push([abs(item[0] as string), abs(item[1] as string)]);
      else fail(`${where} client`, "entries must be a file or a [cert, key] pair of files");
    }
  }

  const headers: Record<string, string[]> = {};
  if (t.header !== undefined) {
    if (!isTable(t.header)) fail(`${where} header`, "must be a table");
    for (const [name, value] of Object.entries(t.header as Table)) headers[name] = strings(value, `header.${name}`);
  }

  return { origin: u.origin, path, capabilities, skipVerify, caFiles, clientPairs, headers };
}

function posixClean(p: string): string {
  const parts: string[] = [];
  for (const seg of p.split("/")) {
    if (seg === "" || seg === ".") continue;
    if (seg === "..") parts.pop();
    else parts.push(seg);
  }
  return parts.length === 0 ? "" : `/${parts.join("/")}`;
}

const errno = (err: unknown) => (err as { code?: unknown } | null)?.code;

/**
 * The endpoints for `registry`, in the order to try them, with CA and client certificate files read.
 * Throws HostsConfigError for an unreadable or invalid configuration.
 */
/** hosts.toml, CA certificates and client keys are small: a larger file is refused, not read. */
export const maxHostsFileBytes = 1 << 20;

export async function loadEndpoints(files: Files, hostsDir: string, registry: string, hostsToml?: string): Promise<Endpoint[]> {
  const read = async (f: string, what: string) => {
    let bytes: Uint8Array | undefined;
    try {
      bytes = await files.read(f, { maxBytes: maxHostsFileBytes });
    } catch (err) {
      throw new HostsConfigError(`${what}: ${err instanceof Error ? err.message : String(err)}`, { cause: err });
    }
    if (bytes === undefined) throw new HostsConfigError(`${what}: ${f} does not exist (ENOENT)`);
    return new TextDecoder().decode(bytes);
  };
  let configs: EndpointConfig[] | undefined;
  let source = "default";
  if (hostsToml !== undefined) {
    // Relative CA paths mean the registry's own directory, where this content is going to be written.
    const dir = join(hostsDir, registry);
    source = `${join(dir, "hosts.toml")} (as the OSC configures it)`;
    configs = parseHostsToml(hostsToml, dir, registry, source);
  }
  for (const dir of configs ? [] : hostDirCandidates(hostsDir, registry)) {
    let names: string[];
    try {
      names = await files.list(dir);
    } catch (err) {
      if (err instanceof FileError && err.reason.includes("ENOTDIR")) continue; // a stray file named like a registry is not a host directory
      throw new HostsConfigError(`reading ${dir}: ${err instanceof Error ? err.message : String(err)}`, { cause: err });
    }
    if (names.length === 0 && !(await files.stat(dir))) continue; // no such directory (an empty one is chosen, as containerd does)
    if (names.includes("hosts.toml")) {
      const file = join(dir, "hosts.toml");
      const text = await read(file, `reading ${file}`);
      source = file;
      if (text.length > 0) configs = parseHostsToml(text, dir, registry, file);
    } else {
      source = dir;
    }
    // containerd: an empty hosts.toml or none at all means Docker's certs.d layout (*.crt, *.cert + *.key).
    configs ??= [dockerCertDir(dir, names, registry)];
    break;
  }
  configs ??= [defaultServer(registry)];

  const readFor = (f: string) => read(f, `${source}: reading ${f}`);
  const out: Endpoint[] = [];
  for (const c of configs) {
    const ca = await Promise.all(c.caFiles.map(readFor));
    const clients = await Promise.all(
      c.clientPairs.map(async ([cert, key]) => {
        const certPem = await readFor(cert);
        return { cert: certPem, key: key === "" ? certPem : await readFor(key) };
      }),
    );
    const { caFiles: _ca, clientPairs: _cp, ...rest } = c;
    out.push({ ...rest, ca, clients, mirror: new URL(c.origin).host !== registry, source });
  }
  return out;
}

function dockerCertDir(dir: string, names: string[], registry: string): EndpointConfig {
  const sorted = [...names].sort();
  const caFiles = sorted.filter((n) => n.endsWith(".crt")).map((n) => join(dir, n));
  const clientPairs: [string, string][] = sorted
    .filter((n) => n.endsWith(".cert") && names.includes(`${n.slice(0, -5)}.key`))
    .map((n) => [join(dir, n), join(dir, `${n.slice(0, -5)}.key`)]);
  return { ...defaultServer(registry), caFiles, clientPairs };
}
