// The one module that may touch runtime-specific globals (Bun.*, Deno.*): everything else in src/
// uses node: built-ins and web APIs, so the source stays runnable under both Bun and Deno.
//
// Two system calls the node: built-ins lack are made here through the runtime's FFI into libc:
// flock(2) (the state directory's lock: held by the kernel for the open file, so it goes with the
// process however it ends, and a reused PID can never look like its holder) and a datagram to a unix
// socket (sd_notify: node:dgram speaks only UDP, under Bun too).
//
// And the runtime's own settings (applyRuntimeEnv): the flags baked into the executable, and the
// environment variables the agent executes itself with (src/runtime-env.ts decides).
//
// And an HTTPS request with a given CA and client certificate (fetchWithTls): the web fetch has no
// option for either, each runtime has its own.
import { mkdirSync, readFileSync, rmSync, statSync, writeFileSync } from "node:fs";
import { dirname } from "node:path";
import { bakedRuntimeEnv, decideRuntimeEnv, parseReexecMarker, reexecGuard, reexecMarkerPath, type RuntimeEnvDecision } from "./runtime-env.ts";
type DenoFfi = {
  dlopen(path: string, symbols: Record<string, { parameters: string[]; result: string }>): { symbols: Record<string, (...args: unknown[]) => unknown> };
  UnsafePointerView: new (p: unknown) => { getInt32(): number };
};
type DenoHttp = { createHttpClient(opts: { caCerts?: string[]; cert?: string; key?: string; proxy?: { url: string } }): object };
type RuntimeGlobals = { Bun?: { version: string }; Deno?: { version: { deno: string } } & DenoFfi & DenoHttp };
const g = globalThis as RuntimeGlobals;

/** "bun 1.4.5", "deno 2.9.6" or "node 22.x" — for version output and diagnostics. */
export function runtimeName(): string {
  if (g.Bun) return `bun ${g.Bun.version}`;
  if (g.Deno) return `deno ${g.Deno.version.deno}`;
  return `node ${process.versions.node}`;
}

type Libc = {
  flock(fd: number, op: number): number;
  socket(domain: number, type: number, protocol: number): number;
  sendto(fd: number, buf: Uint8Array, len: number, flags: number, addr: Uint8Array, addrLen: number): number;
  errno(): number;
};

// Linux values (x86_64 and arm64 agree on all of them).
const LOCK_EX = 2;
const LOCK_NB = 4;
const EINTR = 4;
const EWOULDBLOCK = 11;
const AF_UNIX = 1;
const SOCK_DGRAM = 2;
const SOCK_CLOEXEC = 0o2000000;
const MSG_NOSIGNAL = 0x4000;

let libc: Libc | undefined;
async function openLibc(): Promise<Libc> {
  if (libc) return libc;
  if (g.Bun) {
    // A specifier in a variable: deno check must not try to resolve Bun's built-in module.
    const spec = "bun:ffi";
    const ffi = (await import(spec)) as {
      dlopen(path: string, symbols: Record<string, { args: string[]; returns: string }>): { symbols: Record<string, (...args: unknown[]) => unknown> };
      read: { i32(p: unknown, offset: number): number };
    };
    const { symbols: s } = ffi.dlopen("libc.so.6", {
      flock: { args: ["i32", "i32"], returns: "i32" },
      socket: { args: ["i32", "i32", "i32"], returns: "i32" },
      sendto: { args: ["i32", "ptr", "usize", "i32", "ptr", "u32"], returns: "isize" },
      __errno_location: { args: [], returns: "ptr" },
    });
    libc = {
      flock: (fd, op) => s.flock!(fd, op) as number,
      socket: (d, t, p) => s.socket!(d, t, p) as number,
      sendto: (fd, buf, len, flags, addr, addrLen) => Number(s.sendto!(fd, buf, len, flags, addr, addrLen)),
      errno: () => ffi.read.i32(s.__errno_location!(), 0),
    };
  } else if (g.Deno) {
    const deno = g.Deno;
    const { symbols: s } = deno.dlopen("libc.so.6", {
      flock: { parameters: ["i32", "i32"], result: "i32" },
      socket: { parameters: ["i32", "i32", "i32"], result: "i32" },
      sendto: { parameters: ["i32", "buffer", "usize", "i32", "buffer", "u32"], result: "isize" },
      __errno_location: { parameters: [], result: "pointer" },
    });
    libc = {
      flock: (fd, op) => s.flock!(fd, op) as number,
      socket: (d, t, p) => s.socket!(d, t, p) as number,
      sendto: (fd, buf, len, flags, addr, addrLen) => Number(s.sendto!(fd, buf, BigInt(len), flags, addr, addrLen)),
      errno: () => new deno.UnsafePointerView(s.__errno_location!()).getInt32(),
    };
  } else {
    throw new Error(`flock and unix datagrams need Bun's or Deno's FFI; this runtime is ${runtimeName()}`);
  }
  return libc;
}

