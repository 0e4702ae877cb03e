// What the trellis image holds, shared by build/image.ts and the tests that install it: one layer with
// the binary at /gardener-node-agent (0755; the filePathInImage Gardener's OSC names and install.sh
// extracts), Entrypoint that binary, version and revision labels.
import type { ImageSpec } from "./oci-layout.ts";

export const binaryPathInImage = "/gardener-node-agent";

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
