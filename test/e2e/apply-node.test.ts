// `trellis apply --osc` and `trellis plan` with the compiled binary inside a real systemd node:
// what changed is applied, only the units it concerns restart, and what trellis did not write is
// never touched.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { readFileSync } from "node:fs";
import { stringify } from "yaml";
import { parse } from "yaml";
import { trellisBinary } from "../harness/binary.ts";
import { bootNode, type Node } from "../harness/node.ts";

const fixture = parse(readFileSync(new URL("../fixtures/web-osc.yaml", import.meta.url), "utf8"), { version: "1.1" });
type Osc = typeof fixture;
const clone = (): Osc => structuredClone(fixture);

let node: Node;

beforeAll(async () => {
  node = await bootNode("apply");
  await node.install(await trellisBinary(), "/opt/bin/trellis");
}, 60_000);
afterAll(async () => {
  await node?.stop();
});

async function apply(osc: Osc) {
  await node.writeFile("/root/osc.yaml", stringify(osc));
  return node.exec(["/opt/bin/trellis", "apply", "--osc", "/root/osc.yaml"], { timeoutMs: 60_000 });
}
async function plan(osc: Osc) {
  await node.writeFile("/root/osc.yaml", stringify(osc));
  return node.exec(["/opt/bin/trellis", "plan", "--osc", "/root/osc.yaml"], { timeoutMs: 30_000 });
}
async function mainPid(unit: string): Promise<number> {
  return Number((await node.execOk(["systemctl", "show", "-P", "MainPID", unit])).trim());
}
async function active(unit: string): Promise<string> {
  return (await node.exec(["systemctl", "is-active", unit])).stdout.trim();
}

