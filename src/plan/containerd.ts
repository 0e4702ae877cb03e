// containerd's configuration from the OSC's spec.criConfig, as gardener-node-agent makes it: config.toml
// is the file on disk (else containerd's default) with a few settings patched in, one hosts.toml per
// registry under /etc/containerd/certs.d, and a drop-in that puts /var/bin/containerruntimes on
// containerd's PATH. Pure: the caller reads the current file and the default config, asks containerd for
// its version when the config needs it (needsContainerdVersion), probes the registries, writes what this
// returns and restarts containerd only when config.toml changed.
//
// As gardener-node-agent (containerd_config.go): a file without `version` is config version 1 and gets
// version 2's keys; a plugin's `add` replaces each top-level key of `values` at its path (a table given
// there replaces the whole table: a nested key an extension dropped goes), null removes the key, tables
// missing on the way are created, for `remove` too; the CNI directory is `bin_dirs` when the config is
// version 3+ and containerd says it is 2.2 or newer, else `bin_dir`.
//
// Differences from gardener-node-agent, on purpose:
// - A config.toml that means the same after patching is returned byte for byte, so the caller sees no
//   change and does not restart containerd (GNA rewrites the file and restarts containerd whenever the
//   OSC's containerd settings change, whether or not the file does).
// - An empty file (or only comments) is patched from containerd's default, as a missing one: GNA patches
//   it as version 1, whose CRI settings containerd 1.x reads only from [plugins.cri], so none would apply.
// - A whole number in plugin values is written as a TOML integer: GNA writes every JSON number as a float
//   (`3.0`), and containerd 1.6 refuses to start on a float where it wants an integer.
// - registry.mirrors / configs.*.tls next to config_path are an error here: containerd's CRI plugin
//   refuses to start with both, which GNA finds out only when the node stops running pods.
// - containerd is asked for its version only when the config is version 3+ (where the answer matters);
//   GNA asks on every reconcile and fails it while containerd does not answer.
// - The drop-in's PATH is fixed, not the agent's own environment, so it cannot flap between runs.
//
// smol-toml: containerd's keys are dotted plugin IDs ("io.containerd.grpc.v1.cri") that must be quoted
// on output, and the file must be read in full (TOML 1.0); a hand-written subset would get both wrong.
import { parse, stringify, type TomlDate, TomlError } from "smol-toml";
import type { CriConfig, PluginConfig, RegistryConfig } from "../api/cri-config.ts";
import type { Result } from "../api/result.ts";
import { paths } from "../api/paths.ts";

export const containerdConfigFile = "/etc/containerd/config.toml";
export const containerdBaseDir = "/etc/containerd";
export const confDir = "/etc/containerd/conf.d";
export const importsGlob = `${confDir}/*.toml`;
/** Gardener's ContainerDRuntimeContainersBinFolder: extensions install runtime shims (gVisor, Kata) here. */
export const runtimesBinDir = "/var/bin/containerruntimes";
/** containerd's own default type of its runc runtime. */
const runcRuntimeType = "io.containerd.runc.v2";
export const cniBinDir = "/opt/cni/bin";
/** systemd's default PATH for services, which is what gardener-node-agent's own PATH is. */
export const defaultServicePath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
export const configFileMode = 0o644;
export const hostsFileMode = 0o644;
export const hostsHeader = "# managed by gardener-node-agent";

export type ContainerdInputs = {
  criConfig: CriConfig;
  /** config.toml now on disk, if any. */
  current?: string;
  /** `containerd config default` output or the built-in default; used when there is no current file. */
  defaultConfig: string;
  /** Upstreams whose readiness probe passed; registries with readinessProbe not in here are not written yet. */
  readyRegistries?: ReadonlySet<string>;
  /** PATH after /var/bin/containerruntimes in containerd's drop-in (default: systemd's default PATH). */
  servicePath?: string;
  /** The version containerd's API reports ("2.2.1", "1.6.20~ds1"); required where needsContainerdVersion says so. */
  containerdVersion?: string;
};

export type HostsFile = { upstream: string; path: string; content: string };

