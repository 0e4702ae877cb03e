// What the trellis image holds, shared by build/image.ts and the tests that install it: one layer with
// the binary at /gardener-node-agent (0755; the filePathInImage Gardener's OSC names and install.sh
// extracts), Entrypoint that binary, version and revision labels.
import type { ImageSpec, LayoutOptions } from "./oci-layout.ts";

export const binaryPathInImage = "/gardener-node-agent";

/**
 * How a release compresses its layers: zstd -19 (42.0 MiB for the 113 MiB amd64 binary, against 52.2
 * MiB with gzip -9), which containerd (≥ 1.5), Docker (≥ 23) and trellis's own image store read and
 * take as the index's first entry for their platform; then the same image with a gzip -9 layer, for
 * what cannot read zstd (install.sh on a machine without the `zstd` command takes that one).
 */
export const releaseCompression: LayoutOptions = { compression: "zstd", level: 19, alternative: { compression: "gzip", level: 9 } };

/** The same shape at levels that take seconds instead of minutes, for tests (build/image.ts --fast). */
export const fastCompression: LayoutOptions = { compression: "zstd", level: 3, alternative: { compression: "gzip", level: 1 } };

export function trellisImageSpec(arch: "amd64" | "arm64", binary: Uint8Array, info: { version: string; commit: string }): ImageSpec {
  return {
    platform: { os: "linux", architecture: arch, ...(arch === "arm64" ? { variant: "v8" } : {}) },
    layers: [{ [binaryPathInImage.slice(1)]: { content: binary, mode: 0o755 } }],
    config: {
      Entrypoint: [binaryPathInImage],
      Labels: { "org.opencontainers.image.title": "trellis", "org.opencontainers.image.version": info.version, "org.opencontainers.image.revision": info.commit },
    },
  };
}
