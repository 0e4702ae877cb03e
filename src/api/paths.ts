// gardener-node-agent's paths on the node (pkg/apis/config/nodeagent/v1alpha1), kept so trellis can
// take over a node GNA set up, and GNA's control plane finds what it expects.
export const baseDir = "/var/lib/gardener-node-agent";
export const credentialsDir = `${baseDir}/credentials`;
export const paths = {
  baseDir,
  credentialsDir,
  tempDir: `${baseDir}/tmp`,
  bootstrapToken: `${credentialsDir}/bootstrap-token`,
  token: `${credentialsDir}/token`,
  kubeconfig: `${credentialsDir}/kubeconfig`,
  clusterCa: `${baseDir}/cluster-ca.crt`,
  machineName: `${baseDir}/machine-name`,
  zone: `${baseDir}/zone`,
  /** gardener-node-agent's record of the OSC applied last, which trellis keeps as it does (src/apply/gardener-record.ts). */
  lastAppliedOsc: `${baseDir}/last-applied-osc.yaml`,
  /** gardener-node-agent's record of an apply it began, which trellis removes once it completed one (src/apply/gardener-record.ts). */
  lastComputedOscChanges: `${baseDir}/last-computed-osc-changes.yaml`,
  /** trellis's own copy of the OSC applied last, as the Secret had it: the rollback target a passed gate keeps. */
  appliedOsc: `${baseDir}/trellis/applied-osc.yaml`,
  binaryDir: "/opt/bin",
  /** The name of the Node the agent last reported on: found again after the hostname changed. */
  nodeName: `${baseDir}/trellis/node-name`,
  /** The sha256 of the files trellis checks, by their identity (src/host/known-hashes.ts). */
  knownHashes: `${baseDir}/trellis/known-hashes.json`,
  /** The last osc.yaml parsed, as JSON with its checksum (src/controllers/osc/parse.ts). */
  parsedOsc: `${baseDir}/trellis/parsed-osc.json`,
  /** Files extracted from images (imageRef), by content hash. */
  imageCache: `${baseDir}/trellis/images`,
  /** containerd's per-registry hosts.toml directories: the mirrors trellis pulls through too. */
  containerdHostsDir: "/etc/containerd/certs.d",
} as const;

/** Paths of kubelet's credentials, as gardener-node-agent checks them (components/kubelet). */
export const kubelet = {
  bootstrapKubeconfig: "/var/lib/kubelet/kubeconfig-bootstrap",
  realKubeconfig: "/var/lib/kubelet/kubeconfig-real",
  clientCertificate: "/var/lib/kubelet/pki/kubelet-client-current.pem",
} as const;

/** The agent's own unit: the name gardener-node-agent uses, so Gardener's OSC restarts trellis. */
export const agentUnit = "gardener-node-agent.service";
/** Key of the OSC in the OSC Secret's data. */
export const oscDataKey = "osc.yaml";

// Linux's PATH_MAX (with its NUL) and NAME_MAX, in bytes: a longer path or name fails only when it is
// written, which is too late for the files written before it.
const maxPathBytes = 4095;
const maxNameBytes = 255;
// Counted, not encoded: every path of every inspection is checked (a TextEncoder and a copy each were 5 % of a re-check).
function utf8Bytes(s: string): number {
  let n = 0;
  for (let i = 0; i < s.length; i++) {
    const c = s.charCodeAt(i);
    if (c < 0x80) n += 1;
    else if (c < 0x800) n += 2;
    else if (c >= 0xd800 && c <= 0xdbff && i + 1 < s.length && (s.charCodeAt(i + 1) & 0xfc00) === 0xdc00) {
      n += 4; // a surrogate pair: one code point of four bytes
      i++;
    } else n += 3; // the rest of the BMP, and a lone surrogate (encoded as U+FFFD, three bytes)
  }
  return n;
}

/**
 * Why `path` is not an acceptable absolute node path, or undefined when it is: it must be absolute
 * and normalised (no "." or ".." segments, no "//", no trailing "/"), with no NUL byte, and within
 * Linux's length limits.
 */
export function nodePathProblem(path: string): string | undefined {
  if (path.includes("\0")) return "contains a NUL byte";
  if (!path.startsWith("/")) return "is not absolute";
  if (path === "/") return undefined;
  if (path.endsWith("/")) return "has a trailing slash";
  if (path.includes("//")) return 'has an empty segment ("//")';
  const segments = path.split("/");
  if (segments.some((seg) => seg === "." || seg === "..")) return 'has a "." or ".." segment';
  const bytes = utf8Bytes(path);
  if (bytes > maxPathBytes) return `is ${bytes} bytes long, more than Linux's limit of ${maxPathBytes}`;
  const long = segments.find((seg) => utf8Bytes(seg) > maxNameBytes);
  if (long !== undefined) return `has a name of ${utf8Bytes(long)} bytes, more than Linux's limit of ${maxNameBytes}`;
  return undefined;
}

export const systemdDir = "/etc/systemd/system";
export const unitFilePath = (unit: string): string => `${systemdDir}/${unit}`;
export const dropInPath = (unit: string, dropIn: string): string => `${systemdDir}/${unit}.d/${dropIn}`;
export const dropInDir = (unit: string): string => `${systemdDir}/${unit}.d`;

// The kernel's own filesystems: a "file" there is a sysctl, a device or a process, never configuration
// an OSC may write (sysctls go through /etc/sysctl.d like every node image does it).
const kernelTrees = ["/proc", "/sys", "/dev"];

// What every apply itself writes: its state (what trellis owns, the plan in progress), the image cache
// and the last applied OSC; and what it removes: gardener-node-agent's record of an unfinished apply. An
// OSC file there would be overwritten (or removed) by the apply that wrote it (and rewritten by the next,
// for ever), or would overwrite trellis's record of what it owns.
const agentTrees = [`${baseDir}/trellis`, paths.lastAppliedOsc, paths.lastComputedOscChanges];

/** Why an OSC file may not be written at `path` (beyond nodePathProblem), or undefined. */
export function writablePathProblem(path: string): string | undefined {
  if (path === "/") return "is the root directory";
  const problem = nodePathProblem(path);
  if (problem) return problem;
  const under = (tree: string) => path === tree || path.startsWith(`${tree}/`);
  const tree = kernelTrees.find(under);
  if (tree) return `is under ${tree}, which belongs to the kernel`;
  const own = agentTrees.find(under);
  return own ? `is ${own === path ? "" : "under "}${own}, which the agent writes itself` : undefined;
}
