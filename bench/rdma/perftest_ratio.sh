#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Chorus's verbs transport against perftest on the same device, in one run: ib_write_bw (RDMA
# WRITE bandwidth, one way and both ways with -b) and ib_send_lat (SEND latency) between two
# processes, then Chorus over verbs (CHORUS_TRANSPORT=VERBS, 2 ranks via chorus-run, registered
# buffers: -R 1), and the ratios.
#   Bandwidth, target >= 0.8 from 1 MiB on: Chorus's send/receive bandwidth measured as
#   ib_write_bw measures (bench/rdma/sendrecv_lat -m bw: a stream of windows of 8 messages one
#   way, osu_bw's method) over ib_write_bw's, the verdict; both ways at once (-m bibw) over
#   ib_write_bw -b's; and nccl-tests' sendrecv_perf (each rank sends to the other and receives
#   at once, one message per step) over half of ib_write_bw -b's.
#   Latency, target <= 2: the one-way 8-byte latency of a ping-pong of ncclSend/ncclRecv
#   (sendrecv_lat, round trip / 2: ib_send_lat's own method, the verdict) over ib_send_lat's
#   (means, medians beside), and sendrecv_perf's 8-byte time per step beside it.
# Run it where an RDMA device exists, e.g. in the soft-RoCE guest:
#   scripts/rxe-guest.sh --timeout 900 -- bench/rdma/perftest_ratio.sh build
# Argument: the build directory (default build). Environment: RATIO_SIZES (default "1M 4M";
# soft-RoCE under TCG moves some 20-50 MB/s), RATIO_ITERS (bandwidth iterations, default 50;
# sendrecv_lat: windows of 8 messages, an eighth of it), RATIO_LAT_ITERS (default 2000).
# Bandwidths are in bytes per second (perftest's MB/sec are 2^20 bytes, nccl-tests' GB 10^9).
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build}
here=$PWD/tests/rdma
# shellcheck source=tests/rdma/rdma_lib.sh
. "$here/rdma_lib.sh"
rdma_require_device
for tool in ib_write_bw ib_send_lat; do
  command -v "$tool" > /dev/null || { echo "perftest_ratio: $tool is missing (perftest)"; exit 1; }
done
run=$build/tools/chorus-run
perf=$build/bench/coll/sendrecv_perf
lat=$build/bench/sendrecv_lat
for f in "$run" "$perf" "$lat"; do
  [ -x "$f" ] || { echo "perftest_ratio: $f is not built"; exit 1; }
done
dev=$(rdma_default_device)
gid=$(rdma_ipv4_gid "$dev")
sizes=${RATIO_SIZES:-1M 4M}
iters=${RATIO_ITERS:-50}
lat_iters=${RATIO_LAT_ITERS:-2000}
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
port=$((20000 + $$ % 10000))

bytes_of() {  # 1M -> 1048576
  local v=${1%[KMG]} u=${1: -1}
  case $u in K) echo $((v << 10)) ;; M) echo $((v << 20)) ;; G) echo $((v << 30)) ;; *) echo "$1" ;; esac
}

# perftest NAME ARGS...: server and client of one perftest tool on $dev; the client's output
# in $logs/NAME.
perftest() {
  local name=$1 tool=$2
  shift 2
  timeout 300 "$tool" -d "$dev" -x "$gid" -p "$port" "$@" > "$logs/$name.srv" 2>&1 &
  local sp=$!
  rdma_wait_listen "$port" || true
  timeout 300 "$tool" -d "$dev" -x "$gid" -p "$port" "$@" 127.0.0.1 > "$logs/$name" 2>&1 ||
    { cat "$logs/$name" "$logs/$name.srv"; echo "perftest_ratio: $tool $* failed"; exit 1; }
  wait "$sp" || true
  port=$((port + 1))
}

# The average bandwidth (bytes/s) of a perftest bandwidth line for `bytes`: columns #bytes,
# #iterations, BW peak, BW average [MB/sec = 2^20 bytes], MsgRate.
perftest_bw() {  # log bytes
  awk -v b="$2" '$1 == b && NF >= 4 { printf "%.0f", $4 * 1048576; found = 1 } END { exit !found }' "$1"
}

# sendrecv_perf's out-of-place time (us) for `bytes` (nccl-tests table: size count type redop
# root time algbw busbw #wrong ...). The bandwidth is computed from the time: the printed algbw
# has two decimals, too few for soft-RoCE.
chorus_col() {  # log bytes column(6 time, 7 algbw)
  awk -v b="$2" -v c="$3" '$1 == b && NF >= 9 { print $c; found = 1; exit } END { exit !found }' "$1"
}

echo "device $dev, GID $gid; sizes $sizes; $iters iterations"
echo "== perftest"
lat_bytes=8
perftest lat ib_send_lat -s "$lat_bytes" -n "$lat_iters" -F
# Result line: #bytes #iterations t_min t_max t_typical t_avg ... (usec). t_typical is the
# median; Chorus's tools report the mean (nccl-tests' method), so the verdict compares means and
# the median ratio is printed beside it.
perf_lat=$(awk -v b="$lat_bytes" '$1 == b && NF >= 6 { print $6; found = 1 } END { exit !found }' "$logs/lat")
perf_lat_typ=$(awk -v b="$lat_bytes" '$1 == b && NF >= 5 { print $5; found = 1 } END { exit !found }' "$logs/lat")
echo "ib_send_lat $lat_bytes B: t_avg $perf_lat us, t_typical $perf_lat_typ us"
declare -A wbw bwbw
for s in $sizes; do
  b=$(bytes_of "$s")
  perftest "bw$b" ib_write_bw -s "$b" -n "$iters" -F
  perftest "bibw$b" ib_write_bw -s "$b" -n "$iters" -F -b
  wbw[$b]=$(perftest_bw "$logs/bw$b" "$b")
  bwbw[$b]=$(perftest_bw "$logs/bibw$b" "$b")
  echo "ib_write_bw $b B: $(awk -v x="${wbw[$b]}" 'BEGIN { printf "%.3f", x / 1e9 }') GB/s one way, $(awk -v x="${bwbw[$b]}" 'BEGIN { printf "%.3f", x / 1e9 }') GB/s both ways (-b, sum)"
