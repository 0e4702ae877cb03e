# Shared by build.sh, osc-render.sh and node-agent-authorizer.sh (sourced): the Gardener release a go.mod pins,
# the ldflags of Gardener's own build, which stamp that version where its binaries read it
# (k8s.io/component-base), and the build of a program of Gardener's code kept beside them.
pinned_gardener() {
  awk '($1=="require" && $2=="github.com/gardener/gardener") || $1=="github.com/gardener/gardener" {print ($1=="require" ? $3 : $2)}' "$1" | head -1
}
gardener_ldflags() {
  echo "-s -w -X k8s.io/component-base/version.gitVersion=$1 -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$(cut -d. -f2 <<<"$1")"
}
# peer_tool NAME: builds test/peer/NAME (main.go, a module of its own with gna's requirements, so that it never
# rewrites gna/go.mod yet shares its downloaded modules and compiled packages) into the peer's versioned cache
# outside the repo, once per source, and prints the binary's path. It refuses to build when NAME/go.mod and
# gna/go.mod pin different Gardener releases.
peer_tool() {
  local name=$1 here version peer cache bin t0
  here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
  version=$(pinned_gardener "$here/$name/go.mod")
  peer=$(pinned_gardener "$here/gna/go.mod")
  [[ -n $version && $version == "$peer" ]] || { echo "$name: $name/go.mod pins gardener '$version', gna/go.mod '$peer': make them agree" >&2; return 1; }
  cache=${TRELLIS_CACHE:-$HOME/.cache/trellis}/peer-gna-$version
  bin=$cache/$name-$(cat "$here/$name/main.go" "$here/$name/go.mod" "$here/$name/go.sum" | sha256sum | cut -c1-12)
  mkdir -p "$cache"
  if [[ ! -x $bin ]]; then
    exec 9>"$cache/.lock-$name"
    flock 9
    if [[ ! -x $bin ]]; then
      t0=$SECONDS
      echo "building $name (gardener $version) into $cache (minutes on 2 cores with a cold Go build cache) ..." >&2
      (cd "$here/$name" && go build -mod=readonly -trimpath -ldflags "$(gardener_ldflags "$version")" -o "$bin.tmp" .) || return 1
      mv "$bin.tmp" "$bin"
      echo "built $name in $((SECONDS - t0)) s" >&2
    fi
    exec 9>&-
  fi
  echo "$bin"
}
