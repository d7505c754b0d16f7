#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# File: bench/ep/ep_bench.sh
# MoE dispatch and combine (chorus/ep.h) beside the AlltoAllv baseline, in DeepEP's terms
# (bench/ep/README.md), with an already built ep_bench and chorus-run:
#   1. shared memory: 2 and 4 processes on this host (chorus-run, CHORUS_TRANSPORT=SHM);
#   2. the test bed (scripts/testbed.sh, root only): 2 hosts joined by one link shaped with tbf
#      (default 1 Gbit/s each way), transports as Chorus picks them (shared memory inside a
#      host, TCP across; EP writes into same-host buffers and forwards): raw TCP through the link first
#      (bench/compress/tcp_rate.py), then 1 rank per host and 2 ranks per host (cyclic
#      placement); each rank's row of "link" figures is the bytes that cross the busiest host's
#      link (tokens sent between ranks on different hosts x their record: x row, FP8 scales, topk
#      indices and weights for dispatch; the BF16 row for combine; TCP/IP headers not counted)
#      over the time, printed as a fraction of the link's rate.
# Each of the two modes runs all of this: normal (DeepEP's normal mode, 4096 tokens) and ll
# (low-latency, ep_bench --mode ll: 128 tokens; the link figures are normal mode's only).
# Results: the tables on stdout and in bench/ep/results/<name>.txt.
#
#   ep_bench.sh BUILD_DIR [--name NAME] [--quick] [--no-testbed] [--rate RATE] [--modes LIST]
#               [-n ITERS] [-w WARMUP] [--bed-iters N] [--ll-iters N] [--ll-bed-iters N]
#               [-- ep_bench options...]
# Defaults: name ep_bench, modes normal,ll; normal: 20 iterations after 3 warm-up over shared
# memory, 5 after 1 on the test bed (a 4-rank iteration moves ~1 GB through a 125 MB/s link);
# ll: 100 after 10 over shared memory, 20 after 2 on the test bed; rate 1gbit, ep_bench's DeepEP
# shapes (hidden 7168, top-8 of 256 experts, bf16 and fp8). --quick: normal with 256 tokens,
# 2 iterations in both modes (a check that everything runs). Options after -- go to every
# ep_bench.
# Exit status: 0 done, 1 a run failed (EP and the baseline disagree, or an error).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
# shellcheck source=bench/testbed_lib.sh
. "$root/bench/testbed_lib.sh"
build=${1:?usage: ep_bench.sh BUILD_DIR [options] (--help)}
if [ "$build" = -h ] || [ "$build" = --help ]; then
  awk 'NR >= 3 && !/^#/ {exit} NR >= 3' "$0"
  exit 0
fi
shift
name=ep_bench
iters=20
warmup=3
bed_iters=5
bed_warmup=1
rate=1gbit
testbed_wanted=1
modes=normal,ll
ll_iters=100
ll_warmup=10
ll_bed_iters=20
ll_bed_warmup=2
normal_extra=()
extra=()
while [ $# -gt 0 ]; do
  case $1 in
    --name) name=$2; shift 2 ;;
    --quick)
      iters=2 warmup=1 bed_iters=2 bed_warmup=1 normal_extra=(--tokens 256)
      ll_iters=2 ll_warmup=1 ll_bed_iters=2 ll_bed_warmup=1
      shift ;;
    --modes) modes=$2; shift 2 ;;
    --ll-iters) ll_iters=$2; shift 2 ;;
    --ll-bed-iters) ll_bed_iters=$2; shift 2 ;;
    --no-testbed) testbed_wanted=0; shift ;;
    --rate) rate=$2; shift 2 ;;
    -n) iters=$2; shift 2 ;;
    -w) warmup=$2; shift 2 ;;
    --bed-iters) bed_iters=$2; shift 2 ;;
    --) shift; extra+=("$@"); break ;;
    *) echo "ep_bench.sh: unknown argument '$1' (try --help)" >&2; exit 2 ;;
  esac