export type ContainerdDesired = {
  /** Full content for /etc/containerd/config.toml (0644); `current` itself when nothing changes. */
  configToml: string;
  /** configToml differs from `current` (or there was none): write it and restart containerd. */
  configChanged: boolean;
  /** The config version patched (1: no `version`, 2: containerd 1.x, 3: 2.0–2.2, 4: 2.3+). */
  configVersion: ConfigVersion;
  /** What containerd may not act on although it is written; reported as the OSC's unsupported parts. */
  notes: string[];
  /** /etc/containerd/certs.d/<upstream>/hosts.toml (0644). containerd reads them per pull: no restart. */
  hostsFiles: HostsFile[];
  /** Waiting for their readiness probe: leave whatever is on disk for them as it is until then. */
  pendingRegistries: string[];
  /** Every upstream the OSC configures (written or pending): certs.d dirs of other upstreams that trellis
   *  wrote can go. */
  upstreams: string[];
  /** Directories gardener-node-agent creates (0755) even when nothing is put in them. */
  directories: string[];
  envDropIn: { unit: "containerd.service"; name: "30-env_config.conf"; content: string };
};

export type ConfigVersion = 1 | 2 | 3 | 4;

type TomlValue = string | number | bigint | boolean | TomlDate | TomlValue[] | Table;
type Table = { [key: string]: TomlValue };

const cri2 = ["plugins", "io.containerd.grpc.v1.cri"];
const images3 = ["plugins", "io.containerd.cri.v1.images"];
const runtime3 = ["plugins", "io.containerd.cri.v1.runtime"];

// Where each setting lives per config version (Gardener's containerdConfigPaths; 1 = 2, 4 = 3).
const layout = {
  2: { registry: [...cri2, "registry"], sandbox: [...cri2, "sandbox_image"], runc: [...cri2, "containerd", "runtimes", "runc", "options"], cni: [...cri2, "cni"] },
  3: { registry: [...images3, "registry"], sandbox: [...images3, "pinned_images", "sandbox"], runc: [...runtime3, "containerd", "runtimes", "runc", "options"], cni: [...runtime3, "cni"] },
} as const;
const layoutOf = (v: ConfigVersion) => layout[v < 3 ? 2 : 3];

// Extensions written for version 2 name runtimes under the old CRI plugin; on 3+ they live in the runtime
// plugin. Gardener rewrites exactly this prefix, and so does trellis.
const pluginPathRewrites: [readonly string[], readonly string[]][] = [
  [["io.containerd.grpc.v1.cri", "containerd", "runtimes"], ["io.containerd.cri.v1.runtime", "containerd", "runtimes"]],
];

const parseOptions = { integersAsBigInt: true } as const; // 1 and 1.0 stay apart (stringify with numbersAsFloat)

export function containerdDesired(input: ContainerdInputs, where: string): Result<ContainerdDesired> {
  const errors: string[] = [];
  const cri = input.criConfig;
  if (cri.name !== "containerd") errors.push(`${where}.name: "${cri.name}" is not supported; trellis configures only containerd`);

  const registries = checkRegistries(cri.containerd?.registries ?? [], `${where}.containerd.registries`, errors);
  const plugins = cri.containerd?.plugins ?? [];
  plugins.forEach((p, i) => checkPlugin(p, `${where}.containerd.plugins[${i}]`, errors));

  const config = patchConfig(input, where, errors);
  if (errors.length > 0 || !config) return { ok: false, errors };

  const ready = input.readyRegistries ?? new Set<string>();
  const hostsFiles: HostsFile[] = [];
  const pendingRegistries: string[] = [];
  for (const r of registries) {
    if (r.readinessProbe === true && !ready.has(r.upstream)) pendingRegistries.push(r.upstream);
    else hostsFiles.push({ upstream: r.upstream, path: hostsTomlPath(r.upstream), content: renderHostsToml(r) });
  }
  const path = `${runtimesBinDir}:${input.servicePath ?? defaultServicePath}`;
  return {
    ok: true,
    value: {
      ...config,
      hostsFiles,
      pendingRegistries,
      upstreams: registries.map((r) => r.upstream),
      directories: [runtimesBinDir, containerdBaseDir, confDir, paths.containerdHostsDir],
      envDropIn: { ...containerdEnvDropIn, content: `[Service]\nEnvironment="PATH=${path}"\n` },
    },
  };
}

