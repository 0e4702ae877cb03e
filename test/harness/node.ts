// A real worker node for e2e tests: systemd as PID 1 in its own namespaces over an overlay of the
// host's / with a tmpfs upper layer (test/harness/node/boot.sh; /work/shared/notes/node-harness.md).
// The node's systemd, D-Bus and containerd are the real ones; the agent under test runs inside it
// (exec) and sees the node's paths, bus and sockets as its own.
import { randomBytes } from "node:crypto";
import { copyFile, chmod, mkdir, readFile, readlink, writeFile } from "node:fs/promises";
import { dirname } from "node:path";
import { atExit } from "./cleanup.ts";
import { run, type RunResult, waitFor } from "./exec.ts";

const scripts = new URL("./node/", import.meta.url).pathname;
const nodePath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

export type ExecOptions = {
  input?: string;
  timeoutMs?: number;
  env?: Record<string, string>;
  /**
   * Run under the node's CPU limit (NODE_CPU_MAX) as well: for work the machine itself would do, such as
   * cloud-init's install.sh. Otherwise an exec'd command stays in the caller's cgroups (nsenter enters the
   * node's namespaces, not its cgroups), as the harness's observing commands should.
   */
  underCpuLimit?: boolean;
};

/** The node's cgroup in the host's v1 cpu hierarchy, when NODE_CPU_MAX limited it (test/harness/node/boot.sh). */
export type CpuLimitCgroup = { mount: string; path: string };

export interface Node {
  /** Unique per node (kept across its reboots); also the node's hostname. */
  readonly name: string;
  /** Host PID of the node's systemd (PID 1 inside); a new one after a reboot. */
  readonly pid: number;
  /** The node's filesystem seen from the host (/proc/PID/root). */
  readonly root: string;
  /** The node's system bus, reachable from the host. */
  readonly busAddress: string;
  /** eth0's address for net "bridge" (the host end is 10.233.0.1 on bridge trbr0). */
  ip?: string;
  /** Where every process of the node is held to NODE_CPU_MAX, if it was set in the environment at boot. */
  cpuLimit?: CpuLimitCgroup;
  /** Runs a command inside all of the node's namespaces (network included) with a clean environment. */
  exec(cmd: string[], opts?: ExecOptions): Promise<RunResult>;
  /** Like exec(), but throws with the output unless the command exits 0; returns stdout. */
  execOk(cmd: string[], opts?: ExecOptions): Promise<string>;
  readFile(path: string): Promise<string>;
  writeFile(path: string, content: string | Uint8Array, mode?: number): Promise<void>;
  /** Copies a host file into the node, e.g. dist/trellis to /opt/bin/trellis. */
  install(hostPath: string, nodePath: string, mode?: number): Promise<void>;
  /**
   * Waits until the node's systemd ended by a reboot that happened inside the node (`systemctl reboot`:
   * the kernel ends a pid namespace's init with SIGHUP), then boots the same root again: same name,
   * files, machine-id and address; /run, /tmp and every process afresh. Throws if the node ended any other
   * way (power-off, a crash) or was still running after `timeoutMs`. Never reboots anything itself.
   * Returns when the node's systemd was seen ended (Date.now(), within 50 ms).
   */
  bootAfterReboot(timeoutMs?: number): Promise<{ endedAt: number }>;
  /** Powers the node off and removes its cgroup and state; a no-op the second time. */
  stop(): Promise<void>;
}

export type BootOptions = {
  /** "private" (default): loopback only. "host": the host's network, to reach a server on 127.0.0.1.
   *  "bridge": eth0 on host bridge trbr0 (10.233.0.0/24). */
  net?: "host" | "private" | "bridge";
  /** Run containerd.service (with /var/lib/containerd on a tmpfs); masked otherwise. */
  containerd?: boolean;
  /**
   * Able to run a real kubelet and its pods (needs net "bridge" and containerd): cgroup v1 hierarchies
   * (systemd boots in hybrid mode), /dev/kmsg, private copies of the host-global sysctls kubelet writes,
   * a writable /proc/sys/net, CAP_MKNOD with the host's block devices denied. docs/testing.md says why.
   */
  kubelet?: boolean;
  /** Loop devices (/dev/loopN, attached by the test) bound into the node's /dev: its only block devices. */
  loopDevices?: string[];
};

