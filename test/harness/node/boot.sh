#!/bin/bash
# Boot an isolated systemd "node": systemd as PID 1 in new pid/mount/uts/ipc/cgroup(+net) namespaces,
# root = overlayfs(lower = host / read-only, upper = tmpfs private to the node's mount namespace).
# Adapted from /work/shared/reference/node-harness/boot-node.sh; driven by test/harness/node.ts.
# Usage: boot.sh NAME
#   NODE_NET=private (own netns, lo only; default) | bridge (own netns + veth eth0 10.233.0.X/24 on host
#            bridge trbr0 = 10.233.0.1) | host (share host network: only if the node must reach host 127.0.0.1)
#   NODE_TMPFS="/var/lib/containerd"  extra tmpfs mounts inside the node (overlay-on-overlay breaks rw mounts)
#   NODE_MASK="unit ..."              extra units to mask
#   NODE_KUBELET=1                    able to run kubelet and pods (needs NODE_NET=bridge): cgroup v1 hierarchies,
#                                     /dev/kmsg, private kubelet sysctls, writable /proc/sys/net, CAP_MKNOD with
#                                     host block devices denied (docs/testing.md, "A real kubelet in a node")
#   NODE_LOOP="/dev/loop7"            loop devices the node may use (bound into its /dev; nothing else of the host's
#                                     block devices is there): a disk for bootstrap.kubeletDataVolumeSize
#   NODE_TIMEOUT=30                   seconds to wait for `systemctl is-system-running` = running
#   NODE_REBOOT=1                     boot NAME's root again after its systemd ended (`systemctl reboot` in the
#                                     node): same upper layer, machine-id and address; /run, /tmp and every
#                                     process start afresh, as on a machine that restarted. Not with NODE_KUBELET
#                                     or NODE_CPU_MAX.
#   NODE_CPU_MAX="50000 100000"       every process of the node under one CFS quota (µs per period µs: half a core),
#                                     in a cgroup of the host's cgroup v1 cpu hierarchy; $STATE/cpu-limit names it
#                                     ("MOUNT PATH": the hierarchy's mount point and the cgroup's path in it)
# Prints the host PID of the node's systemd (PID 1 inside). State in /tmp/trellis-test/nodes/NAME; the node's
# root (upper layer) and its NODE_TMPFS directories live on a tmpfs mounted there in the host's mount namespace,
# so that they outlive the node's systemd (stop.sh unmounts it). $STATE/exit: the launcher's exit status once
# the node's systemd ended (129: SIGHUP, the kernel's mark of a reboot() in a pid namespace; 130: SIGINT, power-off).
set -euo pipefail
NAME=${1:?usage: boot.sh NAME}
[[ $NAME =~ ^[a-z0-9-]{1,20}$ ]] || { echo "bad node name '$NAME' (want [a-z0-9-]{1,20})" >&2; exit 2; }
NODE_NET=${NODE_NET:-private}
NODE_TMPFS=${NODE_TMPFS:-}
NODE_MASK=${NODE_MASK:-}
NODE_KUBELET=${NODE_KUBELET:-}
NODE_LOOP=${NODE_LOOP:-}
for d in $NODE_LOOP; do
  # Only loop devices: a test must never hand a node one of the host's real disks.
  [[ $d =~ ^/dev/loop[0-9]+$ && -b $d ]] || { echo "NODE_LOOP: $d is not a loop device" >&2; exit 2; }
done
[[ -z $NODE_LOOP || -z $NODE_KUBELET ]] || { echo "NODE_LOOP: not with NODE_KUBELET (its devices cgroup denies block devices)" >&2; exit 2; }
NODE_TIMEOUT=${NODE_TIMEOUT:-30}
NODE_REBOOT=${NODE_REBOOT:-}
NODE_CPU_MAX=${NODE_CPU_MAX:-}
[[ -z $NODE_CPU_MAX || $NODE_CPU_MAX =~ ^[0-9]+\ [0-9]+$ ]] || { echo "bad NODE_CPU_MAX '$NODE_CPU_MAX' (want QUOTA_US PERIOD_US)" >&2; exit 2; }
[[ -z $NODE_CPU_MAX || -z $NODE_REBOOT ]] || { echo "NODE_REBOOT: not with NODE_CPU_MAX (its cpu cgroup is not rebuilt)" >&2; exit 2; }
NODES=/tmp/trellis-test/nodes
STATE=$NODES/$NAME
ROOTBASE=$STATE/rootfs
CG=/sys/fs/cgroup/unified/trellis-$NAME
case $NODE_NET in private|bridge|host) ;; *) echo "bad NODE_NET=$NODE_NET" >&2; exit 2;; esac
# kubelet's CNI and sysctl writes act on the node's network namespace: never on the host's.
[[ -z $NODE_KUBELET || $NODE_NET == bridge ]] || { echo "NODE_KUBELET needs NODE_NET=bridge" >&2; exit 2; }
if [[ -f $STATE/pid ]] && kill -0 "$(cat "$STATE/pid")" 2>/dev/null; then
  echo "node $NAME already running (pid $(cat "$STATE/pid"))" >&2; exit 1