/** The drop-in that puts containerd's runtimes on its PATH, which gardener-node-agent adds to every OSC with containerd. */
export const containerdEnvDropIn = { unit: "containerd.service", name: "30-env_config.conf" } as const;

export const hostsTomlPath = (upstream: string): string => `${paths.containerdHostsDir}/${upstream}/hosts.toml`;

/** hosts.toml in gardener-node-agent's exact layout (its template), so a node taken over sees no change. */
export function renderHostsToml(r: RegistryConfig): string {
  let out = hostsHeader;
  if (r.server) out += `\nserver = ${quote(r.server)}\n`;
  for (const h of r.hosts ?? []) {
    const caps = h.capabilities && h.capabilities.length > 0 ? h.capabilities : ["pull", "resolve"];
    out += `\n[host.${quote(h.url)}]\n  capabilities = ${goJson(caps)}`;
    if (h.caCerts && h.caCerts.length > 0) out += `\n  ca = ${goJson(h.caCerts)}`;
    if (h.overridePath === true) out += `\n  override_path = true`;
    out += "\n";
  }
  return `${out}\n`;
}

// --- config.toml -------------------------------------------------------------------------------------

// An empty file (or only comments) holds no settings: start from the default then, as for a missing one.
const holdsSettings = (doc: Table) => Object.keys(doc).length > 0;

/**
 * Whether containerdDesired needs containerd's default config for the config.toml on disk (`current`):
 * when there is none, or it holds no settings. A file that does not parse needs none: its error is reported.
 */
export function needsDefaultConfig(current: string | undefined): boolean {
  if (current === undefined) return true;
  const doc = parseToml(current, containerdConfigFile, []);
  return doc !== undefined && !holdsSettings(doc);
}

/**
 * Whether containerdDesired needs containerd's version (ContainerdInputs.containerdVersion) to patch this
 * config: only version 3+ has the choice between bin_dir and bin_dirs. A config that does not parse or has
 * a bad version needs none: its error is reported.
 */
export function needsContainerdVersion(current: string | undefined, defaultConfig: string): boolean {
  const base = baseConfig(current, defaultConfig, []);
  const version = base && configVersion(base.doc, base.label, []);
  return version !== undefined && version >= 3;
}

/** The config that is patched: the file on disk, or containerd's default when there is none or it is empty. */
function baseConfig(current: string | undefined, defaultConfig: string, errors: string[]): { doc: Table; label: string; useCurrent: boolean } | undefined {
  const currentDoc = current === undefined ? undefined : parseToml(current, containerdConfigFile, errors);
  if (current !== undefined && !currentDoc) return undefined;
  if (currentDoc && holdsSettings(currentDoc)) return { doc: currentDoc, label: containerdConfigFile, useCurrent: true };
  const label = "containerd's default config";
  const doc = parseToml(defaultConfig, label, errors);
  return doc && { doc, label, useCurrent: false };
}

