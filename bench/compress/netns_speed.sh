#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# File: bench/compress/netns_speed.sh
# FP8-compressed AllReduce against the plain one over a 1 Gbit/s link: two network namespaces
# stand for two hosts, joined by one veth pair shaped with tbf on both ends (this kernel has no
# netem). One rank per host, so every byte of the collective crosses the link over TCP.
#   1. raw TCP through the shaped link (tcp_rate.py): one way, and both ways at once;
#   2. all_reduce_perf, fp32 sum, plain, then compressed (--compress), same sizes, same run;
#   3. a table: size, plain busbw, compressed busbw, their ratio, the wire-byte ratio, against
#      the targets (>= 3x at 4 MiB, >= 3.5x at 64 MiB) and the link's 0.125 GB/s.
#
#   netns_speed.sh [-B BUILD_DIR | --run CHORUS_RUN --perf ALL_REDUCE_PERF]
#                  [-b MIN] [-e MAX] [-f FACTOR] [-n ITERS] [-w WARMUP] [-c CHECK]
#                  [--rate RATE] [--burst BURST] [--latency LAT] [--tcp-bytes N]
#                  [--format e4m3|e5m2] [--block N] [--scale fp32|ue8m0] [--enforce]
#                  [--tcp-only] [--transparent]
# Defaults: build/, 4M..64M (factor 2), -n 10 -w 1 -c 1, tbf rate 1gbit burst 256kb latency
# 50ms, 256 MiB of raw TCP, E4M3 block 128 fp32 scales. --enforce: exit 1 when a target is
# missed (off by default: the ratio depends on how busy the CPUs are). --tcp-only: step 1 alone
# (to choose the tbf settings). --transparent: a third run, the plain tool with
# CHORUS_COMPRESS=FP8_<FORMAT> CHORUS_COMPRESS_POLICY=ALWAYS CHORUS_COMPRESS_BLOCK=<BLOCK>
# CHORUS_COMPRESS_SCALE=<SCALE> (transparent mode; all_reduce_perf checks it against the FP8
# error bound as well).
# Exit status: 0 done (every check passed), 1 failure, 77 skipped (needs root, ip and tc).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
build=build
run=
perf=
min=4M
max=64M
factor=2
iters=10
warmup=1
check=1
rate=1gbit
burst=256kb
latency=50ms
tcp_bytes=$((256 << 20))
format=e4m3
block=128
scale=fp32
enforce=0
tcp_only=0
transparent=0
while [ $# -gt 0 ]; do
  case $1 in
    -B) build=$2; shift 2 ;;
    --run) run=$2; shift 2 ;;
    --perf) perf=$2; shift 2 ;;
    -b) min=$2; shift 2 ;;
    -e) max=$2; shift 2 ;;
    -f) factor=$2; shift 2 ;;
    -n) iters=$2; shift 2 ;;
    -w) warmup=$2; shift 2 ;;
    -c) check=$2; shift 2 ;;
    --rate) rate=$2; shift 2 ;;
    --burst) burst=$2; shift 2 ;;
    --latency) latency=$2; shift 2 ;;
    --tcp-bytes) tcp_bytes=$2; shift 2 ;;
    --format) format=$2; shift 2 ;;
    --block) block=$2; shift 2 ;;
    --scale) scale=$2; shift 2 ;;
    --enforce) enforce=1; shift ;;
    --tcp-only) tcp_only=1; shift ;;
    --transparent) transparent=1; shift ;;
    -h|--help) awk 'NR >= 3 && !/^#/ {exit} NR >= 3' "$0"; exit 0 ;;
    *) echo "netns_speed.sh: unknown argument '$1' (try --help)" >&2; exit 2 ;;
  esac
done

if [ "$(id -u)" != 0 ] || ! command -v ip > /dev/null || ! command -v tc > /dev/null; then
  echo "SKIP: network namespaces and tc need root, iproute2 and tc"
  exit 77