describe("trellis apply inside a node", () => {
  test("first apply writes everything, enables and starts the units", async () => {
    const r = await apply(clone());
    expect(r.stderr).not.toContain("failed");
    expect(r.code).toBe(0);
    expect(await node.readFile("/etc/web/index.html")).toBe("<h1>hello from trellis, version 1</h1>\n");
    expect(await node.readFile("/etc/ticker/message")).toBe("tick\n");
    expect((await node.execOk(["stat", "-c", "%a", "/etc/web/index.html", "/etc/systemd/system/web.service"])).split("\n")).toEqual(["644", "600", ""]);
    expect(await active("web.service")).toBe("active");
    expect(await active("ticker.service")).toBe("active");
    expect((await node.execOk(["systemctl", "is-enabled", "web.service"])).trim()).toBe("enabled");
    expect((await node.execOk(["systemctl", "show", "-P", "DropInPaths", "web.service"])).trim()).toBe("/etc/systemd/system/web.service.d/10-restart.conf");
  });

  test("applying the same OSC again changes nothing and `plan` says so", async () => {
    const before = [await mainPid("web.service"), await mainPid("ticker.service")];
    const p = await plan(clone());
    expect(p.code).toBe(0);
    expect(p.stdout).toContain("nothing to do");
    expect((await apply(clone())).code).toBe(0);
    expect([await mainPid("web.service"), await mainPid("ticker.service")]).toEqual(before);
  });

  test("changing a file a unit lists restarts only that unit", async () => {
    const ticker = await mainPid("ticker.service");
    const web = await mainPid("web.service");
    const osc = clone();
    osc.spec.files[0].content.inline.data = "<h1>hello from trellis, version 2</h1>\n";
    const p = await plan(osc);
    expect(p.code).toBe(3);
    expect(p.stdout).toContain("write file /etc/web/index.html (mode 0644): content changed");
    expect(p.stdout).toContain("restart web.service: file /etc/web/index.html changed");
    expect(p.stdout).not.toContain("ticker");
    expect(p.stdout).not.toContain("daemon-reload");
    expect((await apply(osc)).code).toBe(0);
    expect(await node.readFile("/etc/web/index.html")).toContain("version 2");
    expect(await mainPid("web.service")).not.toBe(web);
    expect(await mainPid("ticker.service")).toBe(ticker);
  });

  test("a foreign drop-in survives, a changed drop-in restarts its unit", async () => {
    await node.writeFile("/etc/systemd/system/ticker.service.d/50-foreign.conf", "[Service]\nEnvironment=FOREIGN=1\n");
    await node.writeFile("/etc/systemd/system/web.service.d/50-foreign.conf", "[Service]\nEnvironment=FOREIGN=1\n");
    const ticker = await mainPid("ticker.service");
    const web = await mainPid("web.service");
    const osc = clone();
    osc.spec.files[0].content.inline.data = "<h1>hello from trellis, version 2</h1>\n";
    osc.spec.units[0].dropIns[0].content = "[Service]\nRestart=always\nRestartSec=2\n";
    const r = await apply(osc);
    expect(r.code).toBe(0);
    expect(r.stdout).toContain("restart web.service: drop-in 10-restart.conf: content changed");
    expect(await mainPid("web.service")).not.toBe(web);
    expect(await mainPid("ticker.service")).toBe(ticker);
    expect(await node.readFile("/etc/systemd/system/ticker.service.d/50-foreign.conf")).toContain("FOREIGN");
    expect(await node.readFile("/etc/systemd/system/web.service.d/50-foreign.conf")).toContain("FOREIGN");
  });

  test("a unit the OSC gives no drop-ins loses the drop-ins others put there once it changes, as with gardener-node-agent", async () => {
    const ticker = await mainPid("ticker.service");
    const osc = clone();
    osc.spec.files[0].content.inline.data = "<h1>hello from trellis, version 2</h1>\n";
    osc.spec.units[0].dropIns[0].content = "[Service]\nRestart=always\nRestartSec=2\n";
    osc.spec.units[1].content = osc.spec.units[1].content.replace("sleep 5", "sleep 6");
    const p = await plan(osc);
    expect(p.stdout).toContain("remove every drop-in of ticker.service, directory and all, /etc/systemd/system/ticker.service.d: the OSC gives this unit no drop-ins");
    const r = await apply(osc);
    expect(r.code).toBe(0);
    expect((await node.exec(["test", "-e", "/etc/systemd/system/ticker.service.d"])).code).toBe(1);
    expect((await node.execOk(["systemctl", "show", "-P", "DropInPaths", "ticker.service"])).trim()).toBe("");
    expect(await mainPid("ticker.service")).not.toBe(ticker);
    // web.service keeps drop-ins in the OSC: the one others put there stays.
    expect(await node.readFile("/etc/systemd/system/web.service.d/50-foreign.conf")).toContain("FOREIGN");
  });

  test("disabling a unit stops and disables it without restarting others", async () => {
    const web = await mainPid("web.service");
    const osc = clone();
    osc.spec.files[0].content.inline.data = "<h1>hello from trellis, version 2</h1>\n";
    osc.spec.units[0].dropIns[0].content = "[Service]\nRestart=always\nRestartSec=2\n";
    osc.spec.units[1].enable = false;
    const r = await apply(osc);
    expect(r.code).toBe(0);
    expect(await active("ticker.service")).toBe("inactive");
    expect((await node.exec(["systemctl", "is-enabled", "ticker.service"])).stdout.trim()).toBe("disabled");
    expect(await mainPid("web.service")).toBe(web);
  });

  test("enablement alone changed, on a unit systemd keeps loaded: each apply reloads, so the next plan sees it (nothing to do) and UnitFileState says it", async () => {
    // systemd keeps a loaded unit's UnitFileState from its last load: without a reload after Enable/
    // DisableUnitFiles the next plan read the old state, and an enable: true after an enable: false was
    // never applied (found side by side with gardener-node-agent). A foreign unit ordered after ticker keeps
    // it loaded while it is stopped (else systemd unloads it and the next read is fresh anyway).
    await node.writeFile("/etc/systemd/system/pin-ticker.service", "[Unit]\nAfter=ticker.service\n[Service]\nExecStart=/bin/sleep infinity\n");
    await node.execOk(["systemctl", "daemon-reload"]);
    await node.execOk(["systemctl", "start", "pin-ticker.service"]);
    const state = async () => (await node.execOk(["systemctl", "show", "-P", "UnitFileState", "ticker.service"])).trim();
    const osc = clone();
    osc.spec.files[0].content.inline.data = "<h1>hello from trellis, version 2</h1>\n";
    osc.spec.units[0].dropIns[0].content = "[Service]\nRestart=always\nRestartSec=2\n";
    for (const enable of [true, false, true, false]) {
      osc.spec.units[1].enable = enable;
      expect((await apply(osc)).code).toBe(0);
      expect(await state()).toBe(enable ? "enabled" : "disabled");
      expect(await active("ticker.service")).toBe(enable ? "active" : "inactive");
      expect((await plan(osc)).stdout).toContain("nothing to do");
    }
    await node.execOk(["systemctl", "stop", "pin-ticker.service"]);
    await node.execOk(["rm", "/etc/systemd/system/pin-ticker.service"]);
    await node.execOk(["systemctl", "daemon-reload"]);
  });

  test("removing a unit and a file from the OSC removes them, foreign files stay", async () => {
    const osc = clone();
    osc.spec.files[0].content.inline.data = "<h1>hello from trellis, version 2</h1>\n";
    osc.spec.units[0].dropIns[0].content = "[Service]\nRestart=always\nRestartSec=2\n";
    osc.spec.units.splice(1, 1); // ticker.service
    osc.spec.files.splice(1, 1); // /etc/ticker/message
    await node.writeFile("/etc/ticker/foreign.txt", "not trellis's");
    await node.writeFile("/etc/systemd/system/ticker.service.d/50-foreign.conf", "[Service]\nEnvironment=FOREIGN=1\n");
    const r = await apply(osc);
    expect(r.code).toBe(0);
    expect((await node.exec(["test", "-e", "/etc/systemd/system/ticker.service"])).code).toBe(1);
    expect((await node.exec(["test", "-e", "/etc/ticker/message"])).code).toBe(1);
    expect(await node.readFile("/etc/ticker/foreign.txt")).toBe("not trellis's");
    expect(await node.readFile("/etc/systemd/system/ticker.service.d/50-foreign.conf")).toContain("FOREIGN");
    expect(await active("web.service")).toBe("active");
  });

  test("a bad OSC changes nothing and names the field", async () => {
    const before = await node.readFile("/etc/web/index.html");
    const osc = clone();
    osc.spec.files[0].content.inline.data = "<h1>version 3</h1>\n";
    osc.spec.files.push({ path: "etc/relative", content: { inline: { encoding: "b64", data: "%%%" } } });
    const r = await apply(osc);
    expect(r.code).toBe(1);
    expect(r.stderr).toContain("spec.files[2] (etc/relative): path is not absolute");
    expect(r.stderr).toContain("spec.files[2] (etc/relative).content.inline.data: not valid base64");
    expect(await node.readFile("/etc/web/index.html")).toBe(before);
  });

  test("a path that is an existing directory is refused before anything is written", async () => {
    const before = await node.readFile("/etc/web/index.html");
    const osc = clone();
    osc.spec.files[0].content.inline.data = "<h1>not written</h1>\n";
    osc.spec.files.push({ path: "/etc/web", content: { inline: { data: "x" } } });
    const r = await apply(osc);
    expect(r.code).toBe(1);
    expect(r.stderr).toContain("spec.files[2] (/etc/web): /etc/web cannot be written: is a directory");
    expect(await node.readFile("/etc/web/index.html")).toBe(before);
  });

  test("an unfinished apply of an older OSC whose path cannot even be read never blocks a newer OSC", async () => {
    // As the state an earlier trellis left behind when an OSC named an existing directory.
    const statePath = "/var/lib/gardener-node-agent/trellis/state.json";
    const state = JSON.parse(await node.readFile(statePath));
    const stale = { kind: "write", target: { type: "file" }, path: "/etc/web", mode: 0o644, sha256: "0".repeat(64), reason: "new" };
    state.progress = { checksum: "f".repeat(64), plan: { checksum: "f".repeat(64), steps: [stale] }, done: [] };
    await node.writeFile(statePath, JSON.stringify(state), 0o600);
    const osc = clone();
    osc.spec.files[0].content.inline.data = "<h1>after a stale plan</h1>\n";
    const r = await apply(osc);
    expect(r.code).toBe(0);
    expect(r.stderr).toContain("a path of the superseded apply cannot be read; not adopted");
    expect(await node.readFile("/etc/web/index.html")).toBe("<h1>after a stale plan</h1>\n");
    expect(JSON.parse(await node.readFile(statePath)).progress).toBeUndefined();
  });

  test("a renamed unit whose new file cannot be written (disk full) leaves the old unit running; the retry converges", async () => {
    const full = "/etc/renamed";
    const osc = (name: string, conf?: string) => ({
      apiVersion: "extensions.gardener.cloud/v1alpha1",
      kind: "OperatingSystemConfig",
      spec: {
        units: [{ name, command: "start", content: "[Service]\nExecStart=/bin/sleep infinity\n[Install]\nWantedBy=multi-user.target\n", filePaths: conf ? [`${full}/conf`] : [] }],
        files: conf ? [{ path: `${full}/conf`, permissions: 0o644, content: { inline: { encoding: "", data: conf } } }] : [],
      },
    });
    expect((await apply(osc("old-name.service") as unknown as Osc)).code).toBe(0);
    const pid = await mainPid("old-name.service");
    await node.execOk(["sh", "-c", `mkdir -p ${full} && mount -t tmpfs -o size=16k,mode=0755 renamed ${full} && (dd if=/dev/zero of=${full}/filler bs=4096 2>/dev/null; true)`]);
    try {
      const r = await apply(osc("new-name.service", "x".repeat(8192)) as unknown as Osc);
      expect(r.code).toBe(1);
      expect(r.stderr).toContain(`${full}/conf`);
      expect(r.stderr).toContain("ENOSPC");
      expect(await active("old-name.service")).toBe("active");
      expect(await mainPid("old-name.service")).toBe(pid);
      expect((await node.execOk(["systemctl", "is-enabled", "old-name.service"])).trim()).toBe("enabled");
      expect((await node.exec(["test", "-e", "/etc/systemd/system/new-name.service"])).code).toBe(1);
      await node.execOk(["rm", `${full}/filler`]);
      expect((await apply(osc("new-name.service", "x".repeat(8192)) as unknown as Osc)).code).toBe(0);
      expect(await active("new-name.service")).toBe("active");
      expect(await active("old-name.service")).toBe("inactive");
      expect((await node.exec(["test", "-e", "/etc/systemd/system/old-name.service"])).code).toBe(1);
    } finally {
      await node.exec(["umount", full]);
    }
  });

  test("the agent's own unit restarts last, after the others were attempted, even when one failed", async () => {
    const unit = (name: string, service: string) => ({ name, command: "start", content: `[Service]\n${service}\n[Install]\nWantedBy=multi-user.target\n`, filePaths: ["/etc/selftest/conf"] });
    const osc = (version: number) => ({
      apiVersion: "extensions.gardener.cloud/v1alpha1",
      kind: "OperatingSystemConfig",
      spec: {
        // Listed first on purpose: order in the OSC must not matter.
        units: [
          unit("gardener-node-agent.service", "ExecStart=/bin/sleep infinity"),
          unit("broken.service", "Type=oneshot\nExecStart=/bin/false"),
          unit("fine.service", "ExecStart=/bin/sleep infinity"),
        ],
        files: [{ path: "/etc/selftest/conf", permissions: 0o644, content: { inline: { encoding: "", data: `v${version}\n` } } }],
      },
    });
    const started = async (u: string) => Number((await node.execOk(["systemctl", "show", "-P", "ExecMainStartTimestampMonotonic", u])).trim());
    for (const version of [1, 2]) {
      const r = await apply(osc(version) as unknown as Osc);
      expect(r.code).toBe(1);
      expect(r.stderr).toContain("failed: restart broken.service: ");
      expect(r.stderr).toContain('RestartUnit broken.service (bus unix:path=/run/dbus/system_bus_socket): job finished with result "failed"');
      const [self, broken, fine] = [await started("gardener-node-agent.service"), await started("broken.service"), await started("fine.service")];
      expect(self).toBeGreaterThan(broken);
      expect(self).toBeGreaterThan(fine);
      expect(await active("gardener-node-agent.service")).toBe("active");
    }
  });
});
