// systemd control end to end: the compiled agent runs inside a real node (systemd as PID 1, real D-Bus)
// and drives units through `trellis systemd`; src/host/systemd.ts is also exercised from the host
// against the node's bus (reconnects, timeouts). Needs root. The node harness is tested here too.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { existsSync, lstatSync, rmSync } from "node:fs";
import { createServer, type Socket } from "node:net";
import { hostname } from "node:os";
import { createSystemd, SystemdError, type Systemd } from "../../src/host/systemd.ts";
import { createLogger } from "../../src/log.ts";
import { trellisBinary } from "../harness/binary.ts";
import { alive, run, runDir, waitFor } from "../harness/exec.ts";
import { bootNode, type Node } from "../harness/node.ts";
import { buildImageLayout } from "../harness/oci.ts";
import { startRegistry } from "../harness/registry.ts";

const sleeperUnit = `[Unit]
Description=trellis e2e: a service that just runs
[Service]
ExecStart=/bin/sleep infinity
[Install]
WantedBy=multi-user.target
`;

/** A unix socket that accepts connections and never says a word, like a hung bus. */
async function silentSocket(path: string): Promise<{ connections: () => number; close: () => Promise<void> }> {
  const sockets = new Set<Socket>();
  let n = 0;
  const server = createServer((socket) => {
    n++;
    sockets.add(socket);
  });
  await new Promise<void>((resolve, reject) => server.once("error", reject).listen(path, resolve));
  return {
    connections: () => n,
    // server.close() waits for open connections, and under Bun an unread one stays open after its peer hung up.
    close: () => {
      for (const socket of sockets) socket.destroy();
      return new Promise((resolve) => server.close(() => resolve()));
    },
  };
}

