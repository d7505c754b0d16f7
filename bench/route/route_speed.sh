#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# File: bench/route/route_speed.sh
# Congestion-aware chunk routing against static striping (CHORUS_ROUTE, transports/chunk.h) on
# the multi-host test bed (scripts/testbed.sh): 2 hosts x 2 rails of RATE (default 1 Gbit/s),
# one rank per host with one path per rail (CHORUS_NCHANNELS=2, CHORUS_SOCKET_IFNAME=rail), in
# one run:
#   1. raw TCP on each rail (bench/compress/tcp_rate.py, one way): what each link gives;
#   2. sendrecv_perf and all_reduce_perf (fp32) with STATIC and ADAPTIVE, both rails healthy,
#      then rail 1 shaped down to SLOW (default 200 Mbit/s) on both hosts;
#   3. a table: algbw, the fraction of the links' aggregate it reaches, the bytes each rail
#      carried, against the targets (healthy: >= 90 % of the aggregate; rail 1 slow: >= 90 % of
#      the remaining RATE + SLOW, where static striping falls to about 2 x SLOW).
#
#   route_speed.sh [-B BUILD_DIR] [-b SIZE] [-n ITERS] [--rate RATE] [--slow SLOW] [--enforce]
# Defaults: build/, 64M, -n 5, 1gbit, 200mbit. Exit status: 0 done, 1 failure (or a missed target
# with --enforce), 77 skipped (needs root).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
# shellcheck source=bench/testbed_lib.sh
. "$root/bench/testbed_lib.sh"
build=build
size=64M
iters=5
rate=1gbit
slow=200mbit
enforce=0
while [ $# -gt 0 ]; do
  case $1 in
    -B) build=$2; shift 2 ;;
    -b) size=$2; shift 2 ;;
    -n) iters=$2; shift 2 ;;
    --rate) rate=$2; shift 2 ;;
    --slow) slow=$2; shift 2 ;;
    --enforce) enforce=1; shift ;;
    -h|--help) awk 'NR >= 3 && !/^#/ {exit} NR >= 3' "$0"; exit 0 ;;
    *) echo "route_speed.sh: unknown argument '$1' (try --help)" >&2; exit 2 ;;
  esac
done
testbed_require
build=$(cd "$build" && pwd)
run=$build/tools/chorus-run
testbed_require_built route_speed.sh "chorus-run and the perf tools" "$run" \
  "$build/bench/coll/sendrecv_perf" "$build/bench/coll/all_reduce_perf"
testbed_start_session rs
work=$(mktemp -d /tmp/chorus-route-speed.XXXXXX)
# shellcheck disable=SC2317  # called on exit by testbed_end_session
bench_cleanup() { rm -rf "$work"; }
gbps() {  # tc rate -> GB/s
  awk -v b="$(tc_rate_bytes "$1")" 'BEGIN { printf "%.6f", b / 1e9 }'
}
"$testbed" up --hosts 2 --rails 2 --rate "$rate" > "$work/up.log" 2>&1 || { cat "$work/up.log"; exit 1; }
echo "# test bed: 2 hosts x 2 rails, every link tbf $rate both ways; load $(cut -d' ' -f1-3 /proc/loadavg)"

tcp_rate() {  # rail -> one-way GB/s host 0 -> host 1
  local port=$((47500 + $1)) addr=10.$((240 + $1)).0.2 out
  "$testbed" run 1 python3 "$root/bench/compress/tcp_rate.py" serve "$addr" "$port" > /dev/null 2>&1 &
  local pid=$!
  sleep 0.5
  out=$("$testbed" run 0 python3 "$root/bench/compress/tcp_rate.py" run "$addr" "$port" $((64 << 20)))
  wait "$pid" || true
  awk '$1 == "one_way" {print $2}' <<< "$out"
}
tx() { "$testbed" run 0 cat "/sys/class/net/rail$1/statistics/tx_bytes"; }
results=$work/results.txt
: > "$results"
status=0
measure() {  # condition
  local cond=$1 tool route out a0 a1 b0 b1 row
  for tool in sendrecv all_reduce; do
    for route in STATIC ADAPTIVE; do
      a0=$(tx 0) a1=$(tx 1)
      if ! out=$("$testbed" launch -n 2 --ifname rail --chorus-run "$run" -x CHORUS_NCHANNELS=2 \
          -x CHORUS_ROUTE=$route "$build/bench/coll/${tool}_perf" -b "$size" -e "$size" \
          -n "$iters" -w 1 -c 1 2>&1); then
        echo "$out"; status=1; continue
      fi
      b0=$(tx 0) b1=$(tx 1)
      row=$(grep -E '^ +[0-9]+ ' <<< "$out" | head -n 1)
      echo "# $cond $tool $route: $row"
      echo "$cond $tool $route $row $((b0 - a0)) $((b1 - a1))" >> "$results"
    done
  done
}
tcp0=$(tcp_rate 0) tcp1=$(tcp_rate 1)
echo "# raw TCP one way: rail0 $tcp0 GB/s, rail1 $tcp1 GB/s"
measure healthy
"$testbed" shape 0 1 "$slow" > /dev/null
"$testbed" shape 1 1 "$slow" > /dev/null
tcp1_slow=$(tcp_rate 1)
echo "# rail 1 shaped to $slow: raw TCP one way $tcp1_slow GB/s"
measure slow
echo "# load after: $(cut -d' ' -f1-3 /proc/loadavg)"

awk -v full="$(gbps "$rate")" -v slow="$(gbps "$slow")" -v enforce="$enforce" -v size="$size" '
  { cond = $1; tool = $2; route = $3
    # $4 size ... $9 time(us) of out of place; #wrong columns $12 and $16; rail bytes last two.
    t = $9; a = $4 / (t * 1e3); wrong = ($12 != 0 && $12 != "N/A") || ($16 != 0 && $16 != "N/A")
    r0 = $(NF - 1); r1 = $NF
    limit = cond == "healthy" ? 2 * full : full + slow
    printf "%-8s %-11s %-9s algbw %.4f GB/s = %5.1f%% of %.3f GB/s; rail1 carried %4.1f%%%s\n",
           cond, tool, route, a, 100 * a / limit, limit, 100 * r1 / (r0 + r1), wrong ? "  WRONG RESULTS" : ""
    if (wrong) bad = 1
    if (route == "ADAPTIVE" && tool == "sendrecv" && a < 0.9 * limit) missed = 1
  }
  END { print (missed ? "target (ADAPTIVE send/receive >= 90% of the links): MISSED" : "target (ADAPTIVE send/receive >= 90% of the links): met")
        exit bad ? 2 : (missed && enforce ? 3 : 0) }' "$results" || {
  rc=$?
  if [ "$rc" = 2 ]; then status=1; fi
  if [ "$rc" = 3 ]; then echo "target missed (--enforce)"; status=1; fi
}
exit "$status"
