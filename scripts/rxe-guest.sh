#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Runs a command on real soft-RoCE (rdma_rxe): boots Debian's own kernel in a small QEMU guest
# whose root is this machine's root file system (shared read-only over 9p, with a tmpfs overlay
# so the guest can write anywhere), chroots into it in the current directory and runs the
# command as root there. Binaries built here (a build tree, its libchorus) run unchanged.
#
#   scripts/rxe-guest.sh [options] [--] COMMAND [ARGS...]
#     -e NAME=VALUE   set a variable for COMMAND (repeatable); COMMAND otherwise gets a clean
#                     environment: PATH, HOME, LANG and the RXE_* variables below
#     --timeout S     kill the guest after S seconds (default $CHORUS_RXE_TIMEOUT or 900)
#     --tcg | --kvm   accelerator (default: KVM when /dev/kvm works and the CPU has vmx/svm)
#     --net virtio|dummy   netdev of rxe0: the guest's virtio NIC (default) or a dummy device
#
# In the guest: rdma_rxe, ib_uverbs, rdma_ucm, veth and dummy are loaded, rxe0 is bound to the
# netdev, and COMMAND sees RXE_DEV (rxe0), RXE_IF, RXE_IP and RXE_GID_INDEX (its RoCE v2 IPv4
# GID). Exit status: COMMAND's; 124 when the timeout killed the guest; 125 when the guest never
# reported one; 126 when the guest's setup failed (the "@@ GUEST-SETUP-FAILED" line says why).
#
# The kernel (linux-image-amd64's current package) is fetched with `apt-get download` and
# unpacked, never installed, into $CHORUS_RXE_CACHE (default /var/cache/chorus-rxe, or
# ~/.cache/chorus-rxe when that is not writable), with the initramfs built from it; later runs
# reuse both. Needs qemu-system-x86, busybox-static, xz-utils (scripts/install-deps.sh).
# Environment: CHORUS_RXE_CACHE, CHORUS_RXE_TIMEOUT, CHORUS_RXE_MEM (3G), CHORUS_RXE_SMP (2),
# CHORUS_RXE_APPEND (extra kernel arguments), CHORUS_RXE_KERNEL_PKG (a linux-image-* package
# instead of linux-image-amd64's dependency).
#
# Output: every line of the guest's console is prefixed with the seconds since QEMU started;
# "@@ HOST:" and "@@ GUEST-..." lines mark the stages (kernel, boot, rxe ready, exit code).
set -euo pipefail

script_dir=$(cd "$(dirname "$0")" && pwd)
cache=${CHORUS_RXE_CACHE:-/var/cache/chorus-rxe}
if ! mkdir -p "$cache" 2> /dev/null || [ ! -w "$cache" ]; then
  cache=${XDG_CACHE_HOME:-$HOME/.cache}/chorus-rxe
  mkdir -p "$cache"
fi
timeout_s=${CHORUS_RXE_TIMEOUT:-900}
mem=${CHORUS_RXE_MEM:-3G}
smp=${CHORUS_RXE_SMP:-2}
accel=tcg
net=virtio
if [ -w /dev/kvm ] && grep -qwE 'vmx|svm' /proc/cpuinfo; then accel=kvm; fi
guest_env=()
while [ $# -gt 0 ]; do
  case $1 in
    -e) guest_env+=("$2"); shift 2 ;;
    --timeout) timeout_s=$2; shift 2 ;;
    --tcg) accel=tcg; shift ;;
    --kvm) accel=kvm; shift ;;
    --net) net=$2; shift 2 ;;
    --) shift; break ;;
    -*) echo "rxe-guest.sh: unknown option $1" >&2; exit 2 ;;
    *) break ;;
  esac
done
if [ $# -eq 0 ]; then
  sed -n '3,16p' "$0" >&2
  exit 2
fi
case $net in virtio | dummy) ;; *) echo "rxe-guest.sh: --net virtio|dummy" >&2; exit 2 ;; esac
for tool in qemu-system-x86_64 busybox xz; do
  command -v "$tool" > /dev/null ||
    { echo "rxe-guest.sh: $tool is missing (scripts/install-deps.sh installs it)" >&2; exit 2; }