describe("trellis systemd (compiled binary inside a node)", () => {
  let node: Node;
  const trellis = (...args: string[]) => node.exec(["/opt/bin/trellis", "systemd", ...args], { timeoutMs: 30_000 });
  const systemctl = async (...args: string[]) => (await node.exec(["systemctl", ...args])).stdout.trim();
  const status = async (unit: string) => {
    const r = await trellis("status", unit, "--json");
    expect(r).toMatchObject({ code: 0, stderr: "" });
    return JSON.parse(r.stdout) as { activeState: string; subState: string; mainPID: number; unitFileState: string; loadState: string };
  };

  beforeAll(async () => {
    const binary = await trellisBinary();
    node = await bootNode("sd");
    await node.install(binary, "/opt/bin/trellis");
  }, 300_000);
  afterAll(() => node?.stop(), 30_000);

  test("unit lifecycle: daemon-reload, enable, start, restart, stop, disable", async () => {
    await node.writeFile("/etc/systemd/system/e2e-sleeper.service", sleeperUnit);
    expect(await trellis("daemon-reload")).toMatchObject({ code: 0, stdout: "", stderr: "" });
    expect(await status("e2e-sleeper.service")).toMatchObject({ loadState: "loaded", activeState: "inactive", subState: "dead", mainPID: 0, unitFileState: "disabled" });

    const enable = await trellis("enable", "e2e-sleeper.service");
    expect(enable.code).toBe(0);
    expect(enable.stdout).toContain("Created symlink /etc/systemd/system/multi-user.target.wants/e2e-sleeper.service → /etc/systemd/system/e2e-sleeper.service.");
    expect(await systemctl("is-enabled", "e2e-sleeper.service")).toBe("enabled");
    expect((await trellis("daemon-reload")).code).toBe(0);

    expect(await trellis("start", "e2e-sleeper.service")).toMatchObject({ code: 0, stdout: "", stderr: "" });
    const started = await status("e2e-sleeper.service");
    expect(started).toMatchObject({ activeState: "active", subState: "running", unitFileState: "enabled" });
    expect(started.mainPID).toBeGreaterThan(0);
    expect(await systemctl("show", "-p", "ActiveState,SubState,MainPID", "e2e-sleeper.service")).toBe(
      `MainPID=${started.mainPID}\nActiveState=active\nSubState=running`,
    );
    expect((await trellis("status", "e2e-sleeper.service")).stdout).toStartWith(
      `e2e-sleeper.service ActiveState=active SubState=running MainPID=${started.mainPID} LoadState=loaded UnitFileState=enabled`,
    );

    expect((await trellis("restart", "e2e-sleeper.service")).code).toBe(0);
    const restarted = await status("e2e-sleeper.service");
    expect(restarted).toMatchObject({ activeState: "active", subState: "running" });
    expect(restarted.mainPID).toBeGreaterThan(0);
    expect(restarted.mainPID).not.toBe(started.mainPID);
    expect(await systemctl("show", "-p", "MainPID", "--value", "e2e-sleeper.service")).toBe(String(restarted.mainPID));

    expect((await trellis("stop", "e2e-sleeper.service")).code).toBe(0);
    expect(await status("e2e-sleeper.service")).toMatchObject({ activeState: "inactive", subState: "dead", mainPID: 0 });
    expect(await systemctl("is-active", "e2e-sleeper.service")).toBe("inactive");

    const disable = await trellis("disable", "e2e-sleeper.service", "--json");
    expect(disable.code).toBe(0);
    expect(JSON.parse(disable.stdout)).toEqual({ type: "unlink", file: "/etc/systemd/system/multi-user.target.wants/e2e-sleeper.service", destination: "" });
    expect(await systemctl("is-enabled", "e2e-sleeper.service")).toBe("disabled");

    // All of it happened in the node, none on the host.
    expect(existsSync("/etc/systemd/system/e2e-sleeper.service")).toBe(false);
  }, 60_000);

  test("a failed job is an error naming the unit and the job result", async () => {
    await node.writeFile("/etc/systemd/system/e2e-fails.service", "[Service]\nType=oneshot\nExecStart=/bin/false\n");
    expect((await trellis("daemon-reload")).code).toBe(0);
    const r = await trellis("start", "e2e-fails.service");
    expect(r.code).toBe(1);
    expect(r.stderr).toContain('trellis systemd: StartUnit e2e-fails.service (bus unix:path=/run/dbus/system_bus_socket): job finished with result "failed"');
    expect(await status("e2e-fails.service")).toMatchObject({ activeState: "failed", subState: "failed" });

    const missing = await trellis("start", "e2e-no-such.service");
    expect(missing.code).toBe(1);
    expect(missing.stderr).toContain("Unit e2e-no-such.service not found. (org.freedesktop.systemd1.NoSuchUnit)");
  }, 30_000);

  test("a bus socket that does not exist fails at once", async () => {
    const t0 = performance.now();
    const r = await trellis("status", "dbus.service", "--bus", "unix:path=/run/no-such-bus.sock", "--timeout", "5");
    expect(performance.now() - t0).toBeLessThan(3_000);
    expect(r.code).toBe(1);
    expect(r.stderr).toBe("trellis systemd: LoadUnit dbus.service (bus unix:path=/run/no-such-bus.sock): connect ENOENT /run/no-such-bus.sock\n");
  }, 30_000);

  test("a socket nobody listens on fails at once", async () => {
    // A socket file left behind by a process that is gone (bound, never listening).
    await node.execOk(["python3", "-c", "import socket; socket.socket(socket.AF_UNIX).bind('/run/stale-bus.sock')"]);
    const r = await trellis("start", "e2e-sleeper.service", "--bus", "unix:path=/run/stale-bus.sock", "--timeout", "5");
    expect(r.code).toBe(1);
    expect(r.stderr).toContain("ECONNREFUSED");
  }, 30_000);

  test("a socket that never answers times out instead of hanging", async () => {
    // The test process serves it; the node sees it at /run/silent-bus.sock.
    const silent = await silentSocket(`${node.root}/run/silent-bus.sock`);
    try {
      for (const args of [["status", "dbus.service"], ["start", "dbus.service"], ["daemon-reload"]]) {
        const t0 = performance.now();
        const r = await trellis(...args, "--bus", "unix:path=/run/silent-bus.sock", "--timeout", "1");
        const elapsed = performance.now() - t0;
        expect(r.code).toBe(1);
        expect(r.stderr).toContain("timed out after 1000 ms: no D-Bus handshake");
        expect(elapsed).toBeGreaterThanOrEqual(1_000);
        expect(elapsed).toBeLessThan(3_000); // timed out, then exited (the open socket did not keep it alive)
      }
      expect(silent.connections()).toBe(3);
    } finally {
      await silent.close();
    }
  }, 30_000);

  test("usage mistakes exit 2", async () => {
    const mistakes = [
      [],
      ["frobnicate"],
      ["start"],
      ["daemon-reload", "x.service"],
      ["status", "x.service", "--timeout", "soon"],
      ["status", "x.service", "--bus", "tcp:host=localhost,port=1"],
      ["status", "x.service", "--nope"],
    ];
    for (const args of mistakes) {
      const r = await trellis(...args);
      expect({ args, code: r.code }).toEqual({ args, code: 2 });
      expect(r.stderr).toStartWith("trellis systemd: ");
    }
  }, 30_000);
});

