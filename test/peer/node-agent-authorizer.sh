#!/usr/bin/env bash
# Builds node-agent-authorizer (node-agent-authorizer/main.go: Gardener's node-agent authorization webhook,
# served over TLS for a test's kube-apiserver) once per source like osc-render.sh, then runs it with the given
# arguments; `node-agent-authorizer.sh --path` only builds and prints the binary's path.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
bin=$(peer_tool node-agent-authorizer)
if [[ ${1-} == --path ]]; then echo "$bin"; exit 0; fi
exec "$bin" "$@"