done
# mode_args MODE WHERE: the ep_bench options of one run (WHERE: shm or bed).
mode_args() {
  case $1:$2 in
    normal:shm) echo --mode normal -n "$iters" -w "$warmup" "${normal_extra[*]-}" ;;
    normal:bed) echo --mode normal -n "$bed_iters" -w "$bed_warmup" "${normal_extra[*]-}" ;;
    ll:shm) echo --mode ll -n "$ll_iters" -w "$ll_warmup" ;;
    ll:bed) echo --mode ll -n "$ll_bed_iters" -w "$ll_bed_warmup" ;;
  esac
}
mode_list=()
for m in ${modes//,/ }; do
  case $m in
    normal | ll) mode_list+=("$m") ;;
    *) echo "ep_bench.sh: --modes: '$m': normal or ll" >&2; exit 2 ;;
  esac
done
build=$(cd "$build" && pwd)
run=$build/tools/chorus-run
bench=$build/bench/ep_bench
testbed_require_built ep_bench.sh "the ep_bench and chorus-run targets" "$run" "$bench"
mkdir -p "$here/results"
out=$here/results/$name.txt
work=$(mktemp -d /tmp/chorus-ep-bench.XXXXXX)
server_pid=
status=0
trap 'rm -rf "$work"' EXIT  # the test bed's session takes this over (bench_cleanup)

# Everything printed goes to the results file as well.
exec > >(tee "$out") 2>&1
echo "# ep_bench.sh $(date -u +%Y-%m-%dT%H:%M:%SZ), git $(git -C "$root" rev-parse --short HEAD 2> /dev/null || echo '?')"
echo "# load average before: $(cut -d' ' -f1-3 /proc/loadavg), $(nproc) CPUs"

# run_bench LABEL FILE COMMAND...: runs one ep_bench job, keeps its output in FILE, prints it.
run_bench() {
  local label=$1 file=$2
  shift 2
  echo "# $label: ${*##*/}"
  if ! "$@" > "$file" 2>&1; then
    echo "# $label FAILED"
    status=1
  fi
  cat "$file"
  echo
}

# 1. Shared memory, this host.
for m in "${mode_list[@]}"; do
  for n in 2 4; do
    # shellcheck disable=SC2046  # mode_args prints words
    run_bench "$m mode, shared memory, $n processes" "$work/${m}_shm$n.txt" \
      "$run" -n "$n" --timeout 1800 -x CHORUS_TRANSPORT=SHM "$bench" $(mode_args "$m" shm) \
      "${extra[@]+"${extra[@]}"}"
  done
done

# 2. The test bed: 2 hosts, one shaped link each, 1 and 2 ranks per host.
if [ "$testbed_wanted" = 1 ] && [ "$(id -u)" = 0 ]; then
  testbed_require
  # shellcheck disable=SC2317  # called on exit by testbed_end_session
  bench_cleanup() {
    if [ -n "$server_pid" ]; then kill "$server_pid" 2> /dev/null || true; fi
    rm -rf "$work"
  }
  testbed_start_session ep
  "$testbed" up --hosts 2 --rails 1 --rate "$rate" > "$work/up.log" 2>&1 ||
    { cat "$work/up.log"; exit 1; }
  echo "# test bed: 2 hosts x 1 rail, every link tbf $rate both ways; shared memory inside a host, TCP across"
  port=47511
  "$testbed" run 1 python3 "$root/bench/compress/tcp_rate.py" serve 10.240.0.2 "$port" \
    > "$work/server.txt" 2>&1 &
  server_pid=$!
  sleep 0.5
  tcp=$("$testbed" run 0 python3 "$root/bench/compress/tcp_rate.py" run 10.240.0.2 "$port" \
        $((128 << 20)))
  wait "$server_pid" || true
  server_pid=
  echo "# raw TCP: one way $(awk '$1 == "one_way" {print $2}' <<< "$tcp") GB/s, both ways at" \
       "once $(awk '$1 == "both_ways" {print $2}' <<< "$tcp") GB/s per direction;" \
       "link $(awk -v b="$(tc_rate_bytes "$rate")" 'BEGIN {print b / 1e9}') GB/s"
  echo
  for m in "${mode_list[@]}"; do
    for n in 2 4; do
      # shellcheck disable=SC2046  # mode_args prints words
      run_bench "$m mode, test bed, $n ranks ($((n / 2)) per host)" "$work/${m}_bed$n.txt" \
        "$testbed" launch -n "$n" --placement cyclic --timeout 1800 --chorus-run "$run" \
        "$bench" $(mode_args "$m" bed) "${extra[@]+"${extra[@]}"}"
    done
  done