fi
if [[ -n $NODE_REBOOT ]]; then
  [[ -z $NODE_KUBELET ]] || { echo "NODE_REBOOT: not with NODE_KUBELET (its cgroup v1 hierarchies are not rebuilt)" >&2; exit 2; }
  mountpoint -q "$ROOTBASE" || { echo "NODE_REBOOT: node $NAME has no root to boot again ($ROOTBASE is not mounted)" >&2; exit 1; }
  [[ -f $STATE/exit ]] || { echo "NODE_REBOOT: node $NAME's launcher has not ended" >&2; exit 1; }
  # The last boot's systemd left its (now empty) cgroups below the node's: the new one starts from none.
  find "$CG" -mindepth 1 -depth -type d -exec rmdir {} + 2>/dev/null || true
  [[ -z $(find "$CG" -mindepth 1 -type d) ]] || { echo "NODE_REBOOT: cgroups of the last boot are still in use: $(cat "$CG/cgroup.procs" | tr '\n' ' ')" >&2; exit 1; }
  rm -f "$STATE/pid" "$STATE/pid.tmp" "$STATE/exit" "$STATE/launcher.pid"
  echo "--- reboot $(date -Is) ---" >> "$STATE/console.log"
else
  # A leftover of a node that was never stopped: its tmpfs first, or rm would fail on the mount point.
  if mountpoint -q "$ROOTBASE" 2>/dev/null; then umount "$ROOTBASE" || umount -l "$ROOTBASE"; fi
  rm -rf "$STATE"; mkdir -p "$STATE" "$ROOTBASE"
  : > "$STATE/console.log"
  # The node's disk: it outlives the node's systemd (a reboot) and the mount namespace it runs in.
  mount -t tmpfs -o mode=755,size=4g trellis-node-rw "$ROOTBASE"
  mkdir -p "$ROOTBASE/upper" "$ROOTBASE/work" "$ROOTBASE/merged" "$ROOTBASE/volumes"
fi
# Dedicated cgroup v2 subtree: becomes the node's cgroup-namespace root, and lets stop.sh prove a PID is ours.
mkdir -p "$CG"
JOIN=$CG/cgroup.procs
# A kubelet node also gets a cgroup of its own in every cgroup v1 hierarchy of the host: on a hybrid host
# the v2 hierarchy offers no cpu/memory/pids controllers, so runc and kubelet need v1 (and systemd then
# boots in hybrid mode). Each is created below this script's own cgroup in that hierarchy, so the node
# stays inside whatever limits apply to the test process. stop.sh removes what $STATE/cgroups lists.
# NODE_CPU_MAX: the quota is set on the node's cgroup in the host's v1 cpu hierarchy, which CFS applies to
# the whole subtree: on a hybrid host the v2 hierarchy has no cpu controller (cpu.max cannot be had), and PID 1
# is not systemd (no `systemd-run --scope -p CPUQuota=`). A kubelet node's systemd makes its sub-cgroups below
# that one; any other node's systemd sees only cgroup2, so what it starts inherits its own v1 cgroup, the limited one.
cpu_limit() {
  echo "${NODE_CPU_MAX#* }" > "$1$2/cpu.cfs_period_us"
  echo "${NODE_CPU_MAX% *}" > "$1$2/cpu.cfs_quota_us"
  echo "$1 $2" > "$STATE/cpu-limit"
}
V1=
if [[ -n $NODE_KUBELET ]]; then
  while read -r target opts; do
    opts=${opts#rw,}
    own=$(awk -F: -v c="$opts" '$1 != 0 && $2 == c { print $3 }' /proc/self/cgroup)
    [[ -n $own ]] || continue
    dir=${target}${own%/}/trellis-$NAME
    mkdir "$dir"; echo "$dir" >> "$STATE/cgroups"
    [[ -z $NODE_CPU_MAX || ,$opts, != *,cpu,* ]] || cpu_limit "$target" "${own%/}/trellis-$NAME"
    case $opts in
      # A new cpuset cgroup has no CPUs or memory nodes, and joining it fails until it has.
      cpuset) cat "$dir/../cpuset.cpus" > "$dir/cpuset.cpus"; cat "$dir/../cpuset.mems" > "$dir/cpuset.mems";;
      # The node keeps CAP_MKNOD (runc creates each container's /dev with it), so reading and writing the
      # host's block devices is denied here (creating nodes stays allowed: runc's default rules grant
      # "b *:* m" to every container), one level above the node's own cgroup: a cgroup can only be
      # granted what its parent has, so nothing inside the node can lift the deny.
      devices) echo 'b *:* rw' > "$dir/devices.deny"; dir=$dir/node; mkdir "$dir";;
    esac
    JOIN="$JOIN $dir/cgroup.procs"
    V1="$V1 ${target##*/}:$opts"
  done < <(findmnt -rn -t cgroup -o TARGET,FS-OPTIONS)
  [[ -n $V1 ]] || { echo "NODE_KUBELET: the host has no cgroup v1 hierarchies" >&2; exit 1; }
