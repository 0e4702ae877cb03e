#!/bin/bash
# Boot an isolated systemd "node": systemd as PID 1 in new pid/mount/uts/ipc/cgroup(+net) namespaces,
# root = overlayfs(lower = host / read-only, upper = tmpfs private to the node's mount namespace).
# Adapted from /work/shared/reference/node-harness/boot-node.sh; driven by test/harness/node.ts.
# Usage: boot.sh NAME
#   NODE_NET=private (own netns, lo only; default) | bridge (own netns + veth eth0 10.233.0.X/24 on host
#            bridge trbr0 = 10.233.0.1) | host (share host network: only if the node must reach host 127.0.0.1)
#   NODE_TMPFS="/var/lib/containerd"  extra tmpfs mounts inside the node (overlay-on-overlay breaks rw mounts)
#   NODE_MASK="unit ..."              extra units to mask
#   NODE_TIMEOUT=30                   seconds to wait for `systemctl is-system-running` = running
# Prints the host PID of the node's systemd (PID 1 inside). State in /tmp/trellis-test/nodes/NAME.
set -euo pipefail
NAME=${1:?usage: boot.sh NAME}
[[ $NAME =~ ^[a-z0-9-]{1,20}$ ]] || { echo "bad node name '$NAME' (want [a-z0-9-]{1,20})" >&2; exit 2; }
NODE_NET=${NODE_NET:-private}
NODE_TMPFS=${NODE_TMPFS:-}
NODE_MASK=${NODE_MASK:-}
NODE_TIMEOUT=${NODE_TIMEOUT:-30}
NODES=/tmp/trellis-test/nodes
STATE=$NODES/$NAME
ROOTBASE=$STATE/rootfs
CG=/sys/fs/cgroup/unified/trellis-$NAME
case $NODE_NET in private|bridge|host) ;; *) echo "bad NODE_NET=$NODE_NET" >&2; exit 2;; esac
if [[ -f $STATE/pid ]] && kill -0 "$(cat "$STATE/pid")" 2>/dev/null; then
  echo "node $NAME already running (pid $(cat "$STATE/pid"))" >&2; exit 1
fi
rm -rf "$STATE"; mkdir -p "$STATE" "$ROOTBASE"
: > "$STATE/console.log"
# Dedicated cgroup v2 subtree: becomes the node's cgroup-namespace root, and lets stop.sh prove a PID is ours.
mkdir -p "$CG"
NETFLAG=--net; [[ $NODE_NET == host ]] && NETFLAG=
cat > "$STATE/inner.sh" <<INNER
#!/bin/bash
set -euo pipefail
NAME=$NAME; STATE=$STATE; B=$ROOTBASE; NODE_TMPFS="$NODE_TMPFS"; NODE_MASK="$NODE_MASK"
INNER
cat >> "$STATE/inner.sh" <<'INNER'
# We are PID 1 of a new pid ns, in a new (private-propagation) mount ns. /proc is still the host's,
# so /proc/self/stat gives our *host* pid (systemd keeps it after exec).
read -r HOSTPID _ < /proc/self/stat; echo "$HOSTPID" > "$STATE/pid.tmp"
mount --make-rprivate /
# tmpfs for the writable layer: exists only in this mount namespace, vanishes with it.
mount -t tmpfs -o mode=755,size=2g trellis-node-rw "$B"
mkdir -p "$B/upper" "$B/work" "$B/merged"
mount -t overlay overlay -o "lowerdir=/,upperdir=$B/upper,workdir=$B/work" "$B/merged"
R=$B/merged
# API filesystems
mount -t proc -o nosuid,nodev,noexec proc "$R/proc"
for p in sys sysrq-trigger irq bus fs; do   # read-only like nspawn (protects host sysctls, e.g. core_pattern)
  [[ -e $R/proc/$p ]] || continue
  mount --bind "$R/proc/$p" "$R/proc/$p"; mount -o remount,bind,ro "$R/proc/$p"
done
mount -t sysfs -o ro,nosuid,nodev,noexec sysfs "$R/sys"
mount -t cgroup2 -o nosuid,nodev,noexec cgroup2 "$R/sys/fs/cgroup"   # own cgroupns root, rw
mount -t tmpfs -o mode=755,nosuid,size=16m trellis-node-dev "$R/dev"
for d in null:1:3 zero:1:5 full:1:7 random:1:8 urandom:1:9 tty:5:0; do
  IFS=: read -r n ma mi <<<"$d"; mknod -m 666 "$R/dev/$n" c "$ma" "$mi"