describe("src/host/systemd.ts against a node's bus, from the host", () => {
  let node: Node;
  beforeAll(async () => {
    node = await bootNode("sdhost");
  }, 60_000);
  afterAll(() => node?.stop(), 30_000);

  test("reconnects after the bus went away", async () => {
    const lines: string[] = [];
    const sd = createSystemd({ address: node.busAddress, log: createLogger({ write: (l) => lines.push(l) }) });
    try {
      const before = await sd.unitStatus("dbus.service");
      expect(before).toMatchObject({ name: "dbus.service", activeState: "active", subState: "running" });
      expect((await sd.listUnits()).map((u) => u.name)).toContain("dbus.service");

      await node.execOk(["systemctl", "restart", "dbus.service"]);
      // systemd itself has to reconnect to the new bus before anyone can reach it there.
      const ping = ["busctl", "call", "org.freedesktop.systemd1", "/org/freedesktop/systemd1", "org.freedesktop.DBus.Peer", "Ping"];
      await waitFor("systemd on the restarted bus", async () => (await node.exec(ping)).code === 0, 10_000, 50);

      const after = await sd.unitStatus("dbus.service");
      expect(after.activeState).toBe("active");
      expect(after.mainPID).not.toBe(before.mainPID);
      const msgs = lines.map((l) => (JSON.parse(l) as { msg: string }).msg);
      expect(msgs).toEqual(["connected to D-Bus", "D-Bus connection lost", "connected to D-Bus"]);
    } finally {
      sd.close();
    }
  }, 30_000);

  test("unitStates agrees with unitStatus: active, inactive, enabled, masked, an alias, a unit with no file, a unit file systemd rejects", async () => {
    await node.writeFile("/etc/systemd/system/e2e-states.service", "[Service]\nExecStart=/bin/sleep infinity\n[Install]\nWantedBy=multi-user.target\nAlias=e2e-alias.service\n");
    await node.writeFile("/etc/systemd/system/e2e-off.service", "[Service]\nExecStart=/bin/true\n");
    await node.writeFile("/etc/systemd/system/e2e-bad.service", "[Service]\nType=no-such-type\nExecStart=relative/path\n");
    await node.execOk(["systemctl", "daemon-reload"]);
    await node.execOk(["systemctl", "enable", "--now", "e2e-states.service"]);
    await node.execOk(["systemctl", "mask", "e2e-masked.service"]);
    const sd = createSystemd({ address: node.busAddress });
    try {
      const units = ["e2e-states.service", "e2e-alias.service", "e2e-off.service", "e2e-masked.service", "e2e-none.service", "e2e-bad.service", "dbus.service"];
      const states = await sd.unitStates(units);
      expect([...states.keys()]).toEqual(units);
      for (const unit of units) {
        const full = await sd.unitStatus(unit);
        expect({ unit, ...states.get(unit) }).toEqual({ unit, loadState: full.loadState, activeState: full.activeState, subState: full.subState, unitFileState: full.unitFileState });
      }
      expect(states.get("e2e-states.service")).toMatchObject({ activeState: "active", unitFileState: "enabled" });
      expect(states.get("e2e-none.service")?.loadState).toBe("not-found");
      expect(states.get("e2e-masked.service")?.unitFileState).toBe("masked");
      expect(await sd.unitStates([])).toEqual(new Map());
    } finally {
      sd.close();
    }
  }, 30_000);

  test("jobs wait for the result", async () => {
    await node.writeFile("/etc/systemd/system/e2e-slow.service", "[Service]\nType=oneshot\nExecStart=/bin/sleep 0.3\nRemainAfterExit=yes\n");
    const sd = createSystemd({ address: node.busAddress });
    try {
      await sd.daemonReload();
      const t0 = performance.now();
      await sd.start("e2e-slow.service");
      expect(performance.now() - t0).toBeGreaterThanOrEqual(300);
      expect(await sd.unitStatus("e2e-slow.service")).toMatchObject({ activeState: "active", subState: "exited" });
      await sd.stop("e2e-slow.service");
      expect((await sd.unitStatus("e2e-slow.service")).activeState).toBe("inactive");
    } finally {
      sd.close();
    }
  }, 30_000);

  test("restarts past systemd's start limit: a restart refused with start-limit-hit is tried once more after reset-failed", async () => {
    // Configuration changes in a row restart a unit more often than its start limit allows; gardener-node-agent's
    // daemon-reload at every reconcile resets the limit, so it never meets it.
    await node.writeFile("/etc/systemd/system/e2e-limited.service", "[Unit]\nStartLimitBurst=2\nStartLimitIntervalSec=600\n[Service]\nExecStart=/bin/sleep infinity\n");
    const sd = createSystemd({ address: node.busAddress });
    try {
      await sd.daemonReload();
      for (let i = 0; i < 4; i++) await sd.restart("e2e-limited.service");
      expect(await sd.unitStatus("e2e-limited.service")).toMatchObject({ activeState: "active", result: "success" });
      await sd.stop("e2e-limited.service");
    } finally {
      sd.close();
    }
  }, 30_000);

  test("one connection for the agent's life keeps no reply: the heap stays flat over 600 unit reads and 20 jobs", async () => {
    await node.writeFile("/etc/systemd/system/e2e-quick.service", "[Service]\nType=oneshot\nExecStart=/bin/true\n");
    const sd = createSystemd({ address: node.busAddress });
    const heapMiB = () => {
      Bun.gc(true);
      return process.memoryUsage().heapUsed / 1048576;
    };
    const work = async (n: number) => {
      for (let i = 0; i < n; i++) await sd.unitStatus("dbus.service");
      for (let i = 0; i < n / 30; i++) await sd.start("e2e-quick.service");
    };
    try {
      await sd.daemonReload();
      await work(60); // warm-up: code, caches, the connection
      const before = heapMiB();
      await work(600);
      // Before unlessLost, each call's Promise.race left a reaction on the connection's never-settling
      // "lost" promise, keeping its reply: 40 MiB here.
      expect(heapMiB() - before).toBeLessThan(3);
    } finally {
      sd.close();
    }
  }, 60_000);

  test("failures are SystemdErrors with context", async () => {
    const silentPath = `${node.root}/run/silent.sock`; // any path will do; this one goes away with the node
    const silent = await silentSocket(silentPath);
    const errorOf = (p: Promise<unknown>) => p.then(() => undefined, (err: unknown) => err);
    const clients: Systemd[] = [];
    const client = (address: string, callTimeoutMs?: number) => {
      clients.push(createSystemd({ address, callTimeoutMs }));
      return clients.at(-1) as Systemd;
    };
    try {
      const timedOut = await errorOf(client(`unix:path=${silentPath}`, 200).start("x.service"));
      expect(timedOut).toBeInstanceOf(SystemdError);
      expect(timedOut).toMatchObject({ kind: "timeout", method: "StartUnit", unit: "x.service", address: `unix:path=${silentPath}` });

      const missing = await errorOf(client(`unix:path=${node.root}/run/missing.sock`).unitStatus("x.service"));
      expect(missing).toMatchObject({ kind: "connection", method: "LoadUnit", unit: "x.service" });

      const noUnit = await errorOf(client(node.busAddress).restart("e2e-not-there.service"));
      expect(noUnit).toMatchObject({ kind: "dbus", method: "RestartUnit", detail: "org.freedesktop.systemd1.NoSuchUnit" });
    } finally {
      for (const sd of clients) sd.close();
      await silent.close();
    }
    expect(() => createSystemd({ address: "tcp:host=127.0.0.1,port=1" })).toThrow(RangeError);
  }, 30_000);
});