done

echo "== chorus sendrecv_lat over verbs (ping-pong), 2 ranks, registered buffers (-R 1)"
env CHORUS_TRANSPORT=VERBS "$run" -n 2 "$lat" -s "$lat_bytes" -n "$lat_iters" -w 20 -R 1 \
  > "$logs/chorus_pingpong" 2>&1 || { cat "$logs/chorus_pingpong"; exit 1; }
sed 's/^/  /' "$logs/chorus_pingpong"

echo "== chorus sendrecv_lat -m bw and -m bibw over verbs (streams), 2 ranks, registered buffers"
windows=$(( (iters + 7) / 8 ))  # about as many messages as ib_write_bw sends
for s in $sizes; do
  b=$(bytes_of "$s")
  for m in bw bibw; do
    env CHORUS_TRANSPORT=VERBS "$run" -n 2 "$lat" -m "$m" -s "$b" -n "$windows" -W 8 -w 1 -R 1 \
      > "$logs/chorus_${m}_$b" 2>&1 || { cat "$logs/chorus_${m}_$b"; exit 1; }
    grep -v '^ *$' "$logs/chorus_${m}_$b" | sed 's/^/  /'
  done
done

echo "== chorus sendrecv_perf over verbs, 2 ranks, registered buffers (-R 1)"
first=$(echo "$sizes" | awk '{ print $1 }')
last=$(echo "$sizes" | awk '{ print $NF }')
env CHORUS_TRANSPORT=VERBS "$run" -n 2 "$perf" -b 8 -e 8 -n "$lat_iters" -w 20 -R 1 -z 1 \
  > "$logs/chorus_lat" 2>&1 || { cat "$logs/chorus_lat"; exit 1; }
env CHORUS_TRANSPORT=VERBS "$run" -n 2 "$perf" -b "$first" -e "$last" -f 2 -n "$iters" -w 5 -R 1 \
  > "$logs/chorus_bw" 2>&1 || { cat "$logs/chorus_bw"; exit 1; }
cat "$logs/chorus_lat" "$logs/chorus_bw" | grep -v '^ *$' | sed 's/^/  /'

echo "== ratios"
# sendrecv_lat's row: #bytes #iterations t_min t_max t_typical t_avg ... (as ib_send_lat's).
# (No process substitution: the guest has no /dev/fd.)
pp_typ=$(awk -v b="$lat_bytes" '$1 == b && NF >= 6 { print $5; found = 1 } END { exit !found }' \
  "$logs/chorus_pingpong")
pp_avg=$(awk -v b="$lat_bytes" '$1 == b && NF >= 6 { print $6; found = 1 } END { exit !found }' \
  "$logs/chorus_pingpong")
awk -v c="$pp_avg" -v ct="$pp_typ" -v p="$perf_lat" -v t="$perf_lat_typ" 'BEGIN {
  printf "8 B one-way latency (ping-pong): chorus t_avg %.2f us / ib_send_lat t_avg %.2f us = %.2f", c, p, c / p
  printf " (target <= 2); t_typical %.2f / %.2f us = %.2f\n", ct, t, ct / t }'
chorus_lat=$(chorus_col "$logs/chorus_lat" 8 6)
awk -v c="$chorus_lat" -v p="$perf_lat" -v t="$perf_lat_typ" 'BEGIN {
  printf "8 B sendrecv_perf time (both ways at once): chorus %.2f us / ib_send_lat t_avg %.2f us = %.2f; ", c, p, c / p
  printf "/ t_typical %.2f us = %.2f\n", t, c / t }'
for s in $sizes; do
  b=$(bytes_of "$s")
  # sendrecv_lat -m bw/bibw print ib_write_bw's columns: BW average is $4, in MB/s of 2^20.
  uni=$(perftest_bw "$logs/chorus_bw_$b" "$b") || uni=0
  bi=$(perftest_bw "$logs/chorus_bibw_$b" "$b") || bi=0
  t_us=$(chorus_col "$logs/chorus_bw" "$b" 6) || t_us=0
  # A perftest figure of 0 (rxe under emulation can stall on large messages) has no ratio.
  awk -v u="$uni" -v bi="$bi" -v t="$t_us" -v w="${wbw[$b]}" -v wb="${bwbw[$b]}" -v b="$b" '
    function ratio(x, y) { return y > 0 && x > 0 ? sprintf("%.2f", x / y) : "n/a" }
    BEGIN {
      printf "%d B bandwidth one way (sendrecv_lat -m bw): chorus %.3f GB/s / ib_write_bw %.3f GB/s = %s (target >= 0.8)\n",
        b, u / 1e9, w / 1e9, ratio(u, w)
      printf "%d B bandwidth both ways (sendrecv_lat -m bibw, sum): chorus %.3f GB/s / ib_write_bw -b %.3f GB/s = %s\n",
        b, bi / 1e9, wb / 1e9, ratio(bi, wb)
      c = t > 0 ? b / t * 1e6 : 0
      printf "%d B sendrecv_perf (one message each way per step): chorus %.3f GB/s / half of ib_write_bw -b %.3f GB/s = %s\n",
        b, c / 1e9, wb / 2e9, ratio(c, wb / 2) }'
done
