// A plain-HTTP OCI registry on 127.0.0.1 (Debian's docker-registry, i.e. distribution 2.8) with its
// storage in a per-run directory, and pushing OCI layouts into it with skopeo.
import { closeSync, openSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { atExit } from "./cleanup.ts";
import { freePort, runDir, runOk, waitFor } from "./exec.ts";

export interface Registry {
  /** "127.0.0.1:PORT", the registry part of image references. */
  host: string;
  pid: number;
  /** The filesystem storage root: blobs live under `<dataDir>/docker/registry/v2/blobs/sha256/<xx>/<hex>/data`. */
  dataDir: string;
  /**
   * Pushes tag `tag` of the OCI layout at `layoutDir` as REPO:TAG; returns the reference and manifest digest.
   * `all`: push an image index with every platform image (skopeo's default picks this machine's image).
   * `layoutTag`: the layout's tag to push, when it is not `tag`.
   */
  push(layoutDir: string, repo: string, tag: string, opts?: { all?: boolean; layoutTag?: string }): Promise<{ ref: string; digest: string }>;
  /** Ends the registry process but keeps its storage; up() serves the same storage on the same port again. */
  down(): Promise<void>;
  up(): Promise<void>;
  stop(): Promise<void>;
}

export async function startRegistry(): Promise<Registry> {
  // freePort() can race with another process grabbing the port: then the registry exits, try another.
  for (let attempt = 1; ; attempt++) {
    try {
      return await startOn(await freePort());
    } catch (err) {
      if (attempt === 3) throw err;
    }
  }
}

async function startOn(port: number): Promise<Registry> {
  const host = `127.0.0.1:${port}`;
  const dir = runDir(`registry-${port}`);
  writeFileSync(
    `${dir}/config.yml`,
    `version: 0.1\nlog: {level: warn}\nstorage:\n  filesystem: {rootdirectory: ${dir}/data}\nhttp: {addr: "${host}"}\n`,
  );
  const spawn = () => {
    const logFd = openSync(`${dir}/registry.log`, "a");
    const p = Bun.spawn(["docker-registry", "serve", `${dir}/config.yml`], { stdio: ["ignore", logFd, logFd] });
    closeSync(logFd);
    p.unref(); // stop() ends it; a forgotten registry must not keep the test process alive (the exit hook kills it)
    return p;
  };
  let proc = spawn();
  const running = () => proc.exitCode === null && proc.signalCode === null; // Bun knows: no PID reuse risk
  const forget = atExit(() => running() && proc.kill("SIGKILL"));
  const end = async () => {
    if (!running()) return;
    proc.kill("SIGTERM");
    const timer = setTimeout(() => proc.kill("SIGKILL"), 5_000);
    await proc.exited;
    clearTimeout(timer);
  };
  const stop = async () => {
    await end();
    forget();
    rmSync(dir, { recursive: true, force: true });
  };
  // Fails fast when the registry exits (e.g. the port was taken in the meantime).
  const serving = async () => {
    const died = proc.exited.then((code) => {
      throw new Error(`docker-registry on ${host} exited ${code}: ${readFileSync(`${dir}/registry.log`, "utf8")}`);
    });
    died.catch(() => {}); // it also settles after a normal stop()
    await Promise.race([waitFor(`registry on ${host}`, async () => (await fetch(`http://${host}/v2/`)).ok, 10_000, 50), died]);
  };
  try {
    await serving();
  } catch (err) {
    await stop();
    throw err;
  }
  return {
    host,
    get pid() {
      return proc.pid;
    },
    dataDir: `${dir}/data`,
    push: async (layoutDir, repo, tag, opts = {}) => {
      const ref = `${host}/${repo}:${tag}`;
      const digestFile = `${dir}/push-${Date.now()}-${Math.random().toString(36).slice(2)}.digest`;
      const all = opts.all ? ["--all"] : [];
      await runOk(["skopeo", "copy", "-q", ...all, "--dest-tls-verify=false", "--digestfile", digestFile, `oci:${layoutDir}:${opts.layoutTag ?? tag}`, `docker://${ref}`]);
      const digest = readFileSync(digestFile, "utf8").trim();
      rmSync(digestFile);
      return { ref, digest };
    },
    down: end,
    // A registry already up stays the one: a second spawn would lose the handle of the first, which then outlives the test.
    up: async () => {
      if (running()) return;
      proc = spawn();
      await serving();
    },
    stop,
  };
}
