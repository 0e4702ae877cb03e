// What src/plan/containerd.ts needs from the machine: containerd's default config (the base that
// gardener-node-agent patches when /etc/containerd/config.toml does not exist yet), containerd's version,
// and the readiness probe of registry mirrors (hosts.toml is written only once the mirror answers).
import { execFile } from "node:child_process";
import http from "node:http";
import https from "node:https";
import { resolve } from "node:path";
import type { RegistryConfig } from "../api/cri-config.ts";
import type { Logger } from "../log.ts";
import { paths } from "../api/paths.ts";

/** Used when containerd is not installed: enough for containerd 1.6+ (2.x migrates version 2 on load). */
export const builtinDefaultConfig = `version = 2
root = "/var/lib/containerd"
state = "/run/containerd"

[grpc]
  address = "/run/containerd/containerd.sock"

[plugins."io.containerd.grpc.v1.cri".containerd]
  default_runtime_name = "runc"

[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
  SystemdCgroup = false
`;

export type ContainerdDefault = {
  config: string;
  /** "containerd": what `containerd config default` printed; "built-in": containerd is not installed. */
  source: "containerd" | "built-in";
  /** containerd's version ("1.6.20", "2.1.9"), when it is installed and says so. */
  version?: string;
  major?: number;
};

type Options = { binary?: string; timeoutMs?: number; log?: Logger };

/** containerd's default config and version; the built-in default (and a log line) if containerd is missing. */
export async function containerdDefaultConfig(opts: Options = {}): Promise<ContainerdDefault> {
  const binary = opts.binary ?? "containerd";
  const timeoutMs = opts.timeoutMs ?? 10_000;
  let version: { version: string; major: number } | undefined;
  try {
    version = parseContainerdVersion(await run(binary, ["--version"], timeoutMs));
  } catch (err) {
    if (!isNotFound(err)) throw err;
    opts.log?.warn("containerd is not installed: using trellis' built-in default config (version 2) as the base of config.toml", { binary });
    return { config: builtinDefaultConfig, source: "built-in" };
  }
  const config = await run(binary, ["config", "default"], timeoutMs);
  return { config, source: "containerd", ...(version ?? {}) };
}

/** "containerd github.com/containerd/containerd/v2 v2.1.9 abc" or Debian's "… 1.6.20~ds1 1.6.20~ds1-1+deb12u3". */
export function parseContainerdVersion(output: string): { version: string; major: number } | undefined {
  const field = output.trim().split(/\s+/)[2] ?? "";
  const m = /^v?(\d+)\.(\d+)\.(\d+)/.exec(field);
  return m ? { version: `${m[1]}.${m[2]}.${m[3]}`, major: Number(m[1]) } : undefined;
}

function run(binary: string, args: string[], timeoutMs: number): Promise<string> {
  return new Promise((resolve, reject) => {
    execFile(binary, args, { timeout: timeoutMs, killSignal: "SIGKILL", maxBuffer: 4 * 1024 * 1024, encoding: "utf8" }, (err, stdout, stderr) => {
      if (!err) return resolve(stdout);
      const e = err as NodeJS.ErrnoException & { killed?: boolean };
      if (e.code === "ENOENT") return reject(err);
      const why = e.killed ? `no answer within ${timeoutMs} ms` : `${e.message.split("\n")[0]}${stderr ? `: ${stderr.trim().split("\n").pop()}` : ""}`;
      reject(new Error(`${binary} ${args.join(" ")}: ${why}`, { cause: err }));
    });
  });
}

function isNotFound(err: unknown): boolean {
  return (err as NodeJS.ErrnoException | undefined)?.code === "ENOENT";
}

export type ProbeResult = { ready: true; status: number } | { ready: false; error: string };

/**
 * A registry counts as ready when `<url>/v2/` gives any HTTP answer (401 included: the mirror runs, it
 * just wants a token); connection errors, TLS errors and timeouts are not ready. `ca`: PEM text that
 * replaces the system roots for https, as gardener-node-agent does with a host's caCerts.
 */
export function probeRegistry(url: string, timeoutMs: number, opts: { ca?: string[] } = {}): Promise<ProbeResult> {
  return new Promise((resolve) => {
    let target: URL;
    try {
      target = new URL(`${url.replace(/\/+$/, "")}/v2/`);
    } catch {
      return resolve({ ready: false, error: `${url} is not a URL` });
    }
    if (target.protocol !== "http:" && target.protocol !== "https:") return resolve({ ready: false, error: `${url}: scheme must be http or https` });
    let settled = false;
    const finish = (r: ProbeResult) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      req.destroy();
      resolve(r);
    };
    const get = target.protocol === "https:" ? https.get : http.get;
    const req = get(target, { ...(opts.ca ? { ca: opts.ca } : {}), headers: { "user-agent": "trellis registry probe" } }, (res) => {
      res.resume(); // the body does not matter
      finish({ ready: true, status: res.statusCode ?? 0 });
    });
    req.on("error", (err) => finish({ ready: false, error: `${target.href}: ${err.message}` }));
    const timer = setTimeout(() => finish({ ready: false, error: `${target.href}: no answer within ${timeoutMs} ms` }), timeoutMs);
  });
}

/** Where containerd reads a host's CA file: the path (normalised), or one relative to the registry's directory. */
export const caCertPath = (upstream: string, caCert: string): string => resolve(paths.containerdHostsDir, upstream, caCert);

/**
 * All hosts of a registry answer (gardener-node-agent's readiness rule). `ca[j]`: the PEM texts of host
 * j's caCerts, read by the caller (bounded, through Files: src/apply/desired-for-node.ts).
 */
export async function probeRegistryHosts(registry: RegistryConfig, timeoutMs: number, ca: readonly (string[] | undefined)[] = []): Promise<ProbeResult> {
  let last: ProbeResult = { ready: true, status: 0 };
  for (const [j, host] of (registry.hosts ?? []).entries()) {
    const pem = ca[j];
    last = await probeRegistry(host.url, timeoutMs, pem && pem.length > 0 ? { ca: pem } : {});
    if (!last.ready) return last;
  }
  return last;
}
