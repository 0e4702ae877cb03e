#!/usr/bin/env bash
# Builds Gardener's gardener-node-agent (the peer of the side-by-side benchmark, test/bench/compare.ts)
# from the Go module proxy into a versioned cache outside the repo, once; prints the binary's path.
# The version is pinned by gna/go.mod (the only place it is written). Built like Gardener's release:
# -trimpath, stripped, the version stamped where Gardener's build puts it (k8s.io/component-base).
set -euo pipefail
source "$(dirname "$0")/lib.sh"
here=$(cd "$(dirname "$0")/gna" && pwd)
version=$(pinned_gardener "$here/go.mod")
[[ -n $version ]] || { echo "build.sh: cannot read the pinned gardener version from gna/go.mod" >&2; exit 1; }
cache=${TRELLIS_CACHE:-$HOME/.cache/trellis}/peer-gna-$version
bin=$cache/gardener-node-agent
mkdir -p "$cache"
exec 9>"$cache/.lock"
flock 9
if [[ ! -x $bin ]]; then
  t0=$SECONDS
  echo "building gardener-node-agent $version into $cache (several minutes on 2 cores) ..." >&2
  (cd "$here" && go build -mod=mod -trimpath -ldflags "$(gardener_ldflags "$version")" -o "$bin.tmp" github.com/gardener/gardener/cmd/gardener-node-agent)
  mv "$bin.tmp" "$bin"
  echo "built gardener-node-agent in $((SECONDS - t0)) s" >&2
fi
echo "$bin"