done
if readelf -l "$(command -v busybox)" 2> /dev/null | grep -q 'interpreter'; then
  echo "rxe-guest.sh: busybox is dynamically linked; the guest's init needs busybox-static" >&2
  exit 2
fi
case $PWD in *[[:space:]]*) echo "rxe-guest.sh: the current directory has a space" >&2; exit 2 ;; esac

# ---- 1. Debian's kernel: downloaded and unpacked, never installed -----------------------------
pkg=${CHORUS_RXE_KERNEL_PKG:-}
if [ -z "$pkg" ]; then
  pkg=$(apt-cache depends linux-image-amd64 2> /dev/null |
        awk '/Depends: linux-image-[0-9]/ {print $2; exit}') || true
fi
if [ -z "$pkg" ] && [ "$(id -u)" -eq 0 ]; then   # no package lists yet (fresh machine)
  apt-get update -q > /dev/null
  pkg=$(apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-[0-9]/ {print $2; exit}')
fi
if [ -z "$pkg" ]; then
  # offline: whatever kernel an earlier run cached
  pkg=$(cd "$cache" && ls -d kernel-linux-image-* 2> /dev/null | tail -n 1 | sed 's/^kernel-//') || true
  [ -n "$pkg" ] || { echo "rxe-guest.sh: cannot name the kernel package (apt-cache depends linux-image-amd64)" >&2; exit 2; }
fi
kdir=$cache/kernel-$pkg
if ! ls "$kdir"/boot/vmlinuz-* > /dev/null 2>&1; then
  echo "@@ HOST: downloading $pkg into $cache"
  dl=$(mktemp -d "$cache/download.XXXXXX")
  # apt fetches as its sandbox user _apt when that user may write the directory
  if [ "$(id -u)" -eq 0 ] && id _apt > /dev/null 2>&1; then chown _apt "$dl"; fi
  if ! (cd "$dl" && apt-get download -q "$pkg" > /dev/null); then
    [ "$(id -u)" -eq 0 ] && apt-get update -q > /dev/null
    (cd "$dl" && apt-get download -q "$pkg" > /dev/null)
  fi
  rm -rf "$kdir.tmp"
  dpkg -x "$dl"/"$pkg"_*.deb "$kdir.tmp"
  mv "$kdir.tmp" "$kdir"
  rm -rf "$dl"
fi
vmlinuz=$(ls "$kdir"/boot/vmlinuz-* | head -n 1)
kver=${vmlinuz##*/vmlinuz-}
moddir=$kdir/lib/modules/$kver
# The .deb has no modules.dep (depmod makes it at install time); busybox's depmod can.
[ -s "$moddir/modules.dep" ] || busybox depmod -b "$kdir" "$kver"
# The uncompressed vmlinux boots through PVH (CONFIG_PVH=y): no real-mode setup and no xz
# decompression under TCG, which is slow at both.
kimg=$kdir/vmlinux-$kver
if [ ! -s "$kimg" ]; then
  off=$(LC_ALL=C grep -obUaP '\xfd7zXZ\x00' "$vmlinuz" | head -n 1 | cut -d: -f1)
  tail -c +$((off + 1)) "$vmlinuz" | xz -dc > "$kimg.tmp" 2> /dev/null || true  # trailing data
  mv "$kimg.tmp" "$kimg"
fi
# Not an xz-compressed kernel after all: boot the bzImage as it is.
[ "$(head -c 4 "$kimg" | od -An -tx1 | tr -d ' ')" = 7f454c46 ] || kimg=$vmlinuz

# ---- 2. initramfs: static busybox, the modules in dependency order, the init below ------------
# netns and policy routing are built into Debian's kernel; veth links the guest's "hosts".
want="virtio_pci 9pnet_virtio 9p overlay virtio_net dummy veth crc32_generic crc32-pclmul
      rdma_rxe ib_uverbs rdma_ucm"
IFS= read -r -d '' init_script << 'EOF' || true
#!/bin/busybox sh
/bin/busybox --install -s /bin; export PATH=/bin
mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev
echo "@@ GUEST-FIRST-COMMAND guest-uptime=$(cut -d' ' -f1 /proc/uptime)s"
K=$(uname -r)
fail() { echo "@@ GUEST-SETUP-FAILED: $*"; echo "@@ GUEST-EXIT-CODE 126"; poweroff -f; }
while read -r m; do a=; case $m in */dummy.ko) a=numdummies=0;; esac
  insmod /lib/modules/$K/$m $a || echo "@@ GUEST: insmod $m failed"; done < /etc/modules.load
O="trans=virtio,version=9p2000.L,msize=262144"
mount -t 9p -o $O,ro,cache=loose hostroot /hostro || fail "9p mount of the host root"
mount -t tmpfs -o size=1G tmpfs /rw; mkdir -p /rw/u /rw/w
mount -t overlay -o lowerdir=/hostro,upperdir=/rw/u,workdir=/rw/w ovl /newroot || fail overlay
N=/newroot
mount -t proc proc $N/proc; mount -t sysfs sys $N/sys; mount -t devtmpfs dev $N/dev
mkdir -p $N/dev/pts $N/dev/shm; mount -t devpts devpts $N/dev/pts; mount -t tmpfs shm $N/dev/shm
mount -t tmpfs run $N/run; mkdir -p $N/run/netns $N$rxe_out   # $N/tmp: the overlaid host /tmp
mount -t 9p -o $O out $N$rxe_out || fail "9p mount of the exchange directory"
ip link set lo up
if [ "$rxe_net" = dummy ]; then
  IF=rxenet0; IP=192.168.77.1; ip link add $IF type dummy
else
  IF=; for d in /sys/class/net/*; do [ -e $d/device ] && IF=${d##*/} && break; done  # virtio NIC
  IP=10.0.2.15