done
mkdir -p "$R/dev/pts" "$R/dev/shm" "$R/dev/mqueue"
mount -t devpts -o newinstance,ptmxmode=0666,mode=620,gid=5 devpts "$R/dev/pts"
ln -s pts/ptmx "$R/dev/ptmx"
mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs "$R/dev/shm"
ln -s /proc/self/fd "$R/dev/fd"; ln -s /proc/self/fd/0 "$R/dev/stdin"
ln -s /proc/self/fd/1 "$R/dev/stdout"; ln -s /proc/self/fd/2 "$R/dev/stderr"
touch "$R/dev/console"; mount --bind "$STATE/console.log" "$R/dev/console"
mount -t tmpfs -o mode=755,nosuid,nodev,size=256m tmpfs "$R/run"
mount -t tmpfs -o mode=1777,nosuid,nodev,size=1g tmpfs "$R/tmp"
for d in $NODE_TMPFS; do mkdir -p "$R$d"; mount -t tmpfs -o mode=711 tmpfs "$R$d"; done
# Node identity + unit masking (all writes land in the tmpfs upper layer)
hostname "$NAME"; echo "$NAME" > "$R/etc/hostname"
tr -d - < /proc/sys/kernel/random/uuid > "$R/etc/machine-id"
for u in getty@tty1.service console-getty.service getty.target postgresql.service e2scrub_reap.service \
         systemd-timesyncd.service apt-daily.timer apt-daily-upgrade.timer dpkg-db-backup.timer \
         e2scrub_all.timer fstrim.timer man-db.timer systemd-pstore.service systemd-networkd.service \
         systemd-resolved.service systemd-firstboot.service remote-fs.target docker-registry.service $NODE_MASK; do
  ln -sf /dev/null "$R/etc/systemd/system/$u"
done
mkdir -p "$R/etc/systemd/system.conf.d"
printf '[Manager]\nShowStatus=no\nDefaultTimeoutStopSec=10s\n' > "$R/etc/systemd/system.conf.d/trellis-test.conf"
# pivot into the overlay and drop the old root
cd "$R"; mkdir -p .oldroot; pivot_root . .oldroot
umount -l /.oldroot; rmdir /.oldroot
cd /
# SAFETY GUARD: never exec systemd unless / is really our overlay with the tmpfs upper in place.
# (systemd on the host's own root would, among other things, let systemd-tmpfiles wipe the host's /tmp.)
[[ $(stat -f -c %T /) == overlayfs ]] && [[ $(findmnt -n -o OPTIONS /) == *"upperdir=$B/upper,"* ]] \
  || { echo "refusing to boot: / is not the node overlay" >&2; exit 1; }
exec env -i container=other PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  setpriv --bounding-set -sys_module,-sys_rawio,-sys_time,-mac_admin,-mac_override,-syslog,-wake_alarm,-block_suspend,-mknod \
  /lib/systemd/systemd --show-status=no </dev/null >/dev/console 2>&1
INNER
chmod +x "$STATE/inner.sh"
# Launch detached (the node outlives this script). The outer bash moves itself into the node cgroup, then unshares.
setsid bash -c "echo \$\$ > $CG/cgroup.procs; exec unshare --mount --pid --fork --uts --ipc --cgroup $NETFLAG --propagation private $STATE/inner.sh" \
  </dev/null >"$STATE/launcher.log" 2>&1 &
echo "$!" > "$STATE/launcher.pid"
for _ in $(seq 1 100); do [[ -s $STATE/pid.tmp ]] && break; sleep 0.02; done
PID=$(cat "$STATE/pid.tmp" 2>/dev/null || true)
[[ -n $PID ]] || { echo "launch failed:" >&2; cat "$STATE/launcher.log" >&2; exit 1; }
echo "$PID" > "$STATE/pid"
if [[ $NODE_NET == bridge ]]; then
  exec 9>"$NODES/.netlock"; flock 9
  if ! ip link show trbr0 >/dev/null 2>&1; then
    ip link add trbr0 type bridge; ip addr add 10.233.0.1/24 dev trbr0; ip link set trbr0 up
  fi
  for IDX in $(seq 10 250); do grep -qx "$IDX" "$NODES"/*/netidx 2>/dev/null || break; done
  echo "$IDX" > "$STATE/netidx"
  ip link add "trv$IDX" type veth peer name eth0 netns "$PID"
  ip link set "trv$IDX" master trbr0 up
  nsenter -t "$PID" -n sh -c "ip addr add 10.233.0.$IDX/24 dev eth0 && ip link set eth0 up"
  echo "10.233.0.$IDX" > "$STATE/ip"
  flock -u 9
fi
# Wait for boot to finish. `degraded` is a failure here: a test node must come up clean.
S=unknown
for _ in $(seq 1 $((NODE_TIMEOUT * 20))); do
  kill -0 "$PID" 2>/dev/null || { echo "node $NAME died during boot:" >&2; cat "$STATE/console.log" "$STATE/launcher.log" >&2; exit 1; }
  S=$(nsenter -t "$PID" -a systemctl is-system-running 2>/dev/null || true)
  case $S in running|degraded) break;; esac
  sleep 0.05
done
if [[ $S != running ]]; then
  echo "node $NAME did not reach 'running' within ${NODE_TIMEOUT}s (state: $S)" >&2
  nsenter -t "$PID" -a systemctl --failed --no-pager --no-legend >&2 || true
  exit 3   # the node is still up: the caller runs stop.sh
fi
echo "$PID"
