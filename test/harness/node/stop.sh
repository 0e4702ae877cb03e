#!/bin/bash
# Stop a node started by boot.sh: SIGRTMIN+4 (= systemctl poweroff) to its PID 1, wait, SIGKILL as last resort;
# then remove its cgroups, veth, disk (tmpfs) and state. Safe to call for a node that failed to boot or is already gone.
# Only PIDs inside the node's own cgroup are ever signalled.
# Usage: stop.sh NAME [timeout_s]
set -uo pipefail
NAME=${1:?usage: stop.sh NAME [timeout_s]}
[[ $NAME =~ ^[a-z0-9-]{1,20}$ ]] || { echo "bad node name '$NAME'" >&2; exit 2; }
TMO=${2:-20}
NODES=/tmp/trellis-test/nodes
STATE=$NODES/$NAME
CG=/sys/fs/cgroup/unified/trellis-$NAME
PID=$(cat "$STATE/pid" 2>/dev/null || cat "$STATE/pid.tmp" 2>/dev/null || true)
LAUNCHER=$(cat "$STATE/launcher.pid" 2>/dev/null || true)
# The v2 cgroup, and for a kubelet node the one boot.sh made in each v1 hierarchy.
mapfile -t CGS < <(echo "$CG"; cat "$STATE/cgroups" 2>/dev/null)
# Live members of the node's cgroup trees (exited processes, zombies included, are no longer listed).
procs() { find "${CGS[@]}" -name cgroup.procs -exec cat {} + 2>/dev/null | sort -u | tr '\n' ' '; }
is_ours() { [[ -n $1 ]] && [[ " $(procs) " == *" $1 "* ]]; }
if is_ours "$PID"; then
  kill -s $(($(kill -l SIGRTMIN) + 4)) "$PID"
  for _ in $(seq 1 $((TMO * 20))); do kill -0 "$PID" 2>/dev/null || break; sleep 0.05; done
  # SIGKILL of a pid namespace's init kills every process in that namespace.
  if is_ours "$PID"; then echo "poweroff of $NAME timed out, SIGKILL $PID" >&2; kill -9 "$PID"; fi
fi
# The launcher (unshare --fork parent, also in the node cgroup) exits once its child, PID 1, is gone.
for _ in $(seq 1 40); do is_ours "$LAUNCHER" || break; sleep 0.05; done
is_ours "$LAUNCHER" && kill -9 "$LAUNCHER"
left() { for c in "${CGS[@]}"; do [[ -d $c ]] && echo "$c"; done; }
# Processes of a dying pid namespace can linger for a moment; rmdir fails until they are reaped.
for _ in $(seq 1 40); do
  [[ -n $(left) ]] || break
  for c in $(left); do find "$c" -depth -type d -exec rmdir {} + 2>/dev/null; done
  [[ -n $(left) ]] || break; sleep 0.05
done
if [[ -n $(left) ]]; then
  echo "cgroups not removed: $(left | tr '\n' ' '); processes left: $(procs)" >&2
  exit 1
fi
# The veth's node end dies with the netns, taking the host end along; the bridge goes with the last bridged node.
if [[ -f $STATE/netidx ]]; then
  exec 9>"$NODES/.netlock"; flock 9
  ip link del "trv$(cat "$STATE/netidx")" 2>/dev/null
  rm -f "$STATE/netidx"
  ls "$NODES"/*/netidx >/dev/null 2>&1 || ip link del trbr0 2>/dev/null
  flock -u 9
fi
# The mount namespace is gone with the processes; the node's disk (boot.sh mounted it in the host's
# namespace, so that it outlives a reboot) goes now.
ROOTBASE=$STATE/rootfs
if mountpoint -q "$ROOTBASE" 2>/dev/null; then
  umount "$ROOTBASE" 2>/dev/null || umount -l "$ROOTBASE" || { echo "could not unmount $ROOTBASE" >&2; exit 1; }
fi
rm -rf "$STATE"
