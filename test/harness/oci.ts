// Hand-made single-layer OCI image layouts (no docker, no buildah): files in, layout dir + digest out.
// Reproducible: the same files give the same digest (sorted tar with fixed owner and mtime; zlib's gzip
// header carries no timestamp).
import { createHash } from "node:crypto";
import { chmodSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { dirname } from "node:path";
import { gzipSync } from "node:zlib";
import { runOk } from "./exec.ts";

/** File content, or content plus mode (default 0644). */
export type ImageFile = string | { content: string | Uint8Array; mode: number };

/**
 * Writes an OCI image layout to `layoutDir` holding one image, tagged `tag`, whose single layer holds
 * `files` (paths relative to the image root, e.g. "bin/tool"). Returns the manifest digest "sha256:...".
 */
export async function buildImageLayout(
  layoutDir: string,
  tag: string,
  files: Record<string, ImageFile>,
  config: { entrypoint?: string[] } = {},
): Promise<string> {
  mkdirSync(`${layoutDir}/blobs/sha256`, { recursive: true });
  const work = mkdtempSync(`${dirname(layoutDir)}/.image-build-`);
  const rootfs = `${work}/rootfs`;
  let layer: Buffer;
  try {
    for (const [path, file] of Object.entries(files)) {
      if (path.startsWith("/") || path.split("/").includes("..")) throw new Error(`image path must be relative, inside the image: ${path}`);
      const { content, mode } = typeof file === "string" ? { content: file, mode: 0o644 } : file;
      mkdirSync(dirname(`${rootfs}/${path}`), { recursive: true });
      writeFileSync(`${rootfs}/${path}`, content);
      chmodSync(`${rootfs}/${path}`, mode);
    }
    const tar = ["tar", "--sort=name", "--owner=0", "--group=0", "--numeric-owner", "--mtime=@0", "-C", rootfs, "-cf", `${work}/layer.tar`];
    await runOk([...tar, ...readdirSync(rootfs)]);
    layer = readFileSync(`${work}/layer.tar`);
  } finally {
    rmSync(work, { recursive: true, force: true });
  }
  const blob = (data: Uint8Array | string, mediaType: string) => {
    const hex = sha256(data);
    writeFileSync(`${layoutDir}/blobs/sha256/${hex}`, data);
    return { mediaType, digest: `sha256:${hex}`, size: Buffer.byteLength(data) };
  };
  const imageConfig = {
    architecture: process.arch === "arm64" ? "arm64" : "amd64",
    os: "linux",
    config: config.entrypoint ? { Entrypoint: config.entrypoint } : {},
    rootfs: { type: "layers", diff_ids: [`sha256:${sha256(layer)}`] },
  };
  const manifest = {
    schemaVersion: 2,
    mediaType: "application/vnd.oci.image.manifest.v1+json",
    config: blob(JSON.stringify(imageConfig), "application/vnd.oci.image.config.v1+json"),
    layers: [blob(gzipSync(layer, { level: 9 }), "application/vnd.oci.image.layer.v1.tar+gzip")],
  };
  const ref = blob(JSON.stringify(manifest), manifest.mediaType);
  writeFileSync(`${layoutDir}/oci-layout`, JSON.stringify({ imageLayoutVersion: "1.0.0" }));
  writeFileSync(
    `${layoutDir}/index.json`,
    JSON.stringify({ schemaVersion: 2, manifests: [{ ...ref, annotations: { "org.opencontainers.image.ref.name": tag } }] }),
  );
  return ref.digest;
}

function sha256(data: Uint8Array | string): string {
  return createHash("sha256").update(data).digest("hex");
}
