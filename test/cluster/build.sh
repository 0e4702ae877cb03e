#!/usr/bin/env bash
# Builds etcd, kube-apiserver, kube-controller-manager and kubelet from the Go module proxy into a versioned
# cache outside the repo, once: later runs find the binaries and return at once.
# The versions are pinned by k8s/go.mod and etcd/go.mod (the only place they are written).
# Prints the cache directory. `build.sh --regen [DIR]` rewrites DIR/go.mod's replace lines for its version
# (DIR: k8s, the default, or k8s-prev).
# `build.sh --prev` builds only the kubelet of k8s-prev/go.mod's version (the minor before the cluster's, for the
# in-place kubelet update test) into a cache of its own, and prints that directory.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
pinned() { awk '$1=="require" && $2=="k8s.io/kubernetes" {print $3}' "$here/$1/go.mod"; }
kube=$(pinned k8s)
etcd=$(awk '$1=="go.etcd.io/etcd/server/v3" || ($1=="require" && $2=="go.etcd.io/etcd/server/v3") {print $NF}' "$here/etcd/go.mod" | head -1)
[[ -n $kube && -n $etcd ]] || { echo "build.sh: cannot read the pinned versions from go.mod" >&2; exit 1; }

if [[ ${1:-} == --regen ]]; then
  dir=${2:-k8s}
  version=$(pinned "$dir")
  [[ -n $version ]] || { echo "build.sh: $dir/go.mod pins no k8s.io/kubernetes version" >&2; exit 1; }
  mod=$(go mod download -json "k8s.io/kubernetes@$version" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
  staging="v0.${version#v1.}"
  { sed '/^replace (/,$d' "$here/$dir/go.mod"; echo "replace ("
    grep -E '^\s*k8s.io/[a-z-]+ v0.0.0$' "$mod" | awk -v v="$staging" '{print "\t"$1" => "$1" "v}'
    echo ")"; } > "$here/$dir/go.mod.new"
  mv "$here/$dir/go.mod.new" "$here/$dir/go.mod"
  (cd "$here/$dir" && go mod tidy)
  exit 0
fi

root=${TRELLIS_CACHE:-$HOME/.cache/trellis}
if [[ ${1:-} == --prev ]]; then
  kube=$(pinned k8s-prev)
  [[ -n $kube ]] || { echo "build.sh: k8s-prev/go.mod pins no k8s.io/kubernetes version" >&2; exit 1; }
  cache=$root/kubelet-$kube
else
  cache=$root/cluster-kube-$kube-etcd-$etcd
fi
mkdir -p "$cache"
# Several test processes may ask at once: one builds, the others wait for it.
exec 9>"$cache/.lock"
flock 9
build() { # dir package output [ldflags]
  local dir=$1 pkg=$2 out=$3 ld=${4:-}
  [[ -x $cache/$out ]] && return 0
  local t0=$SECONDS
  echo "building $out ($pkg) into $cache ..." >&2
  (cd "$here/$dir" && go build -mod=mod -trimpath -ldflags "-s -w $ld" -o "$cache/$out.tmp" "$pkg")
  mv "$cache/$out.tmp" "$cache/$out"
  echo "built $out in $((SECONDS - t0)) s" >&2
}
ver="-X k8s.io/component-base/version.gitVersion=$kube -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$(cut -d. -f2 <<<"$kube")"
if [[ ${1:-} == --prev ]]; then
  build k8s-prev k8s.io/kubernetes/cmd/kubelet kubelet "$ver"
  echo "$cache"
  exit 0
fi
build etcd . etcd
build k8s k8s.io/kubernetes/cmd/kube-apiserver kube-apiserver "$ver"
build k8s k8s.io/kubernetes/cmd/kube-controller-manager kube-controller-manager "$ver"
# kubelet runs inside the test nodes (test/harness/kubelet.ts), and is shipped to them in an image.
build k8s k8s.io/kubernetes/cmd/kubelet kubelet "$ver"
echo "$cache"
