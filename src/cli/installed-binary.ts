// What `bootstrap` tells the agent about the binary install.sh just installed, so that the agent's first
// apply does not redo install.sh's work. The OSC lists the agent's own binary as an imageRef file; without
// this, the first apply downloads and unpacks the agent's image again (its 42 MiB layer into the image
// cache) and hashes the 113 MiB binary twice (the self-update check, then the node's observation).
//
// install.sh records in <config dir>/init-installed, after it verified the image's digests and installed
// the binary: "<digest hex it was given> <binary's sha256> <platform manifest digest>". Here the binary
// goes into the image cache as that manifest's /gardener-node-agent (copied, hashed while copied: a binary
// that is no longer what was recorded is not taken), and into the table of known file hashes (hashed
// again, so the table holds what the file is now). Nothing is trusted without being hashed; only the
// download and the decompression are saved.
import { agentBinary } from "../api/agent-unit.ts";
import { paths } from "../api/paths.ts";
import type { Files } from "../host/files.ts";
import { withKnownHashes } from "../host/known-hashes.ts";
import { archOf, createImageStore } from "../host/registry/store.ts";
import { describeError, type Logger } from "../log.ts";

export const installRecordName = "init-installed";
/** The binary's path in trellis's image, as install.sh extracts it (Gardener's filePathInImage). */
const pathInImage = "/gardener-node-agent";

type InstallRecord = { digest: string; sha256: string; manifest: string };

/** The record install.sh wrote, if it installed from an image (a TRELLIS_URL install names no manifest). */
export function parseInstallRecord(text: string): InstallRecord | undefined {
  const m = /^([0-9a-f]{64}) ([0-9a-f]{64}) (sha256:[0-9a-f]{64})\s*$/.exec(text);
  return m ? { digest: `sha256:${m[1]}`, sha256: m[2] as string, manifest: m[3] as string } : undefined;
}

/** Best effort: on any failure the agent's first apply does the work itself, as it would without install.sh. */
export async function adoptInstalledBinary(o: { configDir: string; files: Files; log: Logger }): Promise<void> {
  const { files, log } = o;
  const recordPath = `${o.configDir}/${installRecordName}`;
  try {
    const text = await files.read(recordPath);
    const record = text && parseInstallRecord(new TextDecoder().decode(text));
    if (!record) {
      log.info("no record of an image install.sh installed: the agent's first apply takes its binary from the image itself", { record: recordPath });
      return;
    }
    // The table first: it hashes the file as it is now, and the copy below checks the same content.
    const inspected = await (await withKnownHashes(files, { path: paths.knownHashes, log })).inspect([agentBinary]);
    const now = inspected.get(agentBinary)?.file?.sha256;
    if (now !== record.sha256) {
      log.info("the binary is not the one install.sh recorded: not taken into the image cache", { binary: agentBinary, sha256: now, recorded: record.sha256 });
      return;
    }
    const images = createImageStore({ cacheDir: paths.imageCache, hostsDir: paths.containerdHostsDir, arch: archOf(process.arch), log });
    await images.adopt({ index: record.digest, manifest: record.manifest, path: pathInImage, source: agentBinary, sha256: record.sha256 });
  } catch (err) {
    log.warn("could not take the installed binary into the image cache: the agent's first apply pulls it again", { record: recordPath, error: describeError(err) });
  }
}