/** Boots a node named `${prefix}-<random>`; `prefix` is at most 13 of [a-z0-9-]. */
export async function bootNode(prefix: string, opts: BootOptions = {}): Promise<Node> {
  if (!/^[a-z0-9-]{1,13}$/.test(prefix)) throw new Error(`bad node name prefix "${prefix}" (want 1-13 of [a-z0-9-])`);
  if (opts.kubelet && (opts.net !== "bridge" || !opts.containerd)) throw new Error(`a kubelet node needs net "bridge" and containerd`);
  const name = `${prefix}-${randomBytes(3).toString("hex")}`;
  const env = {
    ...(process.env as Record<string, string>),
    NODE_NET: opts.net ?? "private",
    NODE_TMPFS: opts.containerd ? "/var/lib/containerd" : "",
    NODE_MASK: opts.containerd ? "" : "containerd.service",
    NODE_KUBELET: opts.kubelet ? "1" : "",
    NODE_LOOP: (opts.loopDevices ?? []).join(" "),
  };
  // Registered before booting: a crash halfway through boot must not leave a node behind either.
  const forget = atExit(() => Bun.spawnSync([`${scripts}stop.sh`, name, "5"], { stdout: "ignore", stderr: "ignore" }));
  const boot = async (again: boolean): Promise<number> => {
    const r = await run([`${scripts}boot.sh`, name], { env: again ? { ...env, NODE_REBOOT: "1" } : env, timeoutMs: 60_000 });
    if (r.code === 0) return Number(r.stdout.trim());
    const stop = await run([`${scripts}stop.sh`, name]);
    forget();
    throw new Error(`booting node ${name}${again ? " again after its reboot" : ""} failed (exit ${r.code}):\n${r.stderr}${stop.stderr}`);
  };
  let pid = await boot(false);
  const state = `/tmp/trellis-test/nodes/${name}`;
  const ip = opts.net === "bridge" ? (await readFile(`${state}/ip`, "utf8")).trim() : undefined;
  const cpuLimit = process.env.NODE_CPU_MAX ? await readCpuLimit(`${state}/cpu-limit`) : undefined;

  let stopped: Promise<void> | undefined;
  const exec = (cmd: string[], o: ExecOptions = {}) => {
    const vars = Object.entries({ PATH: nodePath, HOME: "/root", LANG: "C.UTF-8", ...o.env }).map(([k, v]) => `${k}=${v}`);
    const enter = ["nsenter", "-t", String(pid), "-a", "env", "-i", ...vars, ...cmd];
    const join = o.underCpuLimit && cpuLimit ? ["sh", "-c", 'echo $$ > "$1/cgroup.procs" && shift && exec "$@"', "sh", cpuLimit.mount + cpuLimit.path] : [];
    return run([...join, ...enter], { input: o.input, timeoutMs: o.timeoutMs });
  };
  const rootOf = () => `/proc/${pid}/root`;
  return {
    name,
    get pid() {
      return pid;
    },
    get root() {
      return rootOf();
    },
    get busAddress() {
      return `unix:path=${rootOf()}/run/dbus/system_bus_socket`;
    },
    ...(ip ? { ip } : {}),
    ...(cpuLimit ? { cpuLimit } : {}),
    exec,
    execOk: async (cmd, o) => {
      const r = await exec(cmd, o);
      if (r.code !== 0) throw new Error(`[node ${name}] ${cmd.join(" ")} exited ${r.code}\nstdout: ${r.stdout}\nstderr: ${r.stderr}`);
      return r.stdout;
    },
    readFile: async (path) => readFile(await hostPath(rootOf(), path), "utf8"),
    writeFile: async (path, content, mode = 0o644) => {
      const target = await hostPath(rootOf(), path);
      await mkdir(dirname(target), { recursive: true });
      await writeFile(target, content);
      await chmod(target, mode);
    },
    install: async (source, path, mode = 0o755) => {
      const target = await hostPath(rootOf(), path);
      await mkdir(dirname(target), { recursive: true });
      await copyFile(source, target);
      await chmod(target, mode);
    },
    bootAfterReboot: async (timeoutMs = 60_000) => {
      if (stopped) throw new Error(`node ${name} was stopped: there is nothing to boot again`);
      // The launcher writes how the node's systemd ended once it has (test/harness/node/boot.sh).
      const exit = await waitFor(`node ${name}'s systemd (pid ${pid}) to end`, () => readFile(`${state}/exit`, "utf8").then((t) => t.trim() || undefined, () => undefined), timeoutMs, 50);
      const endedAt = Date.now();
      if (exit !== "129") throw new Error(`node ${name} ended without a reboot (launcher exit ${exit}; 129 is SIGHUP, a reboot; 130 SIGINT, a power-off)`);
      pid = await boot(true);
      return { endedAt };
    },
    stop: () =>
      (stopped ??= (async () => {
        const r = await run([`${scripts}stop.sh`, name]);
        if (r.code !== 0) throw new Error(`stopping node ${name} failed (exit ${r.code}): ${r.stderr}`);
        forget(); // only now: the exit hook retries a stop that failed
      })()),
  };
}

async function readCpuLimit(file: string): Promise<CpuLimitCgroup> {
  const [mount, path] = (await readFile(file, "utf8")).trim().split(" ");
  if (!mount || !path) throw new Error(`${file}: want "MOUNT PATH"`);
  return { mount, path };
}

// The host path of `path` inside the node. Walking /proc/PID/root resolves an absolute symlink against
// the HOST's root (the node's /var/run -> /run would land in the host's /run), so symlinks are
// resolved here, within the node's root. Components that do not exist yet are kept as they are.
async function hostPath(root: string, path: string): Promise<string> {
  if (!path.startsWith("/")) throw new Error(`node path must be absolute: ${path}`);
  const todo = path.split("/").filter((p) => p !== "" && p !== ".");
  let resolved = "";
  for (let links = 0; todo.length > 0; ) {
    const part = todo.shift() as string;
    if (part === "..") {
      resolved = dirname(resolved || "/").replace(/^\/$/, "");
      continue;
    }
    const candidate = `${resolved}/${part}`;
    let target: string;
    try {
      target = await readlink(root + candidate);
    } catch (err) {
      const code = (err as NodeJS.ErrnoException).code;
      if (code !== "EINVAL" && code !== "ENOENT" && code !== "ENOTDIR") throw err;
      resolved = candidate; // not a symlink, or not there (yet)
      continue;
    }
    if (++links > 40) throw new Error(`too many symlinks resolving ${path} in the node`);
    todo.unshift(...target.split("/").filter((p) => p !== "" && p !== "."));
    if (target.startsWith("/")) resolved = "";
  }
  return root + (resolved || "/");
}