function patchConfig(input: ContainerdInputs, where: string, errors: string[]): { configToml: string; configChanged: boolean; configVersion: ConfigVersion; notes: string[] } | undefined {
  const base = baseConfig(input.current, input.defaultConfig, errors);
  if (!base) return undefined;
  const { doc, label, useCurrent } = base;
  // Parsed again for the comparison at the end: the patches change `doc` in place.
  const currentDoc = useCurrent ? parseToml(input.current as string, label, []) : undefined;
  const version = configVersion(doc, label, errors);
  if (version === undefined) return undefined;

  const before = errors.length;
  const at = (path: readonly string[]) => ({ path, label, errors });
  const l = layoutOf(version);
  const cri = input.criConfig;

  setValue(doc, at([...l.registry, "config_path"]), paths.containerdHostsDir);

  const imports = doc.imports;
  if (!Array.isArray(imports)) setKey(doc, "imports", [importsGlob]);
  else if (!imports.includes(importsGlob)) imports.push(importsGlob);

  const sandbox = cri.containerd?.sandboxImage;
  if (sandbox) setValue(doc, at(l.sandbox), sandbox);

  // Gardener's CNI plugins live in /opt/cni/bin (Debian's containerd 2 defaults to /usr/lib/cni), so GNA
  // sets it too. containerd 2.2 deprecates bin_dir for the list bin_dirs and refuses both set to
  // different directories; gardener-node-agent switches by the running containerd's version.
  const cni = ensureTable(doc, at(l.cni));
  if (cni && version >= 3) {
    const atLeast22 = input.containerdVersion === undefined ? undefined : containerdAtLeast22(input.containerdVersion);
    if (input.containerdVersion === undefined) errors.push(`${label}: version ${version}: containerd's version is needed to choose between cni.bin_dir and cni.bin_dirs, and was not given`);
    else if (atLeast22 === undefined) errors.push(`containerd's version: "${input.containerdVersion}" (as its API reports it) is not a version x.y.z; needed to choose between cni.bin_dir and cni.bin_dirs`);
    else if (atLeast22) {
      setKey(cni, "bin_dirs", [cniBinDir]);
      delete cni.bin_dir;
    } else setKey(cni, "bin_dir", cniBinDir);
  } else if (cni) setKey(cni, "bin_dir", cniBinDir);

  if (cri.cgroupDriver) {
    setValue(doc, at([...l.runc, "SystemdCgroup"]), cri.cgroupDriver === "systemd");
    // containerd decodes its runtimes map entry by entry: a runc table holding only `options` replaces
    // the built-in runc runtime and leaves it without a type ("container.Runtime.Name must be set" for
    // every pod), as on Debian, whose config.toml names only the CNI directories. Give it the default.
    const runc = lookup(doc, l.runc.slice(0, -1));
    if (isTable(runc) && runc.runtime_type === undefined) setKey(runc, "runtime_type", runcRuntimeType);
  }

  (cri.containerd?.plugins ?? []).forEach((p, i) => applyPlugin(doc, p, version, `${where}.containerd.plugins[${i}]`, label, errors));

  checkNoLegacyRegistry(doc, l.registry, label, errors);
  if (errors.length > before) return undefined;

  const notes =
    version === 1
      ? [
          `${where}: ${label} has no \`version\`, so containerd reads it as config version 1: trellis patches it as gardener-node-agent does (under plugins."io.containerd.grpc.v1.cri"), which containerd 2.x reads but containerd 1.x does not (it takes version 1's CRI settings from [plugins.cri] only); add \`version = 2\` to the file for containerd 1.x`,
        ]
      : [];
  if (useCurrent && deepEqual(doc, currentDoc)) return { configToml: input.current as string, configChanged: false, configVersion: version, notes };
  return { configToml: stringify(doc, { numbersAsFloat: true }), configChanged: true, configVersion: version, notes };
}

/**
 * gardener-node-agent's test of the version containerd's API reports (VersionGreaterThanEqual22): every
 * "v" dropped and the rest cut at the first "-", "+" or "~" (Debian's "1.6.20~ds1"), then compared as
 * semver with ">= 2.2". Undefined when what is left is not a version (GNA's reconcile fails then).
 */
export function containerdAtLeast22(version: string): boolean | undefined {
  const core = version.replaceAll("v", "").split(/[-+~]/)[0] ?? "";
  const m = /^(\d+)(?:\.(\d+))?(?:\.(\d+))?$/.exec(core);
  if (!m) return undefined;
  const major = Number(m[1]);
  return major > 2 || (major === 2 && Number(m[2] ?? 0) >= 2);
}

function parseToml(text: string, label: string, errors: string[]): Table | undefined {
  try {
    return parse(text, parseOptions) as Table;
  } catch (err) {
    const msg = err instanceof TomlError ? `line ${err.line}, column ${err.column}: ${err.message.split("\n")[0]}` : String(err);
    errors.push(`${label}: not valid TOML: ${msg}`);
    return undefined;
  }
}