describe("node harness", () => {
  test("two nodes at once: own hostnames and filesystems, host untouched, nothing left after stop", async () => {
    const [a, b] = await Promise.all([bootNode("ha"), bootNode("hb", { net: "bridge" })]);
    try {
      expect(a.name).not.toBe(b.name);
      expect((await a.execOk(["hostname"])).trim()).toBe(a.name);
      expect((await b.execOk(["hostname"])).trim()).toBe(b.name);
      expect(hostname()).not.toBe(a.name);
      expect((await a.execOk(["systemctl", "is-system-running"])).trim()).toBe("running");

      // /var/run is an absolute symlink: the write must land in the node's /run, not the host's.
      await a.writeFile("/var/run/trellis-harness-probe", a.name);
      expect((await a.execOk(["cat", "/run/trellis-harness-probe"]))).toBe(a.name);
      expect(await a.readFile("/run/trellis-harness-probe")).toBe(a.name);
      expect(existsSync("/run/trellis-harness-probe")).toBe(false);
      expect((await b.exec(["cat", "/run/trellis-harness-probe"])).code).not.toBe(0);

      // private: loopback only; bridge: eth0 reaches the host end of the bridge.
      expect((await a.execOk(["ip", "-o", "link"])).trim().split("\n").map((l) => l.split(": ")[1])).toEqual(["lo"]);
      expect(b.ip).toMatch(/^10\.233\.0\.\d+$/);
      let received = "";
      const listener = Bun.listen({ hostname: "10.233.0.1", port: 0, socket: { data: (_s, d) => void (received += d.toString()) } });
      try {
        await b.execOk(["bash", "-c", `echo hello from ${b.name} > /dev/tcp/10.233.0.1/${listener.port}`]);
        await waitFor("a message over the bridge", () => received.includes(b.name), 5_000, 20);
      } finally {
        listener.stop(true);
      }
    } finally {
      await Promise.all([a.stop(), b.stop()]);
    }
    for (const n of [a, b]) {
      expect(alive(n.pid)).toBe(false);
      expect(existsSync(`/sys/fs/cgroup/unified/trellis-${n.name}`)).toBe(false);
      expect(existsSync(`/tmp/trellis-test/nodes/${n.name}`)).toBe(false);
    }
    // The bridge goes with the last bridged node (other test processes may still have one).
    const bridged = (await run(["sh", "-c", "ls /tmp/trellis-test/nodes/*/netidx"])).code === 0;
    if (!bridged) expect((await run(["ip", "link", "show", "trbr0"])).code).not.toBe(0);
    await a.stop(); // a second stop is a no-op
  }, 60_000);

  test("registry + containerd: an image built here is pulled inside a node", async () => {
    const registry = await startRegistry();
    const images = runDir("oci");
    let node: Node | undefined;
    try {
      const layout = `${images}/hello`;
      const digest = await buildImageLayout(layout, "v1", { "bin/hello": { content: "#!/bin/sh\necho hello\n", mode: 0o755 } }, { entrypoint: ["/bin/hello"] });
      // Same files, same digest.
      expect(await buildImageLayout(`${layout}-again`, "v1", { "bin/hello": { content: "#!/bin/sh\necho hello\n", mode: 0o755 } }, { entrypoint: ["/bin/hello"] })).toBe(digest);
      const pushed = await registry.push(layout, "e2e/hello", "v1");
      expect(pushed).toEqual({ ref: `${registry.host}/e2e/hello:v1`, digest });

      node = await bootNode("ctr", { containerd: true, net: "host" });
      expect((await node.execOk(["systemctl", "is-active", "containerd.service"])).trim()).toBe("active");
      expect(lstatSync(`${node.root}/var/lib/containerd`).isDirectory()).toBe(true);
      await node.execOk(["ctr", "-n", "e2e", "images", "pull", "--plain-http", pushed.ref]);
      expect(await node.execOk(["ctr", "-n", "e2e", "images", "ls", "-q"])).toBe(`${pushed.ref}\n`);
      const mnt = "/tmp/e2e-hello";
      await node.execOk(["mkdir", "-p", mnt]);
      await node.execOk(["ctr", "-n", "e2e", "images", "mount", pushed.ref, mnt]);
      expect(await node.execOk([`${mnt}/bin/hello`])).toBe("hello\n");
      await node.execOk(["ctr", "-n", "e2e", "images", "unmount", "--rm", mnt]);
    } finally {
      await node?.stop();
      await registry.stop();
      rmSync(images, { recursive: true, force: true });
    }
    expect(alive(registry.pid)).toBe(false);
  }, 60_000);

  test("a reboot inside a node ends its systemd (SIGHUP, never the host's); bootAfterReboot boots the same root: files, machine-id, address kept, /run and processes new", async () => {
    const node = await bootNode("rbt", { net: "bridge", containerd: true });
    try {
      const [pid, machineId, ip] = [node.pid, await node.readFile("/etc/machine-id"), node.ip];
      const hostBoot = await Bun.file("/proc/sys/kernel/random/boot_id").text();
      await node.writeFile("/var/lib/e2e/kept", "on the disk\n");
      await node.writeFile("/var/lib/containerd/kept", "on the containerd volume\n");
      await node.writeFile("/run/e2e-volatile", "in /run\n");
      // Not waited for: the node's systemd ends before it could answer.
      await node.exec(["systemctl", "reboot", "--no-block"]);
      await node.bootAfterReboot(30_000);
      expect(node.pid).not.toBe(pid);
      expect(alive(pid)).toBe(false);
      expect(await Bun.file("/proc/sys/kernel/random/boot_id").text()).toBe(hostBoot);
      expect((await node.execOk(["systemctl", "is-system-running"])).trim()).toBe("running");
      expect((await node.execOk(["hostname"])).trim()).toBe(node.name);
      expect(await node.readFile("/etc/machine-id")).toBe(machineId);
      expect(await node.readFile("/var/lib/e2e/kept")).toBe("on the disk\n");
      expect(await node.readFile("/var/lib/containerd/kept")).toBe("on the containerd volume\n");
      expect((await node.exec(["cat", "/run/e2e-volatile"])).code).not.toBe(0);
      expect((await node.execOk(["systemctl", "is-active", "containerd.service"])).trim()).toBe("active");
      expect(await node.execOk(["ip", "-o", "-4", "addr", "show", "eth0"])).toContain(`${ip}/24`);
      // A power-off is not a reboot: nothing is booted again.
      await node.exec(["systemctl", "poweroff", "--no-block"]);
      expect(String(await node.bootAfterReboot(30_000).catch((err: unknown) => err))).toContain("ended without a reboot (launcher exit 130");
    } finally {
      await node.stop();
    }
    expect(existsSync(`/tmp/trellis-test/nodes/${node.name}`)).toBe(false);
    expect((await run(["findmnt", "-n", `/tmp/trellis-test/nodes/${node.name}/rootfs`])).code).not.toBe(0);
  }, 90_000);
});