/**
 * flock(fd, LOCK_EX|LOCK_NB): true if this process now holds the lock, false if another open file
 * holds it. The lock lasts while `fd` stays open.
 */
export async function tryExclusiveFlock(fd: number): Promise<boolean> {
  const c = await openLibc();
  for (;;) {
    if (c.flock(fd, LOCK_EX | LOCK_NB) === 0) return true;
    const err = c.errno();
    if (err === EWOULDBLOCK) return false;
    if (err !== EINTR) throw new Error(`flock: errno ${err}`);
  }
}

let notifyFd: number | undefined;
/** Sends `message` as one datagram to the unix socket at `path` ("@name": the abstract socket "name"). */
export async function sendUnixDatagram(path: string, message: string): Promise<void> {
  const c = await openLibc();
  const name = new TextEncoder().encode(path.startsWith("@") ? `\0${path.slice(1)}` : path);
  if (name.length >= 108) throw new Error(`unix socket path ${path}: longer than 107 bytes`);
  // struct sockaddr_un: sa_family_t (2 bytes, host order) and the path, NUL-terminated unless abstract.
  const addr = new Uint8Array(110);
  new DataView(addr.buffer).setUint16(0, AF_UNIX, true);
  addr.set(name, 2);
  const addrLen = 2 + name.length + (path.startsWith("@") ? 0 : 1);
  if (notifyFd === undefined) {
    const fd = c.socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) throw new Error(`socket(AF_UNIX, SOCK_DGRAM): errno ${c.errno()}`);
    notifyFd = fd;
  }
  const body = new TextEncoder().encode(message);
  if (c.sendto(notifyFd, body, body.length, MSG_NOSIGNAL, addr, addrLen) < 0) throw new Error(`sendto ${path}: errno ${c.errno()}`);
}

/** The runtime settings this process runs with, for the agent's start-up log line. */
export type RuntimeSettings = {
  /** Flags baked into the executable (`--compile-exec-argv`). */
  execArgv: string[];
  /** The variables trellis set by executing itself; the operator's own are not listed. */
  env: Record<string, string>;
  /** Why trellis set none, when it wanted to. */
  reason?: string;
  /** A wanted setting that is not in effect, to be logged as a warning. */
  warning?: string;
};

let settings: RuntimeSettings = { execArgv: process.execArgv, env: {} };
export const runtimeSettings = (): RuntimeSettings => settings;

type ExecveProcess = { execve?: (file: string, args: string[], env: Record<string, string>) => never };

/**
 * Called first thing by `trellis run`: executes this binary again, in place, with the runtime
 * variables it was built with (src/runtime-env.ts), unless this process is that execution. Returns
 * when there is nothing (more) to do; a failure to execute is reported by runtimeSettings().warning.
 */
