// The files a worker node needs for kubelet, as text: kubelet's unit, KubeletConfiguration and bootstrap
// kubeconfig at the paths Gardener's OSC uses (pkg/component/extensions/operatingsystemconfig/original/
// components/kubelet), containerd's CRI configuration, a registry mirror and a CNI network. Pure, so that
// a test can write them into a node directly (test/harness/kubelet.ts) or put them into an OSC.
import { stringify } from "yaml";
import { kubelet as kubeletCredentials } from "../../src/api/paths.ts";

export const kubeletPaths = {
  ...kubeletCredentials,
  /** Gardener's hyperkube image holds kubelet at /kubelet; the OSC extracts it here (imageRef). */
  binary: "/opt/bin/kubelet",
  config: "/var/lib/kubelet/config/kubelet",
  /** The CA kubelet trusts for client certificates (the API server's, to reach kubelet's own API). */
  clientCa: "/var/lib/kubelet/ca.crt",
  unit: "/etc/systemd/system/kubelet.service",
} as const;

const containerdSocket = "unix:///run/containerd/containerd.sock";
export const cniConfigPath = "/etc/cni/net.d/10-trellis-bridge.conflist";

/** kubelet.service as Gardener writes it (flags of its CLIFlags for containerd), restarting after 1 s. */
export function kubeletUnit(o: { labels?: Record<string, string> } = {}): string {
  const labels = Object.entries(o.labels ?? {}).map(([k, v]) => `${k}=${v}`);
  const flags = [
    `--bootstrap-kubeconfig=${kubeletPaths.bootstrapKubeconfig}`,
    `--config=${kubeletPaths.config}`,
    `--kubeconfig=${kubeletPaths.realKubeconfig}`,
    ...(labels.length > 0 ? [`--node-labels=${labels.join(",")}`] : []),
    `--container-runtime-endpoint=${containerdSocket}`,
    "--runtime-cgroups=/system.slice/containerd.service",
    "--v=2",
  ];
  return `[Unit]
Description=kubelet daemon
After=containerd.service
[Install]
WantedBy=multi-user.target
[Service]
Restart=always
RestartSec=1
ExecStart=${kubeletPaths.binary} \\
    ${flags.join(" \\\n    ")}
`;
}

/**
 * KubeletConfiguration for a harness node. What differs from a cloud VM, and why:
 * - `failCgroupV1: false`: the host runs cgroup v1 (hybrid), which kubelet ≥ 1.35 refuses by default.
 * - `resolvConf: ""`: the node's /etc/resolv.conf is the host's; pods must not get a nameserver the
 *   tests may not talk to (there is no cluster DNS here either).
 * - `cgroupDriver: systemd`, as Gardener configures it, with runc's SystemdCgroup (containerdConfig).
 */
export function kubeletConfiguration(): string {
  return stringify({
    apiVersion: "kubelet.config.k8s.io/v1beta1",
    kind: "KubeletConfiguration",
    cgroupDriver: "systemd",
    failCgroupV1: false,
    resolvConf: "",
    authentication: {
      anonymous: { enabled: false },
      webhook: { enabled: true },
      x509: { clientCAFile: kubeletPaths.clientCa },
    },
    authorization: { mode: "Webhook" },
    rotateCertificates: true,
    // A node booted for a test has little to evict, and its filesystems are tmpfs of a fixed size.
    evictionHard: { "memory.available": "100Mi", "nodefs.available": "1%", "imagefs.available": "1%" },
  });
}

/** kubelet's bootstrap kubeconfig: the bootstrap token, for TLS bootstrapping its client certificate. */
export function bootstrapKubeconfig(o: { server: string; caPem: string; token: string }): string {
  return stringify({
    apiVersion: "v1",
    kind: "Config",
    clusters: [{ name: "default", cluster: { server: o.server, "certificate-authority-data": Buffer.from(o.caPem).toString("base64") } }],
    users: [{ name: "kubelet-bootstrap", user: { token: o.token } }],
    contexts: [{ name: "kubelet-bootstrap@default", context: { cluster: "default", user: "kubelet-bootstrap" } }],
    "current-context": "kubelet-bootstrap@default",
  });
}

/**
 * containerd's configuration (version 2, containerd 1.6/1.7) for the CRI: Debian's own config.toml sets
 * only the CNI directories, and without `default_runtime_name` every sandbox fails ("container.Runtime.Name
 * must be set"). The sandbox (pause) image is a local one: containerd cannot pull from the internet here.
 * `restrict_oom_score_adj`: the test process (hence the node) lacks CAP_SYS_RESOURCE on this machine, so
 * no process may lower its OOM score; unclamped, runc fails to start every sandbox (containerd asks -998
 * for it) with "can't get final child's PID from pipe: EOF". Clamped to containerd's own score, it starts.
 */
export function containerdConfig(o: { sandboxImage: string }): string {
  const cri = 'plugins."io.containerd.grpc.v1.cri"';
  return `version = 2

[${cri}]
  sandbox_image = "${o.sandboxImage}"
  restrict_oom_score_adj = true
[${cri}.containerd]
  default_runtime_name = "runc"
[${cri}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
[${cri}.containerd.runtimes.runc.options]
  SystemdCgroup = true
[${cri}.cni]
  bin_dir = "/usr/lib/cni"
  conf_dir = "/etc/cni/net.d"
[${cri}.registry]
  config_path = "/etc/containerd/certs.d"
[plugins."io.containerd.internal.v1.opt"]
  path = "/var/lib/containerd/opt"
`;
}

/** A containerd hosts.toml sending `upstream`'s pulls to the plain-HTTP registry at `mirror` ("host:port"). */
export function mirrorHostsToml(upstream: string, mirror: string): string {
  return `server = "https://${upstream}"\n\n[host."http://${mirror}"]\n  capabilities = ["pull", "resolve"]\n`;
}

/**
 * The pod network of one node: a Linux bridge (cni0) with host-local addresses from `podSubnet` and
 * portmap for hostPorts; containerd adds loopback itself. In Gardener a network extension (Calico,
 * Cilium) installs the CNI through a DaemonSet; a harness node gets this file from the test instead.
 */
export function cniConflist(podSubnet: string): string {
  return JSON.stringify(
    {
      cniVersion: "0.4.0",
      name: "trellis-pods",
      plugins: [
        {
          type: "bridge",
          bridge: "cni0",
          isGateway: true,
          // No masquerading: pods talk only to their node and each other; nothing leaves the node.
          ipMasq: false,
          hairpinMode: true,
          ipam: { type: "host-local", ranges: [[{ subnet: podSubnet }]], routes: [{ dst: "0.0.0.0/0" }] },
        },
        { type: "portmap", capabilities: { portMappings: true } },
      ],
    },
    null,
    2,
  );
}
