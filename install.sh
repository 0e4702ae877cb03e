#!/bin/sh
# trellis node-init script, carried in a machine's user data (issue 4: it will pull the trellis image
# with containerd's ctr or curl, honour mirror registries, verify the digest, install /opt/bin
# atomically, write the agent's unit and run `trellis bootstrap`).
# Until then it refuses to run rather than half-install a node. Without a bootstrap, a node can be
# configured from a file: install dist/trellis as /opt/bin/gardener-node-agent and run
# `gardener-node-agent apply --osc FILE`, or run the agent with an existing kubeconfig (README).
echo "install.sh: node bootstrap is not implemented yet (planned: issue 4); nothing was changed" >&2
exit 1
