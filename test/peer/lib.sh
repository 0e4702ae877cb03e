# Shared by build.sh and osc-render.sh (sourced): the Gardener release a go.mod pins, and the ldflags of
# Gardener's own build, which stamp that version where its binaries read it (k8s.io/component-base).
pinned_gardener() {
  awk '($1=="require" && $2=="github.com/gardener/gardener") || $1=="github.com/gardener/gardener" {print ($1=="require" ? $3 : $2)}' "$1" | head -1
}
gardener_ldflags() {
  echo "-s -w -X k8s.io/component-base/version.gitVersion=$1 -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$(cut -d. -f2 <<<"$1")"
}