elif [ "$testbed_wanted" = 1 ]; then
  echo "# test bed skipped: it needs root"
fi

# 3. Summary: EP against the baseline, and the link's use on the test bed.
link=$(tc_rate_bytes "$rate")
wants() { [[ " ${mode_list[*]} " == *" $1 "* ]]; }
if wants normal; then
  echo "# summary: ratio = EP GB/s / baseline GB/s (target >= 1.5x over shared memory); link % ="
  echo "#          bytes over the busiest host link / time / $rate (target >= 90 % for EP)"
  printf '%-14s %5s %5s %10s %10s %12s %12s %12s %12s\n' "#where" ranks dtype disp_x comb_x \
    ep_disp_link ep_comb_link base_d_link base_c_link
  for f in "$work"/normal_shm2.txt "$work"/normal_shm4.txt "$work"/normal_bed2.txt \
    "$work"/normal_bed4.txt; do
    [ -f "$f" ] || continue
    where=shared_memory
    case $f in *bed*) where=testbed_$rate ;; esac
    awk -v where="$where" -v link="$link" '
      function pct(v) { return v == "-" ? "-" : sprintf("%.1f%%", 100 * v * 1e9 / link) }
      $1 != "normal" { next }
      $4 == "ep" { ed[$3] = $10; ec[$3] = $11 }
      $4 == "alltoallv" { bd[$3] = $10; bc[$3] = $11 }
      $4 == "ep/base" { printf "%-14s %5s %5s %10s %10s %12s %12s %12s %12s\n", where, $2, $3, $5,
                        $6, pct(ed[$3]), pct(ec[$3]), pct(bd[$3]), pct(bc[$3]) }' "$f"
  done
fi
# Low-latency mode: the ratios, EP's mean times and its hooked calls' send + recv.
if wants ll; then
  echo "# summary, ll mode: ratio = EP GB/s / baseline GB/s (median times); us: EP's median,"
  echo "#          slowest rank; hook: median send + recv us of the calls with returnRecvHook=1"
  printf '%-14s %5s %5s %10s %10s %10s %10s %16s %16s\n' "#where" ranks dtype disp_x comb_x \
    ep_disp_us ep_comb_us hook_disp_us hook_comb_us
  for f in "$work"/ll_shm2.txt "$work"/ll_shm4.txt "$work"/ll_bed2.txt "$work"/ll_bed4.txt; do
    [ -f "$f" ] || continue
    where=shared_memory
    case $f in *bed*) where=testbed_$rate ;; esac
    awk -v where="$where" '
      $1 != "ll" { next }
      $4 == "ep" { ed[$3] = $6; ec[$3] = $11 }
      $4 == "ep-send" { sd[$3] = $6; sc[$3] = $11 }
      $4 == "ep-recv" { rd[$3] = $6; rc[$3] = $11 }
      $4 == "ep/base" { printf "%-14s %5s %5s %10s %10s %10s %10s %16s %16s\n", where, $2, $3, $5,
                        $6, ed[$3], ec[$3], sd[$3] "+" rd[$3], sc[$3] "+" rc[$3] }' "$f"
  done
fi
echo "# load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# results: ${out#"$root"/}"
exit "$status"
