// Manifests and image indexes (OCI and Docker schema 2), parsed at the edge: only what extracting a file
// needs — the layer list, and for an index the linux/<arch> entry.
import { ContentError } from "./errors.ts";
import { manifestMediaTypes as mt } from "./client.ts";
import { sha256Digest } from "./reference.ts";

export type Descriptor = { mediaType: string | undefined; digest: string; size: number };
export type PlatformDescriptor = Descriptor & { platform?: { os?: string; architecture?: string; variant?: string } };

export type Manifest =
  | { kind: "index"; manifests: PlatformDescriptor[] }
  | { kind: "manifest"; config: Descriptor; layers: Descriptor[] };

const imageConfigTypes = new Set(["application/vnd.oci.image.config.v1+json", "application/vnd.docker.container.image.v1+json"]);
/** Is this config blob an image config (which names os and architecture), not some artifact's? */
export const isImageConfig = (d: Descriptor) => d.mediaType === undefined || imageConfigTypes.has(d.mediaType);

const isRecord = (v: unknown): v is Record<string, unknown> => typeof v === "object" && v !== null && !Array.isArray(v);

function descriptor(v: unknown, where: string): Descriptor {
  if (!isRecord(v)) throw new ContentError(`${where} is not a descriptor`);
  const { mediaType, digest, size } = v;
  if (typeof digest !== "string" || !sha256Digest.test(digest)) throw new ContentError(`${where} has no sha256 digest (${JSON.stringify(digest)})`);
  if (typeof size !== "number" || !Number.isSafeInteger(size) || size < 0) throw new ContentError(`${where} has no valid size`);
  if (mediaType !== undefined && typeof mediaType !== "string") throw new ContentError(`${where} has a non-string mediaType`);
  return { mediaType, digest, size };
}

/** Parses a manifest or index; `headerType` is the Content-Type it came with (OCI may omit mediaType). */
export function parseManifest(bytes: Uint8Array, headerType: string | undefined, digest: string): Manifest {
  let doc: unknown;
  try {
    doc = JSON.parse(new TextDecoder().decode(bytes));
  } catch {
    throw new ContentError(`manifest ${digest} is not JSON`);
  }
  if (!isRecord(doc)) throw new ContentError(`manifest ${digest} is not a JSON object`);
  if (doc.schemaVersion === 1) throw new ContentError(`manifest ${digest} is Docker schema 1, which is not supported (push the image again with a current tool)`);
  const type = typeof doc.mediaType === "string" ? doc.mediaType : headerType;
  const isIndex = type === mt.ociIndex || type === mt.dockerList || (type !== mt.ociManifest && type !== mt.dockerManifest && Array.isArray(doc.manifests));
  if (isIndex) {
    if (!Array.isArray(doc.manifests)) throw new ContentError(`image index ${digest} has no manifests list`);
    return {
      kind: "index",
      manifests: doc.manifests.map((m: unknown, i) => {
        const d = descriptor(m, `image index ${digest} entry ${i}`);
        const p = (m as Record<string, unknown>).platform;
        if (!isRecord(p)) return d;
        const str = (x: unknown) => (typeof x === "string" ? x : undefined);
        return { ...d, platform: { os: str(p.os), architecture: str(p.architecture), variant: str(p.variant) } };
      }),
    };
  }
  if (type !== undefined && type !== mt.ociManifest && type !== mt.dockerManifest && !Array.isArray(doc.layers)) {
    throw new ContentError(`manifest ${digest} has media type ${type}, which is not an image manifest or index`);
  }
  if (!Array.isArray(doc.layers)) throw new ContentError(`manifest ${digest} has no layers list`);
  return {
    kind: "manifest",
    config: descriptor(doc.config, `manifest ${digest} config`),
    layers: doc.layers.map((l: unknown, i) => descriptor(l, `manifest ${digest} layer ${i + 1}`)),
  };
}

/**
 * The index entry for linux/<arch>: one without a variant (or arm64's "v8") first, as containerd's default
 * platform matcher prefers; throws ContentError listing what the index has instead.
 */
export function pickPlatform(index: { manifests: PlatformDescriptor[] }, arch: string, digest: string): PlatformDescriptor {
  const matching = index.manifests.filter((m) => m.platform?.os === "linux" && m.platform.architecture === arch);
  const plain = matching.find((m) => m.platform?.variant === undefined || (arch === "arm64" && m.platform.variant === "v8"));
  const chosen = plain ?? matching[0];
  if (chosen) return chosen;
  const has = index.manifests
    .map((m) => (m.platform ? `${m.platform.os ?? "?"}/${m.platform.architecture ?? "?"}${m.platform.variant ? `/${m.platform.variant}` : ""}` : "(no platform)"))
    .join(", ");
  throw new ContentError(`image index ${digest} has no linux/${arch} image (it has: ${has || "nothing"})`);
}
