#!/usr/bin/env bash
# Installs everything the demo and the tests need on a fresh Debian 12 machine, idempotently:
# Debian packages (containerd, skopeo, docker-registry, ...), Bun at the version package.json pins,
# the project's dependencies from bun.lock, and the cluster binaries (etcd, kube-apiserver,
# kube-controller-manager, kubelet, and the previous minor's kubelet; built once into a cache).
# Needs root (the tests boot systemd nodes in Linux namespaces) and Go (for the cluster binaries).
set -euo pipefail
cd "$(dirname "$0")/.."
say() { printf 'setup: %s\n' "$*" >&2; }

[[ $(uname -s) == Linux ]] || { say "trellis's tests need Linux"; exit 1; }
[[ $(id -u) == 0 ]] || { say "run as root: the tests create namespaces, cgroups and mounts"; exit 1; }

# Debian packages: node runtime (systemd, D-Bus, containerd), image tooling, PKI, networking; perf for
# `bun run bench:trace`. For kubelet in a node (test/harness/kubelet.ts): runc (containerd's runtime),
# the CNI plugins (bridge, host-local, portmap, loopback), iptables (kubelet's own chains, portmap) and a
# static busybox (the pause and web images are made of it); what a worker's machine image has and
# Gardener's OSC uses: logrotate (containerd-logrotate.service) and sudo (gardener-user.service writes
# /etc/sudoers.d/99-gardener-user). A node's lower layer is this host's /, so these are its machine image.
# libfaketime: the clock-jump chaos scenario moves the agent's wall clock only (LD_PRELOAD in its unit).
# qemu-user-static and arm64's C library run dist/trellis-arm64 here (test/e2e/arm64.test.ts, build/image.ts).
pkgs=(systemd dbus containerd skopeo docker-registry openssl iproute2 util-linux curl ca-certificates tar gzip zstd jq bc python3 linux-perf
  runc containernetworking-plugins iptables busybox-static logrotate sudo libfaketime qemu-user-static libc6-arm64-cross)
missing=()
for p in "${pkgs[@]}"; do dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p"); done
if ((${#missing[@]})); then
  say "installing Debian packages: ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# Bun, pinned by package.json's devDependencies (installed from the npm registry).
want=$(sed -n 's/^ *"bun": "\([0-9.]*\)".*/\1/p' package.json)
have=$(bun --version 2>/dev/null || true)
if [[ $have != "$want" ]] || ! bun -e '0' 2>/dev/null; then
  command -v npm >/dev/null || { say "npm is needed to install bun"; exit 1; }
  say "installing bun $want (found: ${have:-none})"
  npm install -g --allow-scripts=bun "bun@$want" >/dev/null 2>&1 || npm install -g "bun@$want" >/dev/null
  hash -r
  [[ $(bun --version) == "$want" ]] || { say "bun $want did not install"; exit 1; }
fi

bun install --frozen-lockfile >/dev/null

command -v go >/dev/null || { say "Go is needed to build the test cluster binaries (etcd, kube-apiserver)"; exit 1; }
test/cluster/build.sh >/dev/null
# The kubelet of the minor version before, for the in-place kubelet minor version update test.
test/cluster/build.sh --prev >/dev/null
# The OSC Gardener renders for a worker pool (test/harness/worker-osc.ts), from the peer's Gardener module.
test/peer/osc-render.sh --path >/dev/null
# gardener-node-agent itself, for the differential test against it (test/e2e/differential-gna.test.ts, bun run parity).
test/peer/build.sh >/dev/null
say "ready"
