#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# chorus-info --fabric against what the machine has: every RDMA device of /sys/class/infiniband
# listed with its ports and, for each RoCE v2 GID the kernel shows in sysfs, that GID's index,
# type and address; without devices, the one "none" line. UCX's section is there either way.
#   chorus_info_test.sh CHORUS_INFO [--require-device]
# --require-device: exit 77 (skip) without an RDMA device (the rdma label's variant).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=rdma_lib.sh
. "$here/rdma_lib.sh"
info=$1
require=0
if [ "${2:-}" = --require-device ]; then require=1; rdma_require_device; fi
out=$("$info" --fabric)
echo "$out"
fail() { echo "FAIL: $*"; exit 1; }
grep -q '^UCX transports' <<< "$out" || fail "no UCX section"
devices=$(rdma_devices)
if [ -z "$devices" ]; then
  grep -qE '^RDMA devices( \(libibverbs\))?: (none|not in this build)' <<< "$out" ||
    fail "no device here, and no line saying so"
  exit 0
fi
roce_v2=0
for d in $devices; do
  grep -qE "^  $d \(" <<< "$out" || fail "device $d is not listed"
  p=/sys/class/infiniband/$d/ports/1
  grep -qE "^    port 1: " <<< "$out" || fail "no port 1 line"
  for i in $(seq 0 15); do
    t=$(cat "$p/gid_attrs/types/$i" 2> /dev/null) || continue
    g=$(cat "$p/gids/$i" 2> /dev/null) || continue
    [ "$t" = "RoCE v2" ] || continue
    case $g in 0000:0000:0000:0000:0000:0000:0000:0000) continue ;; esac
    case $g in
      0000:0000:0000:0000:0000:ffff:*)  # IPv4-mapped: ::ffff:a.b.c.d
        h=${g#0000:0000:0000:0000:0000:ffff:}
        a=$((16#${h%%:*})) b=$((16#${h##*:}))
        addr="::ffff:$((a >> 8)).$((a & 255)).$((b >> 8)).$((b & 255))" ;;
      *) addr=$(python3 -c "import ipaddress,sys; print(ipaddress.IPv6Address(sys.argv[1]))" "$g") ;;
    esac
    grep -qF "port 1 GID[$i] RoCE v2 $addr" <<< "$out" ||
      fail "$d GID[$i] (RoCE v2, $addr) is not listed as such"
    echo "ok: $d GID[$i] RoCE v2 $addr"
    roce_v2=$((roce_v2 + 1))
  done
done
# The soft-RoCE guest's rxe0 has an IPv4 address: at least its RoCE v2 GID must be there.
if [ "$require" = 1 ] && [ "$roce_v2" = 0 ]; then fail "no RoCE v2 GID listed"; fi
