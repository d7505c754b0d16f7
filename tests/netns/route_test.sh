#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Congestion-aware chunk routing (CHORUS_ROUTE, transports/chunk.h) on the test bed: 2 hosts x 2
# rails of 1 Gbit/s, rail 1 shaped down to 100 Mbit/s, one rank per host with two paths (one
# per rail: CHORUS_NCHANNELS=2, CHORUS_SOCKET_IFNAME=rail). AllReduce and send/receive of 16 MiB
# must come out right (all_reduce_perf and sendrecv_perf check every element), and with
# ADAPTIVE the slow rail must carry well under half of the bytes (STATIC stripes evenly: about
# half). Generous bounds: this is a test of behaviour, bench/route/route_speed.sh measures.
#   route_test.sh TESTBED_SH CHORUS_RUN ALL_REDUCE_PERF SENDRECV_PERF
# Exit 77 (skipped) without root, iproute2, nsenter or unshare.
set -euo pipefail
tb=$1
export CHORUS_RUN=$2
allreduce=$3
sendrecv=$4
if [ "$(id -u)" != 0 ] || ! command -v ip > /dev/null || ! command -v nsenter > /dev/null ||
  ! command -v unshare > /dev/null; then
  echo "SKIP: the test bed needs root, iproute2 and util-linux (nsenter, unshare)"
  exit 77
fi
inner=$(mktemp)
trap 'rm -f "$inner"' EXIT
cat > "$inner" << 'INNER'
set -euo pipefail
allreduce=$1
sendrecv=$2
"$TESTBED" shape 0 1 100mbit > /dev/null
"$TESTBED" shape 1 1 100mbit > /dev/null
tx() { "$TESTBED" run 0 cat "/sys/class/net/rail$1/statistics/tx_bytes"; }
for route in STATIC ADAPTIVE; do
  for tool in "$allreduce" "$sendrecv"; do
    a0=$(tx 0) a1=$(tx 1)
    out=$("$TESTBED" launch -n 2 --ifname rail -x CHORUS_NCHANNELS=2 -x CHORUS_ROUTE=$route \
      "$tool" -b 16M -e 16M -n 2 -w 1 -c 1 2>&1) || { echo "$out"; exit 1; }
    b0=$(tx 0) b1=$(tx 1)
    row=$(grep -E '^ +[0-9]+ ' <<< "$out")
    # Column 9 (out of place) and 13 (in place): #wrong.
    if ! awk '{ exit !(($9 == 0 || $9 == "N/A") && ($13 == 0 || $13 == "N/A")) }' <<< "$row"; then
      echo "$out"; echo "FAIL: wrong results with CHORUS_ROUTE=$route"; exit 1
    fi
    d0=$((b0 - a0)) d1=$((b1 - a1))
    share=$((100 * d1 / (d0 + d1)))
    echo "$route $(basename "$tool"): rail0 $((d0 >> 20)) MiB, rail1 (100 Mbit/s) $((d1 >> 20)) MiB ($share %)"
    if [ "$route" = ADAPTIVE ] && [ "$share" -ge 35 ]; then
      echo "FAIL: with CHORUS_ROUTE=ADAPTIVE the slow rail carried $share % of the bytes"; exit 1
    fi
    if [ "$route" = STATIC ] && { [ "$share" -lt 40 ] || [ "$share" -gt 60 ]; }; then
      echo "FAIL: with CHORUS_ROUTE=STATIC the slow rail carried $share % of the bytes"; exit 1
    fi
  done
done
INNER
"$tb" exec --hosts 2 --rails 2 --rate 1gbit -- bash "$inner" "$allreduce" "$sendrecv"
echo "route: adaptive routing moved traffic off the slow rail, static striping did not"
