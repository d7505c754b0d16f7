# SPDX-License-Identifier: Apache-2.0
# Shared by the tests of label rdma (sourced). They need an RDMA device: without one they exit
# 77 (ctest: skipped), unless CHORUS_RDMA_REQUIRED=1 (the rdma stage sets it in the soft-RoCE
# guest, where a missing device is a failure of the bed, not a reason to skip).

rdma_skip() {  # reason
  if [ "${CHORUS_RDMA_REQUIRED:-0}" = 1 ]; then
    echo "FAIL: $1 (CHORUS_RDMA_REQUIRED=1)"
    exit 1
  fi
  echo "SKIP: $1"
  exit 77
}

# The RDMA devices of this machine (names under /sys/class/infiniband), one a line.
rdma_devices() {
  local d
  for d in /sys/class/infiniband/*; do
    [ -e "$d" ] && echo "${d##*/}"
  done
  return 0
}

rdma_require_device() {
  [ -n "$(rdma_devices)" ] ||
    rdma_skip "no RDMA device (run the rdma tests in the soft-RoCE guest: scripts/test-rdma.sh)"
}

# The device the single-host tests use: $CHORUS_RDMA_DEV, $RXE_DEV (set by scripts/rxe-guest.sh)
# or the first one.
rdma_default_device() {
  if [ -n "${CHORUS_RDMA_DEV:-}" ]; then echo "$CHORUS_RDMA_DEV"
  elif [ -n "${RXE_DEV:-}" ]; then echo "$RXE_DEV"
  else rdma_devices | head -n 1; fi
}

# Index of DEV's RoCE v2 GID that carries an IPv4 address (::ffff:a.b.c.d), waiting up to 10 s
# for the kernel to add it (GIDs appear asynchronously after an address or device is added).
rdma_ipv4_gid() {  # dev
  local p=/sys/class/infiniband/$1/ports/1 i g t
  for _ in $(seq 50); do
    for i in $(seq 0 15); do
      g=$(cat "$p/gids/$i" 2> /dev/null) || continue
      t=$(cat "$p/gid_attrs/types/$i" 2> /dev/null) || continue
      case $g in
        0000:0000:0000:0000:0000:ffff:*) [ "$t" = "RoCE v2" ] && { echo "$i"; return 0; } ;;
      esac
    done
    sleep 0.2
  done
  echo "no RoCE v2 IPv4 GID on $1" >&2
  return 1
}

# A port counter of DEV (sent_pkts, rcvd_pkts ...): rxe keeps them in hw_counters.
rdma_counter() {  # dev name
  local f=/sys/class/infiniband/$1/ports/1/hw_counters/$2
  if [ -r "$f" ]; then cat "$f"; return 0; fi
  rdma statistic show link "$1/1" | tr ' ' '\n' | grep -A1 -x "$2" | tail -n 1
}

# Waits until a TCP port listens (the out-of-band socket of a perftest server).
rdma_wait_listen() {  # port [netns]
  local hex
  hex=$(printf ':%04X' "$1")
  for _ in $(seq 150); do
    if [ -n "${2:-}" ]; then
      ip netns exec "$2" cat /proc/net/tcp /proc/net/tcp6 2> /dev/null | grep -q "$hex 00000000:0000 0A" && return 0
    else
      grep -q "$hex 00000000:0000 0A" /proc/net/tcp /proc/net/tcp6 2> /dev/null && return 0
    fi
    sleep 0.1
  done
  echo "nothing listens on port $1" >&2
  return 1
}

# Packets sent by a netdev given as "netns:name" (netns empty: this namespace).
rdma_link_tx_packets() {  # netns:name
  local ns=${1%%:*} dev=${1#*:}
  if [ -n "$ns" ]; then
    ip netns exec "$ns" cat "/sys/class/net/$dev/statistics/tx_packets"
  else
    cat "/sys/class/net/$dev/statistics/tx_packets"
  fi
}

# Runs "$@" in netns $1 (or here when $1 is empty).
rdma_in_netns() {  # netns command...
  local ns=$1
  shift
  if [ -n "$ns" ]; then ip netns exec "$ns" "$@"; else "$@"; fi
}

# Proof that a run's data went over RDMA. rdma_count_start DEV...: records each device's
# sent_pkts and, under two_hosts.sh, the packets of the link between the hosts
# (CHORUS_RDMA_LINKS). rdma_count_check MIN, after the run: exits 1 unless every device sent
# at least MIN packets since, and the link (if any) at least 1000.
rdma_count_start() {  # dev...
  _rdma_devs=("$@")
  _rdma_before=()
  local d
  for d in "$@"; do _rdma_before+=("$(rdma_counter "$d" sent_pkts)"); done
  _rdma_wire0=
  if [ -n "${CHORUS_RDMA_LINKS:-}" ]; then
    _rdma_wire0=$(rdma_link_tx_packets "${CHORUS_RDMA_LINKS%%,*}")
  fi
}

rdma_count_check() {  # min_packets
  local i after wire1
  for i in "${!_rdma_devs[@]}"; do
    after=$(rdma_counter "${_rdma_devs[$i]}" sent_pkts)
    echo "${_rdma_devs[$i]} sent_pkts: ${_rdma_before[$i]} -> $after"
    if [ $((after - _rdma_before[i])) -lt "$1" ]; then
      echo "FAIL: ${_rdma_devs[$i]} sent fewer than $1 packets: the data did not go over RDMA"
      exit 1
    fi
  done
  if [ -n "$_rdma_wire0" ]; then
    wire1=$(rdma_link_tx_packets "${CHORUS_RDMA_LINKS%%,*}")
    echo "link ${CHORUS_RDMA_LINKS%%,*} tx_packets: $_rdma_wire0 -> $wire1"
    if [ $((wire1 - _rdma_wire0)) -lt 1000 ]; then
      echo "FAIL: no RDMA traffic crossed the link between the hosts"
      exit 1
    fi
  fi
}