// gardener-node-agent's getContainerdConfigFileVersion: no `version` is version 1, else an integer 1–4.
function configVersion(doc: Table, label: string, errors: string[]): ConfigVersion | undefined {
  const v = doc.version;
  if (v === undefined) return 1;
  const n = typeof v === "bigint" ? Number(v) : v;
  if (n === 1 || n === 2 || n === 3 || n === 4) return n;
  errors.push(`${label}: version: ${String(v)} is not supported; want 1 or none, 2 (containerd 1.x), 3 (containerd 2.0–2.2) or 4 (containerd 2.3+)`);
  return undefined;
}

function checkNoLegacyRegistry(doc: Table, registryPath: readonly string[], label: string, errors: string[]): void {
  const registry = lookup(doc, registryPath);
  if (!isTable(registry)) return;
  const why = `containerd refuses it together with config_path, which trellis sets for the OSC's registries; move it to ${paths.containerdHostsDir}/<registry>/hosts.toml`;
  const mirrors = registry.mirrors;
  if (isTable(mirrors) && Object.keys(mirrors).length > 0) errors.push(`${label}: ${keyPath([...registryPath, "mirrors"])}: ${why}`);
  const configs = registry.configs;
  if (isTable(configs)) {
    for (const [host, c] of Object.entries(configs)) {
      if (isTable(c) && c.tls !== undefined) errors.push(`${label}: ${keyPath([...registryPath, "configs", host, "tls"])}: ${why}`);
    }
  }
}

// --- plugin operations -------------------------------------------------------------------------------

// Gardener's API validation refuses these (validateContainerdPluginConfigs): such an OSC never comes
// from gardenlet.
function checkPlugin(p: PluginConfig, field: string, errors: string[]): void {
  if (p.path.length === 0) errors.push(`${field}.path: must name at least one key below plugins`);
  if ((p.op ?? "add") === "remove" && p.values != null) errors.push(`${field}.values: must not be set when op is remove`);
  if (p.values != null) toTomlValues(p.values, `${field}.values`, errors);
}

// gardener-node-agent's structuredmap.SetMapEntry: the tables on the way are created where missing (for
// `remove` too) and must be tables; the last key is set to what the operation makes of it.
function applyPlugin(doc: Table, p: PluginConfig, version: ConfigVersion, field: string, label: string, errors: string[]): void {
  if (p.path.length === 0) return; // reported by checkPlugin
  const path = ["plugins", ...rewritePluginPath(p.path, version)];
  const parent = ensureTable(doc, { path: path.slice(0, -1), label, errors, field: `${field}.path` });
  if (!parent) return;
  const last = path[path.length - 1] as string;
  if ((p.op ?? "add") === "remove") {
    delete parent[last];
    return;
  }
  const values = toTomlValues(p.values ?? {}, `${field}.values`, []);
  if (!values) return;
  // json.Unmarshal into the table there (a new one if it is not a table): each key of `values` replaces
  // that key's whole value, null included, which the encoder then leaves out.
  let target = own(parent, last);
  if (!isTable(target)) {
    target = {};
    setKey(parent, last, target);
  }
  for (const [k, v] of Object.entries(values)) {
    if (v === undefined) delete target[k];
    else setKey(target, k, v);
  }
}

function rewritePluginPath(path: string[], version: ConfigVersion): string[] {
  if (version < 3) return path;
  for (const [from, to] of pluginPathRewrites) {
    if (from.every((k, i) => path[i] === k)) return [...to, ...path.slice(from.length)];
  }
  return path;
}

/**
 * `values` as json.Unmarshal and the TOML encoder leave them: a key whose value is null is undefined here
 * (it is removed), null inside a table leaves its key out, whole numbers become integers, other numbers
 * floats. Null in an array is an error (TOML has no null; GNA's encoder fails on it too).
 */
