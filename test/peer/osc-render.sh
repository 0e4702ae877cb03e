#!/usr/bin/env bash
# Builds osc-render (osc-render/main.go: the OperatingSystemConfig Gardener renders for a worker pool, see
# osc-render/README.md) from the Go module proxy into the peer's versioned cache outside the repo, once per
# source (lib.sh peer_tool), then runs it with the given arguments. `osc-render.sh --path` only builds and prints
# the binary's path. Built like build.sh builds gardener-node-agent: the Gardener version stamped where Gardener's
# build puts it (k8s.io/component-base), because it names the agent's config file (config-<version>.yaml) and
# tags its image.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
bin=$(peer_tool osc-render)
if [[ ${1-} == --path ]]; then echo "$bin"; exit 0; fi
exec "$bin" "$@"
