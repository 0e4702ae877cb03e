#!/usr/bin/env bash
# Builds osc-render (osc-render/main.go: the OperatingSystemConfig Gardener renders for a worker pool, see
# osc-render/README.md) from the Go module proxy into the peer's versioned cache outside the repo, once per
# source, then runs it with the given arguments. `osc-render.sh --path` only builds and prints the binary's path.
# Built like build.sh builds gardener-node-agent: the Gardener version stamped where Gardener's build puts it
# (k8s.io/component-base), because it names the agent's config file (config-<version>.yaml) and tags its image.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/lib.sh"
version=$(pinned_gardener "$here/osc-render/go.mod")
peer=$(pinned_gardener "$here/gna/go.mod")
[[ -n $version && $version == "$peer" ]] || { echo "osc-render.sh: osc-render/go.mod pins gardener '$version', gna/go.mod '$peer': make them agree" >&2; exit 1; }
cache=${TRELLIS_CACHE:-$HOME/.cache/trellis}/peer-gna-$version
bin=$cache/osc-render-$(cat "$here/osc-render/main.go" "$here/osc-render/go.mod" "$here/osc-render/go.sum" | sha256sum | cut -c1-12)
mkdir -p "$cache"
if [[ ! -x $bin ]]; then
  exec 9>"$cache/.lock-osc-render"
  flock 9
  if [[ ! -x $bin ]]; then
    t0=$SECONDS
    echo "building osc-render (gardener $version) into $cache (minutes on 2 cores with a cold Go build cache) ..." >&2
    (cd "$here/osc-render" && go build -mod=readonly -trimpath -ldflags "$(gardener_ldflags "$version")" -o "$bin.tmp" .)
    mv "$bin.tmp" "$bin"
    echo "built osc-render in $((SECONDS - t0)) s" >&2
  fi
  exec 9>&-
fi
if [[ ${1-} == --path ]]; then echo "$bin"; exit 0; fi
exec "$bin" "$@"