export function applyRuntimeEnv(): void {
  const wanted = bakedRuntimeEnv();
  if (Object.keys(wanted).length === 0 && process.env[reexecGuard] === undefined) return;
  let binary = process.execPath;
  try {
    const st = statSync(process.execPath);
    binary = `${process.execPath} ${st.size} ${Math.trunc(st.mtimeMs)}`;
  } catch {
    // the path alone, then
  }
  let marker: ReturnType<typeof parseReexecMarker>;
  try {
    marker = parseReexecMarker(readFileSync(reexecMarkerPath, "utf8"));
  } catch {
    marker = undefined; // none: the usual case
  }
  const decision: RuntimeEnvDecision = decideRuntimeEnv({ wanted, env: process.env, binary, marker });
  const stay = (reason: string, warning?: string) => (settings = { execArgv: process.execArgv, env: {}, reason, ...(warning ? { warning } : {}) });
  switch (decision.action) {
    case "executed":
      rmSync(reexecMarkerPath, { force: true });
      // Children (an OS update command, containerd's defaults) get the environment the agent was started with.
      for (const k of decision.scrub) delete process.env[k];
      settings = { execArgv: process.execArgv, env: decision.set };
      return;
    case "stay":
      stay(decision.reason, decision.warning);
      return;
    case "exec": {
      const execve = (process as unknown as ExecveProcess).execve;
      if (!g.Bun || typeof execve !== "function") {
        stay(`${runtimeName()} cannot execute itself`);
        return;
      }
      try {
        mkdirSync(dirname(reexecMarkerPath), { recursive: true, mode: 0o700 });
        writeFileSync(reexecMarkerPath, JSON.stringify(decision.marker), { mode: 0o600 });
      } catch (err) {
        // Without the marker a refused setting would crash-loop the agent: better without the settings.
        stay("no marker", `cannot write ${reexecMarkerPath} (${String(err)}); running without the runtime settings ${Object.keys(decision.set).join(", ")}`);
        return;
      }
      try {
        execve.call(process, process.execPath, [argv0(), ...process.argv.slice(2)], decision.env);
      } catch (err) {
        rmSync(reexecMarkerPath, { force: true });
        stay("execve failed", `could not execute ${process.execPath} again with the runtime settings ${Object.keys(decision.set).join(", ")} (${String(err)}); running without them`);
      }
      return;
    }
  }
}

/** The name this process was started under (systemd's ExecStart path), as `ps` shows it. */
function argv0(): string {
  try {
    return readFileSync("/proc/self/cmdline", "utf8").split("\0")[0] || process.execPath;
  } catch {
    return process.execPath;
  }
}

/** TLS settings of one HTTPS connection: PEM text; `rejectUnauthorized: false` skips verification of the server. */
export type TlsOptions = { ca?: string; cert?: string; key?: string; rejectUnauthorized: boolean; serverName?: string };

const denoClients = new Map<string, object>();

/**
 * fetch() over TLS as `tls` says (and through `proxy`, an http(s) proxy URL): Bun's fetch takes the
 * settings per request (`tls`, `proxy`); Deno's takes an HTTP client made from them, kept per set of
 * settings so that connections are reused. Deno trusts its own roots as well as `ca`, and cannot skip
 * verification or name another server per client: those are refused there.
 */
export function fetchWithTls(url: string, init: RequestInit, tls: TlsOptions, proxy?: string): Promise<Response> {
  if (g.Deno) {
    if (!tls.rejectUnauthorized) throw new Error(`${url}: skipping TLS verification (insecure-skip-tls-verify) is not supported under Deno`);
    if (tls.serverName !== undefined) throw new Error(`${url}: tls-server-name is not supported under Deno`);
    const key = JSON.stringify([tls.ca, tls.cert, tls.key, proxy]);
    let client = denoClients.get(key);
    if (!client) {
      client = g.Deno.createHttpClient({ ...(tls.ca && { caCerts: [tls.ca] }), ...(tls.cert && tls.key && { cert: tls.cert, key: tls.key }), ...(proxy && { proxy: { url: proxy } }) });
      denoClients.set(key, client);
    }
    return fetch(url, { ...init, client } as RequestInit);
  }
  const bunTls = { ca: tls.ca, cert: tls.cert, key: tls.key, rejectUnauthorized: tls.rejectUnauthorized, serverName: tls.serverName };
  return fetch(url, { ...init, tls: bunTls, ...(proxy && { proxy }) } as RequestInit);
}

/** A heap snapshot of this process in V8's format (Chrome's DevTools and test/bench/lib/heap-snapshot.ts read it). Bun only. */
export function heapSnapshot(): string {
  const bun = g.Bun as { generateHeapSnapshot?: (format: "v8") => string } | undefined;
  if (!bun?.generateHeapSnapshot) throw new Error(`${runtimeName()} cannot write a heap snapshot`);
  return bun.generateHeapSnapshot("v8");
}
