// Image references as containerd's CRI plugin reads them (distribution's ParseNormalizedNamed): a bare
// name means Docker Hub ("alpine" → docker.io/library/alpine), a missing tag means "latest", and a
// reference carrying both tag and digest ("name:tag@sha256:…") is pulled by the digest alone — the tag
// is only a label then, exactly as containerd treats it.

export type ImageReference = {
  /** Registry host[:port] as hosts.toml directories name it; Docker Hub is "docker.io". */
  registry: string;
  /** Repository path inside the registry, e.g. "library/alpine". */
  repository: string;
  /** The tag, if given (or "latest" when neither tag nor digest was). */
  tag?: string;
  /** "sha256:<64 hex>", if given; it wins over the tag. */
  digest?: string;
};

export class InvalidReferenceError extends Error {
  override name = "InvalidReferenceError";
}

// distribution/reference's grammar, component by component.
const pathComponent = /^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*$/;
const domainLabel = "(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])";
const domainPattern = new RegExp(`^(?:${domainLabel}(?:\\.${domainLabel})*|\\[[0-9A-Fa-f:.]+\\])(?::[0-9]+)?$`);
const tagPattern = /^[\w][\w.-]{0,127}$/;
const digestPattern = /^[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9A-Fa-f]{32,}$/;
export const sha256Digest = /^sha256:[0-9a-f]{64}$/;

const dockerHub = "docker.io";
const maxNameLength = 255;

export function parseImageReference(input: string): ImageReference {
  const fail = (why: string): never => {
    throw new InvalidReferenceError(`invalid image reference ${JSON.stringify(input)}: ${why}`);
  };
  if (input === "") fail("empty");
  if (input !== input.trim()) fail("leading or trailing whitespace");

  let rest = input;
  let digest: string | undefined;
  const at = rest.indexOf("@");
  if (at >= 0) {
    digest = rest.slice(at + 1);
    rest = rest.slice(0, at);
    if (!digestPattern.test(digest)) fail(`malformed digest ${JSON.stringify(digest)}`);
    // Only sha256 is verified below; a sha512 pin would otherwise be trusted without a check.
    if (!sha256Digest.test(digest)) fail(`only sha256 digests (64 lowercase hex digits) are supported, got ${JSON.stringify(digest)}`);
  }

  // A tag is the part after the last ":" of the last path component (a ":" before a "/" is a port).
  let tag: string | undefined;
  const colon = rest.lastIndexOf(":");
  if (colon > rest.lastIndexOf("/")) {
    tag = rest.slice(colon + 1);
    rest = rest.slice(0, colon);
    if (!tagPattern.test(tag)) fail(`malformed tag ${JSON.stringify(tag)}`);
  }

  const slash = rest.indexOf("/");
  const first = slash < 0 ? "" : rest.slice(0, slash);
  let registry: string;
  let repository: string;
  // The first component names a registry only if it looks like a host: a dot, a port, or "localhost".
  if (slash < 0 || (!first.includes(".") && !first.includes(":") && first !== "localhost" && first === first.toLowerCase())) {
    registry = dockerHub;
    repository = rest;
  } else {
    registry = first;
    repository = rest.slice(slash + 1);
    if (!domainPattern.test(registry)) fail(`malformed registry host ${JSON.stringify(registry)}`);
  }
  if (registry === "index.docker.io") registry = dockerHub;
  if (registry === dockerHub && !repository.includes("/")) repository = `library/${repository}`;

  if (repository === "") fail("no repository name");
  if (repository !== repository.toLowerCase()) fail("repository name must be lowercase");
  for (const component of repository.split("/")) {
    if (!pathComponent.test(component)) fail(`malformed repository path component ${JSON.stringify(component)}`);
  }
  if (`${registry}/${repository}`.length > maxNameLength) fail(`name longer than ${maxNameLength} characters`);

  if (tag === undefined && digest === undefined) tag = "latest";
  return { registry, repository, ...(tag !== undefined ? { tag } : {}), ...(digest !== undefined ? { digest } : {}) };
}

/** The fully qualified form, e.g. "docker.io/library/alpine:3.20@sha256:…". */
export function formatReference(ref: ImageReference): string {
  return `${ref.registry}/${ref.repository}${ref.tag !== undefined ? `:${ref.tag}` : ""}${ref.digest !== undefined ? `@${ref.digest}` : ""}`;
}