function toTomlValues(values: Record<string, unknown>, field: string, errors: string[]): Record<string, TomlValue | undefined> | undefined {
  const before = errors.length;
  // null: JSON's null, which has no TOML value; undefined: an error was recorded.
  const convert = (v: unknown, f: string): TomlValue | null | undefined => {
    if (v === null || v === undefined) return null;
    if (typeof v === "string" || typeof v === "boolean" || typeof v === "bigint") return v;
    if (typeof v === "number") return Number.isSafeInteger(v) ? BigInt(v) : v;
    if (Array.isArray(v)) {
      return v.map((e, i) => {
        const c = convert(e, `${f}[${i}]`);
        if (c === null) errors.push(`${f}[${i}]: null is not allowed in an array (TOML has no null)`);
        return c;
      }) as TomlValue[];
    }
    if (isPlainObject(v)) {
      const out: Table = {};
      for (const [k, e] of Object.entries(v)) {
        const c = convert(e, `${f}.${k}`);
        if (c !== null && c !== undefined) setKey(out, k, c);
      }
      return out;
    }
    errors.push(`${f}: ${typeof v} values cannot be written to TOML`);
    return undefined;
  };
  if (!isPlainObject(values)) {
    errors.push(`${field}: must be a JSON object`);
    return undefined;
  }
  const out: Record<string, TomlValue | undefined> = {};
  for (const [k, e] of Object.entries(values)) setKey(out, k, convert(e, `${field}.${k}`) ?? undefined);
  return errors.length > before ? undefined : out;
}

// --- tables ------------------------------------------------------------------------------------------

type At = { path: readonly string[]; label: string; errors: string[]; /** the OSC field to blame instead of the file */ field?: string };

/** The table at `path`, created where missing; undefined (and an error) if a key on the way is not a table. */
function ensureTable(doc: Table, at: At): Table | undefined {
  let t = doc;
  for (let i = 0; i < at.path.length; i++) {
    const k = at.path[i] as string;
    const next = own(t, k);
    if (next === undefined) {
      const created: Table = {};
      setKey(t, k, created);
      t = created;
    } else if (isTable(next)) t = next;
    else {
      const what = `${keyPath(at.path.slice(0, i + 1))} is ${describe(next)} in ${at.label}, not a table`;
      at.errors.push(at.field ? `${at.field}: ${what}` : `${at.label}: ${keyPath(at.path.slice(0, i + 1))}: is ${describe(next)}, not a table`);
      return undefined;
    }
  }
  return t;
}

function setValue(doc: Table, at: At, value: TomlValue): void {
  const parent = ensureTable(doc, { ...at, path: at.path.slice(0, -1) });
  if (parent) setKey(parent, at.path[at.path.length - 1] as string, value);
}

function lookup(doc: Table, path: readonly string[]): TomlValue | undefined {
  let v: TomlValue | undefined = doc;
  for (const k of path) {
    if (!isTable(v)) return undefined;
    v = own(v, k);
  }
  return v;
}

// Keys come from the OSC: "__proto__" must be a key, never the prototype (reading included: t["__proto__"]
// is Object.prototype, and merging into that would change every object in the process).
function own<T>(t: { [key: string]: T }, k: string): T | undefined {
  return Object.hasOwn(t, k) ? t[k] : undefined;
}
function setKey<T>(t: { [key: string]: T }, k: string, v: T): void {
  Object.defineProperty(t, k, { value: v, enumerable: true, writable: true, configurable: true });
}

function isTable(v: unknown): v is Table {
  return isPlainObject(v);
}
function isPlainObject(v: unknown): v is Record<string, unknown> {
  return typeof v === "object" && v !== null && !Array.isArray(v) && !(v instanceof Date);
}

function describe(v: TomlValue): string {
  if (Array.isArray(v)) return "an array";
  if (v instanceof Date) return "a date";
  return typeof v === "bigint" ? "an integer" : typeof v === "number" ? "a float" : `a ${typeof v}`;
}

/** plugins."io.containerd.grpc.v1.cri".registry — how TOML (and containerd's docs) write the key. */
export function keyPath(path: readonly string[]): string {
  return path.map((k) => (/^[A-Za-z0-9_-]+$/.test(k) ? k : JSON.stringify(k))).join(".");
}

