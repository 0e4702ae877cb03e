// The images a kubelet node pulls, built here because containerd cannot pull from the internet: a
// sandbox ("pause") image and a tiny web server, both from Debian's statically linked busybox, and a
// hyperkube image holding the kubelet binary at /kubelet, where Gardener's OSC takes it from (imageRef).
// All are referenced under the unresolvable `upstream` registry name; a containerd mirror serves them.
import { readFileSync, rmSync } from "node:fs";
import { writeLayout, type ImageSpec } from "../../build/oci-layout.ts";
import { upstream } from "./bare-node.ts";
import { binaries, prevKubeletBinaries } from "./cluster.ts";
import { runDir } from "./exec.ts";
import type { Registry } from "./registry.ts";

/** The page the web image serves on port 8080. */
export const webPage = "hello from a pod on a real kubelet\n";
export const webPort = 8080;

export type KubeletImages = {
  /** containerd's sandbox_image. */
  pause: string;
  /** `busybox httpd` serving webPage on webPort; it logs each request ("<client>: response:200") to stderr. */
  web: string;
  /** /kubelet, the cluster's kubelet binary (test/cluster/build.sh). */
  hyperkube: string;
  /** The hyperkube image's one layer, to fetch /kubelet from it without unpacking the image. */
  hyperkubeLayer: string;
};

const busybox = "/usr/bin/busybox"; // Debian's busybox-static (build/setup.sh)
const platform = { os: "linux", architecture: "amd64" };

/** The Kubernetes version the cluster binaries are built at (pinned in test/cluster/k8s/go.mod only). */
export const kubeVersion = (): string => pinnedKubeVersion("k8s");

/**
 * The version of the older kubelet a node starts on for an in-place minor version update (pinned in
 * test/cluster/k8s-prev/go.mod only; test/cluster/build.sh --prev builds it).
 */
export const prevKubeVersion = (): string => pinnedKubeVersion("k8s-prev");

function pinnedKubeVersion(dir: string): string {
  const goMod = readFileSync(new URL(`../cluster/${dir}/go.mod`, import.meta.url), "utf8");
  // `go mod tidy` marks a requirement only a `tool` line uses as indirect.
  const version = /^require k8s\.io\/kubernetes (v\S+)( \/\/ indirect)?$/m.exec(goMod)?.[1];
  if (!version) throw new Error(`test/cluster/${dir}/go.mod does not require k8s.io/kubernetes`);
  return version;
}

/** Builds the images and pushes them to `registry`; returns their references under `upstream`. */
export async function pushKubeletImages(registry: Registry): Promise<KubeletImages> {
  const bin = { content: readFileSync(busybox), mode: 0o755 };
  const dir = runDir("kubelet-images");
  // Both end on SIGTERM as the real ones do (as a pid namespace's init, busybox alone would ignore it):
  // powering a node off then stops its pods at once instead of after systemd's stop timeout.
  const untilTerm = (cmd: string) => ["/bin/busybox", "sh", "-c", `trap 'exit 0' TERM INT; ${cmd} & wait`];
  const pause = await pushImage(registry, dir, "pause", "3.10", { platform, layers: [{ "bin/busybox": bin }], config: { Entrypoint: untilTerm("/bin/busybox sleep infinity") } });
  const web = await pushImage(registry, dir, "e2e/web", "v1", {
    platform,
    layers: [{ "bin/busybox": bin, "www/index.html": webPage }],
    config: { Entrypoint: untilTerm(`/bin/busybox httpd -f -v -p ${webPort} -h /www`) },
  });
  const hyperkube = await pushHyperkube(registry, dir, kubeVersion(), `${await binaries()}/kubelet`);
  return { pause: pause.ref, web: web.ref, ...hyperkube };
}

/** The hyperkube image of the older kubelet (prevKubeVersion), pushed to `registry` as pushKubeletImages pushes the cluster's. */
export async function pushPrevHyperkube(registry: Registry): Promise<Pick<KubeletImages, "hyperkube" | "hyperkubeLayer">> {
  return pushHyperkube(registry, runDir("kubelet-images-prev"), prevKubeVersion(), `${await prevKubeletBinaries()}/kubelet`);
}

async function pushHyperkube(registry: Registry, dir: string, version: string, kubeletPath: string): Promise<Pick<KubeletImages, "hyperkube" | "hyperkubeLayer">> {
  const kubelet = { content: readFileSync(kubeletPath), mode: 0o755 };
  const image = await pushImage(registry, dir, "hyperkube", version, { platform, layers: [{ kubelet }] });
  return { hyperkube: image.ref, hyperkubeLayer: image.layer };
}

/** Writes `spec` as an OCI layout under `dir`, pushes it as repo:tag and returns its reference under `upstream` and its first layer. */
async function pushImage(registry: Registry, dir: string, repo: string, tag: string, spec: ImageSpec): Promise<{ ref: string; layer: string }> {
  const layout = `${dir}/${repo.replace(/\//g, "_")}`;
  // gzip level 1: the kubelet layer is 80 MB, and these images live only as long as the test.
  const written = writeLayout(layout, tag, spec, { level: 1 });
  await registry.push(layout, repo, tag);
  rmSync(layout, { recursive: true }); // the registry has it now; the kubelet layer alone is 34 MB
  const layer = written.images[0]?.layers[0]?.digest;
  if (!layer) throw new Error(`image ${repo}:${tag} was written without a layer`);
  return { ref: `${upstream}/${repo}:${tag}`, layer };
}