elif [[ -n $NODE_CPU_MAX ]]; then
  while read -r target opts; do
    opts=${opts#rw,}
    [[ ,$opts, == *,cpu,* ]] || continue
    own=$(awk -F: -v c="$opts" '$1 != 0 && $2 == c { print $3 }' /proc/self/cgroup)
    dir=${target}${own%/}/trellis-$NAME
    mkdir "$dir"; echo "$dir" >> "$STATE/cgroups"
    cpu_limit "$target" "${own%/}/trellis-$NAME"
    JOIN="$JOIN $dir/cgroup.procs"
  done < <(findmnt -rn -t cgroup -o TARGET,FS-OPTIONS)
fi
[[ -z $NODE_CPU_MAX || -f $STATE/cpu-limit ]] || { echo "NODE_CPU_MAX: the host has no cgroup v1 cpu hierarchy" >&2; exit 1; }
DROPCAPS=-sys_module,-sys_rawio,-sys_time,-mac_admin,-mac_override,-syslog,-wake_alarm,-block_suspend
[[ -n $NODE_KUBELET ]] || DROPCAPS=$DROPCAPS,-mknod
NETFLAG=--net; [[ $NODE_NET == host ]] && NETFLAG=
cat > "$STATE/inner.sh" <<INNER
#!/bin/bash
set -euo pipefail
NAME=$NAME; STATE=$STATE; B=$ROOTBASE; NODE_TMPFS="$NODE_TMPFS"; NODE_MASK="$NODE_MASK"; NODE_LOOP="$NODE_LOOP"
NODE_KUBELET="$NODE_KUBELET"; V1="$V1"; DROPCAPS="$DROPCAPS"; NODE_REBOOT="$NODE_REBOOT"
INNER
cat >> "$STATE/inner.sh" <<'INNER'
# We are PID 1 of a new pid ns, in a new (private-propagation) mount ns. /proc is still the host's,
# so /proc/self/stat gives our *host* pid (systemd keeps it after exec).
read -r HOSTPID _ < /proc/self/stat; echo "$HOSTPID" > "$STATE/pid.tmp"
mount --make-rprivate /
# The writable layer is on the tmpfs boot.sh mounted in the host's namespace: it survives a reboot.
mount -t overlay overlay -o "lowerdir=/,upperdir=$B/upper,workdir=$B/work" "$B/merged"
R=$B/merged
# API filesystems
mount -t proc -o nosuid,nodev,noexec proc "$R/proc"
for p in sys sysrq-trigger irq bus fs; do   # read-only like nspawn (protects host sysctls, e.g. core_pattern)
  [[ -e $R/proc/$p ]] || continue
  mount --bind "$R/proc/$p" "$R/proc/$p"; mount -o remount,bind,ro "$R/proc/$p"
done
if [[ -n $NODE_KUBELET ]]; then
  # kubelet writes these at start; they are global to the host, so the node gets private copies.
  mkdir "$B/sysctl"
  for s in vm/overcommit_memory vm/panic_on_oom kernel/panic kernel/panic_on_oops kernel/keys/root_maxkeys kernel/keys/root_maxbytes; do
    [[ -e $R/proc/sys/$s ]] || continue
    cat "$R/proc/sys/$s" > "$B/sysctl/${s//\//.}"; mount --bind "$B/sysctl/${s//\//.}" "$R/proc/sys/$s"
  done
  # /proc/sys/net is per network namespace (the node's own): the CNI plugins enable forwarding there.
  mount --bind "$R/proc/sys/net" "$R/proc/sys/net"; mount -o remount,bind,rw "$R/proc/sys/net"
fi
mount -t sysfs -o ro,nosuid,nodev,noexec sysfs "$R/sys"
if [[ -n $NODE_KUBELET ]]; then
  # Hybrid layout, as on the host: one mount per v1 hierarchy (each rooted at the node's cgroup by the
  # cgroup namespace) and cgroup2 at unified/; systemd finds it mounted and boots in hybrid mode.
  mount -t tmpfs -o mode=755,nosuid,nodev,noexec,size=1m trellis-node-cgroup "$R/sys/fs/cgroup"
  for h in $V1; do
    mkdir "$R/sys/fs/cgroup/${h%%:*}"; mount -t cgroup -o "nosuid,nodev,noexec,${h#*:}" cgroup "$R/sys/fs/cgroup/${h%%:*}"
  done
  mkdir "$R/sys/fs/cgroup/unified"; mount -t cgroup2 -o nosuid,nodev,noexec cgroup2 "$R/sys/fs/cgroup/unified"
else
  mount -t cgroup2 -o nosuid,nodev,noexec cgroup2 "$R/sys/fs/cgroup"   # own cgroupns root, rw
fi
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
for d in $NODE_LOOP; do : > "$R$d"; mount --bind "$d" "$R$d"; done
touch "$R/dev/console"; mount --bind "$STATE/console.log" "$R/dev/console"
# kubelet's OOM watcher opens /dev/kmsg; a node has no kernel log of its own (kind links it the same way).
[[ -z $NODE_KUBELET ]] || ln -s /dev/console "$R/dev/kmsg"
mount -t tmpfs -o mode=755,nosuid,nodev,size=256m tmpfs "$R/run"
mount -t tmpfs -o mode=1777,nosuid,nodev,size=1g tmpfs "$R/tmp"
# Not in the overlay (overlay on overlay breaks rw mounts), on the node's disk: kept across a reboot.
for d in $NODE_TMPFS; do
  v=$B/volumes/${d//\//_}; mkdir -p "$v" "$R$d"; chmod 711 "$v"; mount --bind "$v" "$R$d"
done
# Node identity + unit masking (all writes land in the tmpfs upper layer)
hostname "$NAME"; echo "$NAME" > "$R/etc/hostname"
# A machine keeps its id across reboots.
[[ -n $NODE_REBOOT ]] || tr -d - < /proc/sys/kernel/random/uuid > "$R/etc/machine-id"
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
  setpriv --bounding-set "$DROPCAPS" \
  /lib/systemd/systemd --show-status=no </dev/null >/dev/console 2>&1
INNER
chmod +x "$STATE/inner.sh"
# Launch detached (the node outlives this script). The outer bash moves itself into the node cgroup, then
# unshares, and records how the node's systemd ended: unshare dies of the signal its child died of.
setsid bash -c "for p in $JOIN; do echo \$\$ > \$p; done; unshare --mount --pid --fork --uts --ipc --cgroup $NETFLAG --propagation private $STATE/inner.sh; echo \$? > $STATE/exit" \
  </dev/null >>"$STATE/launcher.log" 2>&1 &
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
  if [[ -n $NODE_REBOOT && -f $STATE/netidx ]]; then IDX=$(cat "$STATE/netidx")   # the same address again
  else
    for IDX in $(seq 10 250); do grep -qx "$IDX" "$NODES"/*/netidx 2>/dev/null || break; done
    echo "$IDX" > "$STATE/netidx"
  fi
  ip link add "trv$IDX" type veth peer name eth0 netns "$PID"
  ip link set "trv$IDX" master trbr0 up
  nsenter -t "$PID" -n sh -c "ip addr add 10.233.0.$IDX/24 dev eth0 && ip link set eth0 up"
  echo "10.233.0.$IDX" > "$STATE/ip"
  flock -u 9
  # kubelet finds its node's address by resolving the hostname, as a machine whose /etc/hosts names itself.
  [[ -z $NODE_KUBELET ]] || nsenter -t "$PID" -m sh -c "echo '10.233.0.$IDX $NAME' >> /etc/hosts"
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