/** The same TOML document: keys in any order, integers and floats apart, dates by value. */
export function deepEqual(a: unknown, b: unknown): boolean {
  if (a === b) return true;
  if (typeof a === "number" && typeof b === "number") return Number.isNaN(a) && Number.isNaN(b);
  if (a instanceof Date || b instanceof Date) return a instanceof Date && b instanceof Date && dateText(a) === dateText(b);
  if (Array.isArray(a) || Array.isArray(b)) {
    return Array.isArray(a) && Array.isArray(b) && a.length === b.length && a.every((x, i) => deepEqual(x, b[i]));
  }
  if (!isPlainObject(a) || !isPlainObject(b)) return false;
  const ka = Object.keys(a);
  return ka.length === Object.keys(b).length && ka.every((k) => Object.hasOwn(b, k) && deepEqual(a[k], b[k]));
}

// A TomlDate's ISO text keeps what kind of date it is (local date, time, offset date-time) and its offset.
function dateText(d: Date): string {
  try {
    return `${d.constructor.name}:${d.toISOString()}`;
  } catch {
    return `${d.constructor.name}:invalid`;
  }
}

// --- registries --------------------------------------------------------------------------------------

const dnsLabel = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?$/;
const unsafeChars = /[\u0000-\u001f\u007f"\\\s]/;

function checkRegistries(registries: RegistryConfig[], field: string, errors: string[]): RegistryConfig[] {
  const seen = new Map<string, number>();
  registries.forEach((r, i) => {
    const f = `${field}[${i}]`;
    const problem = upstreamProblem(r.upstream);
    if (problem) errors.push(`${f}.upstream: "${r.upstream}" ${problem}`);
    const earlier = seen.get(r.upstream);
    if (earlier !== undefined) errors.push(`${f}.upstream: duplicate "${r.upstream}", also in ${field}[${earlier}]`);
    else seen.set(r.upstream, i);
    if (r.server != null) {
      const p = urlProblem(r.server);
      if (p) errors.push(`${f}.server: "${r.server}" ${p}`);
    }
    (r.hosts ?? []).forEach((h, j) => {
      const p = urlProblem(h.url);
      if (p) errors.push(`${f}.hosts[${j}].url: "${h.url}" ${p}`);
      (h.caCerts ?? []).forEach((ca, k) => {
        if (ca === "" || /[\u0000-\u001f\u007f]/.test(ca)) errors.push(`${f}.hosts[${j}].caCerts[${k}]: must be a file path without control characters`);
      });
    });
  });
  return registries;
}

/** Gardener's rule: `_default`, or a DNS-1123 subdomain with an optional port — a certs.d dir name. */
export function upstreamProblem(upstream: string): string | undefined {
  if (upstream === "_default") return undefined;
  let host = upstream;
  const colon = upstream.lastIndexOf(":");
  if (colon !== -1 && /^\d+$/.test(upstream.slice(colon + 1))) {
    const port = Number(upstream.slice(colon + 1));
    if (port < 1 || port > 65535 || /^0/.test(upstream.slice(colon + 1))) return "has a port outside 1–65535";
    host = upstream.slice(0, colon);
  }
  if (host.length === 0 || host.length > 253 || !host.split(".").every((l) => l.length <= 63 && dnsLabel.test(l))) {
    return "must be host[:port] with a lower-case DNS name or IPv4 address as host (no /, .., scheme or path), or _default";
  }
  return undefined;
}

function urlProblem(url: string): string | undefined {
  if (unsafeChars.test(url)) return "must not contain spaces, quotes, backslashes or control characters";
  let u: URL;
  try {
    u = new URL(url);
  } catch {
    return "is not a URL; want http(s)://host[:port][/path]";
  }
  if (u.protocol !== "http:" && u.protocol !== "https:") return `has scheme ${u.protocol.slice(0, -1)}; want http or https`;
  if (u.hostname === "") return "has no host; want http(s)://host[:port][/path]";
  return undefined;
}

// sprig's `quote` (Go's %q) for the checked strings here: a TOML basic string.
function quote(s: string): string {
  return `"${s.replace(/[\\"]/g, (c) => `\\${c}`)}"`;
}

// sprig's `toJson` (Go's encoding/json): like JSON.stringify, but <, > and & escaped as Go does.
function goJson(v: readonly string[]): string {
  return JSON.stringify(v).replace(/[<>&\u2028\u2029]/g, (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, "0")}`);
}