fi
run=${run:-$build/tools/chorus-run}
perf=${perf:-$build/bench/coll/all_reduce_perf}
for f in "$run" "$perf"; do
  if [ ! -x "$f" ]; then
    echo "netns_speed.sh: $f is missing: build the chorus-run and all_reduce_perf targets" >&2
    exit 1
  fi
done
run=$(cd "$(dirname "$run")" && pwd)/$(basename "$run")
perf=$(cd "$(dirname "$perf")" && pwd)/$(basename "$perf")

# Unique names, so that concurrent runs (and tests/netns) do not collide; the addresses live
# only inside these namespaces.
tag=$$
ns0=chorus-fp8s0-$tag
ns1=chorus-fp8s1-$tag
dev0=cf0-$tag
dev1=cf1-$tag
addr0=10.233.0.1
addr1=10.233.0.2
work=$(mktemp -d /tmp/chorus-netns-speed.XXXXXX)
server_pid=
cleanup() {
  if [ -n "$server_pid" ]; then kill "$server_pid" 2> /dev/null || true; fi
  ip netns del "$ns0" 2> /dev/null || true
  ip netns del "$ns1" 2> /dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

ip netns add "$ns0"
ip netns add "$ns1"
ip link add "$dev0" type veth peer name "$dev1"
ip link set "$dev0" netns "$ns0"
ip link set "$dev1" netns "$ns1"
ip -n "$ns0" addr add "$addr0/24" dev "$dev0"
ip -n "$ns1" addr add "$addr1/24" dev "$dev1"
for ns in "$ns0" "$ns1"; do ip -n "$ns" link set lo up; done
ip -n "$ns0" link set "$dev0" up
ip -n "$ns1" link set "$dev1" up
# One token bucket per direction: each end shapes what it sends.
ip netns exec "$ns0" tc qdisc add dev "$dev0" root tbf rate "$rate" burst "$burst" latency "$latency"
ip netns exec "$ns1" tc qdisc add dev "$dev1" root tbf rate "$rate" burst "$burst" latency "$latency"
qdisc=$(ip netns exec "$ns0" tc qdisc show dev "$dev0")
echo "# link: veth $dev0 ($ns0, $addr0) <-> $dev1 ($ns1, $addr1), both ends: $qdisc"
echo "# load average before: $(cut -d' ' -f1-3 /proc/loadavg), $(nproc) CPUs"

# 1. Raw TCP through the shaped link.
port=47311
ip netns exec "$ns1" python3 "$here/tcp_rate.py" serve "$addr1" "$port" > "$work/server.txt" &
server_pid=$!
tcp=$(ip netns exec "$ns0" python3 "$here/tcp_rate.py" run "$addr1" "$port" "$tcp_bytes")
wait "$server_pid" || true
server_pid=
tcp_one=$(awk '$1 == "one_way" {print $2}' <<< "$tcp")
tcp_both=$(awk '$1 == "both_ways" {print $2}' <<< "$tcp")
echo "# raw TCP, $tcp_bytes bytes: one way $tcp_one GB/s, both ways at once $tcp_both GB/s per direction"
if [ "$tcp_only" = 1 ]; then exit 0; fi

# 2. all_reduce_perf, plain then compressed, one rank per host.
common=(-b "$min" -e "$max" -f "$factor" -n "$iters" -w "$warmup" -c "$check" -d float -o sum)
compress=(--compress "$format" --compress-block "$block" --compress-scale "$scale")
status=0
kinds=(plain compressed)
if [ "$transparent" = 1 ]; then kinds+=(transparent); fi
for kind in "${kinds[@]}"; do
  args=("${common[@]}")
  envs=()
  if [ "$kind" = compressed ]; then args+=("${compress[@]}"); fi
  if [ "$kind" = transparent ]; then
    envs=("CHORUS_COMPRESS=FP8_${format^^}" CHORUS_COMPRESS_POLICY=ALWAYS
          "CHORUS_COMPRESS_BLOCK=$block" "CHORUS_COMPRESS_SCALE=${scale^^}")
  fi
  echo "# $kind: ${envs[*]} chorus-run -n 2 --netns $ns0,$ns1 all_reduce_perf ${args[*]}"
  if ! env "${envs[@]}" ip netns exec "$ns0" "$run" -n 2 --timeout 900 --netns "$ns0,$ns1" \
      "$perf" "${args[@]}" > "$work/$kind.txt" 2>&1; then
    status=1
  fi
  sed 's/^/#   /' "$work/$kind.txt"
done
echo "# load average after: $(cut -d' ' -f1-3 /proc/loadavg)"

# 3. The table: out-of-place busbw of each size (in-place in parentheses), from the time column
# (the busbw column has two decimals): 2 ranks, busbw = algbw * 2(n-1)/n = size / time.
wire=$(sed -n 's/^# wire bytes: .*(\([0-9.]*\)%).*/\1/p' "$work/compressed.txt")
files=("$work/plain.txt" "$work/compressed.txt")
if [ "$transparent" = 1 ]; then files+=("$work/transparent.txt"); fi
awk -v wire="${wire:-?}" -v tcp="$tcp_both" -v enforce="$enforce" -v nfiles="${#files[@]}" '
  function mib(b) { return sprintf("%g MiB", b / 1048576) }
  FNR == 1 { file++ }
  /^#/ || NF < 13 { next }
  { size[$1] = 1; oop[file, $1] = $1 / ($6 * 1e3); inp[file, $1] = $1 / ($10 * 1e3)
    if (($9 != "N/A" && $9 != 0) || ($13 != "N/A" && $13 != 0)) bad = 1 }
  END {
    printf "\n%-10s %16s %16s %12s %14s  %-18s%s\n", "size", "plain busbw", "fp8 busbw", "ratio",
           "link use", "target", (nfiles > 2 ? "  transparent busbw, ratio" : "")
    printf "%-10s %16s %16s %12s %14s\n", "", "(GB/s)", "(GB/s)", "(fp8/plain)", "(plain/0.125)"
    n = 0
    for (s in size) sizes[++n] = s + 0
    for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++)
      if (sizes[j] < sizes[i]) { t = sizes[i]; sizes[i] = sizes[j]; sizes[j] = t }
    missed = 0
    for (i = 1; i <= n; i++) {
      s = sizes[i]; p = oop[1, s]; c = oop[2, s]
      r = p > 0 ? c / p : 0
      target = s == 4194304 ? 3.0 : s == 67108864 ? 3.5 : 0
      verdict = target == 0 ? "" : (r >= target ? sprintf(">= %.1fx: met", target) \
                                                 : sprintf(">= %.1fx: MISSED", target))
      if (target > 0 && r < target) missed = 1
      extra = nfiles > 2 ? sprintf("  %7.4f (%.4f) %.2fx", oop[3, s], inp[3, s],
                                   p > 0 ? oop[3, s] / p : 0) : ""
      printf "%-10s %7.4f (%.4f) %7.4f (%.4f) %11.2fx %13.0f%%  %-18s%s\n", mib(s), p, inp[1, s],
             c, inp[2, s], r, 100 * p / 0.125, verdict, extra
    }
    printf "\nwire bytes of the compressed calls: %s%% of fp32 (ideal ratio %.2fx); raw TCP both ways %s GB/s per direction; link 0.125 GB/s\n",
           wire, (wire > 0 ? 100 / wire : 0), tcp
    if (bad) print "WRONG RESULTS in a run (#wrong != 0)"
    exit (bad ? 2 : (missed && enforce ? 3 : 0))
  }' "${files[@]}" || {
  rc=$?
  if [ "$rc" = 2 ]; then status=1; fi
  if [ "$rc" = 3 ]; then echo "target missed (--enforce)"; status=1; fi
}
exit "$status"