fi
[ -n "$IF" ] || fail "no network device for rxe0"
ip addr add $IP/24 dev $IF; ip link set $IF up
chroot $N rdma link add rxe0 type rxe netdev $IF || fail "rdma link add rxe0 netdev $IF"
G=/sys/class/infiniband/rxe0/ports/1; GID=
for t in 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20; do   # the RoCE v2 GID of $IP
  for i in 0 1 2 3 4 5 6 7; do
    case "$(cat $G/gids/$i 2>/dev/null)" in 0000:0000:0000:0000:0000:ffff:*)
      [ "$(cat $G/gid_attrs/types/$i 2>/dev/null)" = "RoCE v2" ] && GID=$i && break 2;; esac
  done; sleep 0.5
done
[ -n "$GID" ] || fail "rxe0 has no RoCE v2 IPv4 GID after 10 s"
echo "@@ GUEST-RXE-READY rxe0 netdev=$IF ip=$IP gid_index=$GID cpus=$(nproc) guest-uptime=$(cut -d' ' -f1 /proc/uptime)s"
RXE_DEV=rxe0 RXE_IF=$IF RXE_IP=$IP RXE_GID_INDEX=$GID chroot $N /bin/bash $rxe_out/.cmd
rc=$?
echo "$rc" > $N$rxe_out/exit-code; sync
echo "@@ GUEST-EXIT-CODE $rc guest-uptime=$(cut -d' ' -f1 /proc/uptime)s"
umount $N$rxe_out; poweroff -f
EOF
stamp=$(printf '%s\n%s\n%s\n' "$kver" "$want" "$init_script" | sha256sum | cut -c1-12)
initrd=$cache/initrd-$kver-$stamp.gz
if [ ! -s "$initrd" ]; then
  declare -A deps pathof done_mod
  order=()
  while IFS= read -r line; do
    k=${line%%:*}; deps[$k]=${line#*:}; n=${k##*/}; pathof[${n%.ko}]=$k
  done < "$moddir/modules.dep"
  add_module() {
    local d
    [ -z "${done_mod[$1]:-}" ] || return 0
    done_mod[$1]=1
    for d in ${deps[$1]}; do add_module "$d"; done
    order+=("$1")
  }
  for m in $want; do
    [ -n "${pathof[$m]:-}" ] || { echo "rxe-guest.sh: module $m not in $pkg" >&2; exit 2; }
    add_module "${pathof[$m]}"
  done
  root=$(mktemp -d "$cache/initramfs.XXXXXX")
  mkdir -p "$root"/{bin,sbin,etc,proc,sys,dev,tmp,hostro,rw,newroot}
  cp "$(command -v busybox)" "$root/bin/busybox"
  for m in "${order[@]}"; do install -D -m644 "$moddir/$m" "$root/lib/modules/$kver/$m"; done
  printf '%s\n' "${order[@]}" > "$root/etc/modules.load"
  printf '%s\n' "$init_script" > "$root/init"
  chmod 755 "$root/init"
  (cd "$root" && find . | busybox cpio -o -H newc 2> /dev/null | gzip -1) > "$initrd.tmp"
  mv "$initrd.tmp" "$initrd"
  rm -rf "$root"
fi

# ---- 3. boot, run, report ----------------------------------------------------------------------
out=$(mktemp -d "${TMPDIR:-/tmp}/chorus-rxe.XXXXXX")
console=$out.console
trap 'rm -rf "$out" "$console"' EXIT
{
  echo 'export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8'
  echo 'export RXE_DEV RXE_IF RXE_IP RXE_GID_INDEX'
  echo 'ulimit -l unlimited 2> /dev/null'
  for e in ${guest_env[@]+"${guest_env[@]}"}; do printf 'export %q\n' "$e"; done
  printf 'cd %q || exit 127\nexec' "$PWD"
  printf ' %q' "$@"
  echo
} > "$out/.cmd"
clock_args=""
if [ "$accel" = kvm ]; then
  cpu=(-enable-kvm -cpu "${CHORUS_RXE_CPU:-host,-arch-capabilities}")
else
  cpu=(-accel tcg -cpu "${CHORUS_RXE_CPU:-max}")
  # Under TCG the guest kernel distrusts the TSC and falls back to the HPET, whose every read
  # is an emulated MMIO access: clock_gettime() becomes a slow syscall (about 8 per message for
  # Chorus, while perftest reads the TSC directly). TCG's TSC follows the host's clock, so it is
  # safe to use. Measured, one boot each: ib_send_lat 8 B 25.7 -> 17.5 us, Chorus's 8-byte
  # sendrecv_perf over verbs 243 -> 128 us (CHORUS_SPIN_US=0).
  clock_args="clocksource=tsc tsc=reliable"
fi
if [ "$net" = virtio ]; then
  nic=(-netdev user,id=n0 -device virtio-net-pci,netdev=n0,romfile=)
else
  nic=(-nic none)
fi
echo "@@ HOST: kernel $kver ($pkg, cache $cache) accel=$accel net=$net mem=$mem smp=$smp" \
  "timeout=${timeout_s}s cmd: $*"
t0=${EPOCHREALTIME/./}
elapsed() {
  local d=$((${EPOCHREALTIME/./} - t0))
  printf '%d.%03d' $((d / 1000000)) $((d % 1000000 / 1000))
}
set +e
timeout "$timeout_s" qemu-system-x86_64 "${cpu[@]}" -m "$mem" -smp "$smp" -nographic -no-reboot \
  -kernel "$kimg" -initrd "$initrd" \
  -append "console=ttyS0 quiet loglevel=3 panic=-1 rxe_net=$net rxe_out=$out $clock_args ${CHORUS_RXE_APPEND:-}" \
  -virtfs local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap \
  -virtfs local,path="$out",mount_tag=out,security_model=none \
  "${nic[@]}" < /dev/null 2>&1 |
  while IFS= read -r line || [ -n "$line" ]; do
    printf '[%8s] %s\n' "$(elapsed)" "${line//$'\r'/}"
  done | tee "$console"
qrc=${PIPESTATUS[0]}
set -e
echo "@@ HOST: qemu exit=$qrc wall=$(elapsed)s"
if [ "$qrc" = 124 ]; then
  echo "rxe-guest.sh: the guest ran past ${timeout_s} s and was killed" >&2
  exit 124
fi
if [ -s "$out/exit-code" ]; then exit "$(cat "$out/exit-code")"; fi
if grep -q '@@ GUEST-SETUP-FAILED' "$console"; then exit 126; fi
echo "rxe-guest.sh: the guest reported no exit code (see the console lines above)" >&2
exit 125
