// Test images: the OCI layout writer lives in build/oci-layout.ts (the release image uses the same
// code); this keeps the harness's one-call form for single-layer fixture images.
import { writeLayout, type ImageFile } from "../../build/oci-layout.ts";

export { writeLayout, type ImageFile, type ImageSpec, type LayoutOptions, type WrittenLayout } from "../../build/oci-layout.ts";

/**
 * Writes an OCI image layout to `layoutDir` holding one image for this machine's architecture, tagged
 * `tag`, whose single gzip layer holds `files` (paths relative to the image root, e.g. "bin/tool").
 * Reproducible: the same files give the same digest. Returns the manifest digest "sha256:...".
 */
export async function buildImageLayout(
  layoutDir: string,
  tag: string,
  files: Record<string, ImageFile>,
  config: { entrypoint?: string[] } = {},
): Promise<string> {
  const platform = { os: "linux", architecture: process.arch === "arm64" ? "arm64" : "amd64" };
  const image = { platform, layers: [files], config: config.entrypoint ? { Entrypoint: config.entrypoint } : {} };
  return writeLayout(layoutDir, tag, image).root.digest;
}
