#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# File: bench/route/path_timeline.sh
# Each path's throughput over time while the links change (issue 12, section 4), on the test
# bed (scripts/testbed.sh): 2 hosts x 2 rails of RATE (default 1 Gbit/s), one rank per host with
# one path per rail (CHORUS_NCHANNELS=2, CHORUS_SOCKET_IFNAME=rail), send/receive (or
# --allreduce) of SIZE in a loop (bench/route/path_timeline.cc), rank 0 sampling its paths every
# 20 ms. Once data flows, every PHASE seconds (default 2.5):
#   1. both rails healthy;
#   2. rail 1 shaped down to SLOW (default 200 Mbit/s) on both hosts;
#   3. rail 1 back to RATE;
#   4. iperf3 on rail 1 of host 0 (both directions, full speed): Chorus's share follows what
#      is left (the capacity is not known: no target);
#   5. rail 1 of host 1 down (PHASE + 2 s): host 1's rank sees its interface down and gives
#      the path up, host 0's follows its word (CHORUS_PEER_TIMEOUT_MS, 2 s here, is the bound
#      when nothing tells them), and the path's traffic continues on rail 0 (TCP failover,
#      transports/tcp/README.md); the run goes on, its data checked at the end;
#   6. rail 1 up again (PHASE + 1 s): the ranks reconnect the path in the background (an
#      attempt a second) and route over it again;
# then prints each phase's settled throughput against the links' capacity, the time from each
# change to the first 100 ms at >= 90 % of the new capacity, the longest pause in each phase
# (nothing received between samples), and plots it
# (bench/route/plot_timeline.py, PNG; python3-matplotlib).
#
#   path_timeline.sh [-B BUILD_DIR] [-b SIZE] [--phase S] [--rate RATE] [--slow SLOW]
#                    [--allreduce] [-o OUT_DIR] [--route ADAPTIVE|STATIC]
# Defaults: build/, 64M (bytes, or with M/K), 2.5 s, 1gbit, 200mbit, out: /tmp/chorus-timeline.
# Exit status: 0 done, 1 failure, 77 skipped (needs root).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
# shellcheck source=bench/testbed_lib.sh
. "$root/bench/testbed_lib.sh"
build=build size=64M phase=2.5 rate=1gbit slow=200mbit mode="" out=/tmp/chorus-timeline
route=ADAPTIVE
while [ $# -gt 0 ]; do
  case $1 in
    -B) build=$2; shift 2 ;;
    -b) size=$2; shift 2 ;;
    --phase) phase=$2; shift 2 ;;
    --rate) rate=$2; shift 2 ;;
    --slow) slow=$2; shift 2 ;;
    --allreduce) mode=--allreduce; shift ;;
    --route) route=$2; shift 2 ;;
    -o) out=$2; shift 2 ;;
    -h|--help) awk 'NR >= 3 && !/^#/ {exit} NR >= 3' "$0"; exit 0 ;;
    *) echo "path_timeline.sh: unknown argument '$1' (try --help)" >&2; exit 2 ;;
  esac
done
testbed_require
build=$(cd "$build" && pwd)
tool=$build/bench/path_timeline
run=$build/tools/chorus-run
testbed_require_built path_timeline.sh "chorus-run and path_timeline" "$tool" "$run"
bytes=$(awk -v s="$size" 'BEGIN { n = s + 0; u = toupper(substr(s, length(n "") + 1));
  print n * (u == "G" ? 2^30 : u == "M" ? 2^20 : u == "K" ? 2^10 : 1) }')
mkdir -p "$out"
testbed_start_session tl
full=$(tc_rate_bytes "$rate") low=$(tc_rate_bytes "$slow")
"$testbed" up --hosts 2 --rails 2 --rate "$rate" > "$out/up.log" 2>&1 || { cat "$out/up.log"; exit 1; }
echo "# test bed: 2 hosts x 2 rails, tbf $rate; $route routing; $( [ -n "$mode" ] && echo AllReduce || echo send/receive) of $size; load $(cut -d' ' -f1-3 /proc/loadavg)"
down_s=$(awk -v p="$phase" 'BEGIN { print p + 2 }')
up_s=$(awk -v p="$phase" 'BEGIN { print p + 1 }')
total_s=$(awk -v p="$phase" -v d="$down_s" -v u="$up_s" 'BEGIN { print 4 * p + d + u + 1.5 }')
"$testbed" launch -n 2 --ifname rail --chorus-run "$run" -x CHORUS_NCHANNELS=2 -x CHORUS_ROUTE="$route" \
  -x CHORUS_PEER_TIMEOUT_MS=2000 \
  "$tool" -b "$bytes" -t "$total_s" -i 20 -o "$out/samples.csv" $mode > "$out/run.log" 2>&1 &
job=$!
rx() { "$testbed" run 0 cat /sys/class/net/rail0/statistics/rx_bytes; }
first=$(rx)
for _ in $(seq 1 200); do
  [ $(($(rx) - first)) -gt $((16 << 20)) ] && break
  sleep 0.05
done
events=$out/events.txt
event() { echo "$(date +%s%N) $1 $2" >> "$events"; }
: > "$events"
event $((2 * full)) "both rails $rate"
# Each change is timed as it starts: both hosts' links are shaped at once (each tc call takes
# tens of ms), and the event is written before them.
shape_rail1() {
  event "$1" "$2"
  "$testbed" shape 0 1 "$3" > /dev/null &
  local first=$!
  "$testbed" shape 1 1 "$3" > /dev/null
  wait "$first"
}
sleep "$phase"
shape_rail1 $((full + low)) "rail 1 at $slow" "$slow"
sleep "$phase"
shape_rail1 $((2 * full)) "rail 1 back at $rate" "$rate"
sleep "$phase"
event 0 "iperf3 on rail 1"
"$testbed" traffic 0 1 start > /dev/null 2>&1 || echo "# (no iperf3 traffic: see $out/run.log)"
sleep "$phase"
"$testbed" traffic 0 1 stop > /dev/null 2>&1 || true
event "$full" "rail 1 down"
"$testbed" link 1 1 down > /dev/null
sleep "$down_s"
event $((2 * full)) "rail 1 up again"
"$testbed" link 1 1 up > /dev/null
sleep "$up_s"
status=0
wait "$job" || status=1
cat "$out/run.log"
[ "$status" = 0 ] || { echo "path_timeline.sh: the run failed"; exit 1; }
/usr/bin/python3 "$here/plot_timeline.py" "$out/samples.csv" "$events" "$out/timeline.png"
