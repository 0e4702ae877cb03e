// Which disk `trellis bootstrap` formats for bootstrap.kubeletDataVolumeSize, and what it runs, with the
// commands answered as a machine would (the real thing: test/e2e/bootstrap.test.ts, on a loop device).
import { describe, expect, test } from "bun:test";
import { ensureKubeletDataVolume, type Run, sizedDisks } from "../../src/host/kubelet-data-volume.ts";
import { createLogger } from "../../src/log.ts";

const size = 21_474_836_480;
const disk = (path: string, more: Record<string, unknown> = {}) => ({ path, type: "disk", size, parttype: null, mountpoints: [null], ...more });

describe("the disks of that size", () => {
  test("only whole, unpartitioned, unmounted disks (or loop devices) of exactly that many bytes", () => {
    expect(
      sizedDisks(
        [
          disk("/dev/vda", { size: size + 512, mountpoints: ["/"] }),
          disk("/dev/vdb"),
          disk("/dev/vdc", { parttype: "0fc63daf-8483-4772-8e79-3d69d8477de4" }),
          disk("/dev/vdd", { children: [disk("/dev/vdd1", { type: "part" })] }),
          disk("/dev/vde", { mountpoints: ["/data"] }),
          disk("/dev/loop3", { type: "loop" }),
          disk("/dev/sr0", { type: "rom" }),
        ],
        size,
      ),
    ).toEqual(["/dev/vdb", "/dev/loop3"]);
  });
});

describe("ensureKubeletDataVolume", () => {
  const log = createLogger({ level: "error" });
  /** Answers lsblk with `devices`, blkid with `labelled`, wipefs per device from `signatures`; records every call. */
  const machine = (o: { devices: unknown[]; labelled?: string; signatures?: Record<string, string> }) => {
    const calls: string[][] = [];
    const run: Run = async (cmd) => {
      calls.push(cmd);
      if (cmd[0] === "blkid") return o.labelled ?? "";
      if (cmd[0] === "lsblk") return JSON.stringify({ blockdevices: o.devices });
      if (cmd[0] === "wipefs") return o.signatures?.[cmd.at(-1) as string] ?? "";
      throw new Error(`not expected here: ${cmd.join(" ")}`);
    };
    return { calls, run };
  };

  test("a disk labelled KUBEDEV: done already, nothing formatted", async () => {
    const m = machine({ devices: [disk("/dev/vdb")], labelled: "/dev/vdb\n" });
    expect(await ensureKubeletDataVolume({ size, tmpDir: "/nonexistent", log, run: m.run })).toBe("/dev/vdb is labelled KUBEDEV already: nothing to do");
    expect(m.calls.map((c) => c[0])).toEqual(["blkid"]);
  });

  test.each([
    ["none of that size", [disk("/dev/vdb", { size: 1 })], {}, `no empty, unpartitioned disk of ${size} bytes (bootstrap.kubeletDataVolumeSize) to format for /var/lib/kubelet; of that size: none`],
    ["one with a filesystem lsblk did not see", [disk("/dev/vdb")], { "/dev/vdb": "xfs\n" }, "of that size: /dev/vdb (xfs)"],
    ["two empty ones", [disk("/dev/vdb"), disk("/dev/vdc")], {}, "2 empty disks of 21474836480 bytes (bootstrap.kubeletDataVolumeSize): /dev/vdb (empty), /dev/vdc (empty); which one is for /var/lib/kubelet is ambiguous"],
  ])("%s: an error naming the field, and nothing formatted", async (_name, devices, signatures, message) => {
    const m = machine({ devices, signatures });
    expect(await ensureKubeletDataVolume({ size, tmpDir: "/nonexistent", log, run: m.run }).then(() => "", (e: Error) => e.message)).toContain(message);
    expect(m.calls.some((c) => c[0] === "mkfs.ext4")).toBe(false);
  });
});
