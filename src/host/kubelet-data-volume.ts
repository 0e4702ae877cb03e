// The kubelet data volume, as gardener-node-agent's bootstrap prepares it (bootstrap.kubeletDataVolumeSize;
// pkg/nodeagent/bootstrap/templates/scripts/format-kubelet-data-volume.tpl.sh): an empty disk of exactly
// that size is formatted ext4 with the label KUBEDEV and project quotas, what /var/lib/kubelet holds is
// copied onto it, and it is mounted there. The OSC's var-lib-kubelet.mount mounts it at later boots. A
// disk labelled KUBEDEV already means it was done: nothing happens.
//
// Stricter than gardener-node-agent, on purpose: a disk with partitions is never a candidate (the script
// formats one whose partitions are not mounted, destroying them), a disk with any signature on it
// (wipefs) is never formatted, two candidates are an error instead of "the first one lsblk lists", and a
// loop device counts as a disk (an attached image is how a machine without a second disk, and the tests,
// provide one).
import { execFile } from "node:child_process";
import { mkdir, mkdtemp, rm } from "node:fs/promises";
import { join } from "node:path";
import { describeError, type Logger } from "../log.ts";

export const kubeletDataLabel = "KUBEDEV";
const kubeletDir = "/var/lib/kubelet";

type BlockDevice = { path: string; type: string; size: number; parttype: string | null; mountpoints?: (string | null)[]; children?: BlockDevice[] };

/** Runs a command; its stdout, or an error with its stderr unless it exited with one of `ok`. */
export type Run = (cmd: string[], ok?: number[]) => Promise<string>;

const runCommand: Run = (cmd, ok = [0]) =>
  new Promise((resolve, reject) => {
    execFile(cmd[0] as string, cmd.slice(1), { timeout: 10 * 60_000, maxBuffer: 4 << 20 }, (err, stdout, stderr) => {
      const code = err ? (typeof err.code === "number" ? err.code : -1) : 0;
      if (ok.includes(code)) resolve(stdout);
      else reject(new Error(`${cmd.join(" ")}: ${stderr.trim() || err?.message}`));
    });
  });

/** Disks (or loop devices) of exactly `size` bytes with no partition table, no partitions and no mount. */
export function sizedDisks(devices: BlockDevice[], size: number): string[] {
  return devices
    .filter((d) => (d.type === "disk" || d.type === "loop") && d.size === size && !d.parttype && (d.children ?? []).length === 0 && (d.mountpoints ?? []).every((m) => !m))
    .map((d) => d.path);
}

/** Formats and mounts the kubelet data volume; returns what it did, for the log. */
export async function ensureKubeletDataVolume(o: { size: number; tmpDir: string; log: Logger; run?: Run }): Promise<string> {
  const run = o.run ?? runCommand;
  const field = "bootstrap.kubeletDataVolumeSize";
  // blkid looks at the devices themselves: lsblk's filesystem and label columns are empty without udev.
  const labelled = (await run(["blkid", "--cache-file", "/dev/null", "--list-one", "--output", "device", "--match-token", `LABEL=${kubeletDataLabel}`], [0, 2])).trim();
  if (labelled) return `${labelled} is labelled ${kubeletDataLabel} already: nothing to do`;
  const listing = JSON.parse(await run(["lsblk", "--json", "--bytes", "--output", "PATH,TYPE,SIZE,PARTTYPE,MOUNTPOINTS"])) as { blockdevices?: BlockDevice[] };
  const candidates = sizedDisks(listing.blockdevices ?? [], o.size);
  const found = await Promise.all(
    candidates.map(async (path) => ({ path, signatures: (await run(["wipefs", "--no-act", "--noheadings", "--output", "TYPE", path]).catch((err: unknown) => `unreadable: ${describeError(err)}`)).trim() })),
  );
  const empty = found.filter((f) => f.signatures === "");
  if (empty.length !== 1) {
    const seen = found.map((f) => `${f.path} (${f.signatures ? f.signatures.split("\n").join(", ") : "empty"})`).join(", ");
    throw new Error(
      empty.length === 0
        ? `no empty, unpartitioned disk of ${o.size} bytes (${field}) to format for ${kubeletDir}; of that size: ${seen || "none"}`
        : `${empty.length} empty disks of ${o.size} bytes (${field}): ${seen}; which one is for ${kubeletDir} is ambiguous`,
    );
  }
  const disk = (empty[0] as { path: string }).path;
  o.log.info("formatting the kubelet data volume", { disk, size: o.size, label: kubeletDataLabel });
  // Gardener's options: project quotas, which kubelet uses to measure emptyDir volumes.
  const mkfs = (quota: boolean) => ["mkfs.ext4", "-q", "-F", "-L", kubeletDataLabel, ...(quota ? ["-O", "quota"] : []), "-E", `lazy_itable_init=0,lazy_journal_init=0${quota ? ",quotatype=usrquota:grpquota:prjquota" : ""}`, disk];
  let quota = true;
  await run(mkfs(quota));
  await mkdir(o.tmpDir, { recursive: true });
  await mkdir(kubeletDir, { recursive: true });
  // What is in /var/lib/kubelet already (kubelet's bootstrap kubeconfig, for one) moves onto the disk.
  const copy = await mkdtemp(join(o.tmpDir, "kubelet-data-"));
  try {
    await run(["mount", disk, copy]).catch(async (err: unknown) => {
      // A kernel without ext4's quota support (CONFIG_QFMT_V2) cannot mount such a filesystem at all.
      o.log.warn("the kernel cannot mount ext4 with quotas: formatting without them (kubelet then measures emptyDir volumes by walking them)", { disk, error: describeError(err) });
      quota = false;
      await run(mkfs(quota));
      await run(["mount", disk, copy]);
    });
    try {
      await run(["cp", "-a", `${kubeletDir}/.`, copy]);
    } finally {
      await run(["umount", copy]);
    }
  } finally {
    await rm(copy, { recursive: true, force: true });
  }
  await run(["mount", "-o", `defaults,${quota ? "prjquota," : ""}errors=remount-ro`, disk, kubeletDir]);
  return `formatted ${disk} (${o.size} bytes, label ${kubeletDataLabel}${quota ? ", project quotas" : ", without quotas"}) and mounted it at ${kubeletDir}`;
}
