#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# File: bench/compare/latency.sh
# Small-message latency, Chorus beside Open MPI in one run: the time per blocking call of each
# collective at one size (8 B by default), the medians of several alternating repetitions,
# and their ratio. Also the software cost of a call on one rank (Chorus alone: no peer, so
# nothing but the library's own path).
#
#   bench/compare/latency.sh [-B BUILD] [-n RANKS] [-t shm|tcp] [-s BYTES] [-r REPS] [-i ITERS] [-T]
#
# -T adds a column: Open MPI initialised with MPI_THREAD_MULTIPLE, thread-safe as a Chorus (or
# NCCL) communicator always is.
#
# Chorus: chorus-run -n RANKS -x CHORUS_TRANSPORT=SHM|TCP <coll>_perf -b S -e S -n ITERS -w 1000 -z 1
# Open MPI: mpirun --mca pml ob1 --mca btl self,vader|tcp chorus_mpi_coll_bench (same sizes).
# The figures are the out-of-place "time" column (us); float elements, so ReduceScatter, AllGather,
# AlltoAll, Gather and Scatter need -s >= 4 x RANKS (a "-" otherwise). Rooted collectives use
# root 0 on both sides. Needs a build with CHORUS_BUILD_BENCH
# (the default) and Open MPI (scripts/install-deps.sh --bench); without mpirun only Chorus runs.
set -euo pipefail
cd "$(dirname "$0")/../.."
build=build ranks=2 transport=shm size=8 reps=3 iters=20000 multiple=0
while getopts "B:n:t:s:r:i:Th" o; do
  case $o in
    B) build=$OPTARG ;;
    n) ranks=$OPTARG ;;
    t) transport=$OPTARG ;;
    s) size=$OPTARG ;;
    r) reps=$OPTARG ;;
    i) iters=$OPTARG ;;
    T) multiple=1 ;;
    *) sed -n '3,17p' "$0"; exit 2 ;;
  esac
done
case $transport in
  shm) chorus_tr=SHM btl=vader ;;
  tcp) chorus_tr=TCP btl=tcp ;;
  *) echo "latency.sh: -t shm or tcp, not '$transport'" >&2; exit 2 ;;
esac
run=$build/tools/chorus-run
[ -x "$run" ] || { echo "latency.sh: $run not built" >&2; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
have_mpi=0
command -v mpirun > /dev/null && [ -x "$build/bench/peers/chorus_mpi_coll_bench" ] && have_mpi=1

colls=(all_reduce reduce_scatter all_gather alltoall broadcast reduce gather scatter)
mpi_names=(allreduce reduce_scatter allgather alltoall bcast reduce gather scatter)
titles=(AllReduce ReduceScatter AllGather AlltoAll Broadcast Reduce Gather Scatter)

# The out-of-place time (us) of an nccl-tests-style row for `size`.
row_time() { awk -v s="$size" '$1 == s {print $6; exit}'; }
chorus_time() {  # ranks coll
  "$run" -n "$1" -x CHORUS_TRANSPORT=$chorus_tr "$build/bench/coll/${2}_perf" -b "$size" \
    -e "$size" -n "$iters" -w 1000 -z 1 2>&1 | row_time
}
mpi_time() {  # coll [THREAD_MULTIPLE=1]
  local over=()
  [ "$ranks" -gt "$(nproc)" ] && over=(--oversubscribe)
  mpirun -np "$ranks" --bind-to none "${over[@]}" -x "THREAD_MULTIPLE=${2:-0}" \
    --mca pml ob1 --mca btl "self,$btl" \
    "$build/bench/peers/chorus_mpi_coll_bench" -b "$size" -e "$size" -n "$iters" -w 1000 \
    -o "$1" 2>&1 | row_time
}
median() { tr ' ' '\n' | { grep -v '^$' || true; } | sort -g | awk '{v[NR] = $1} END {print NR ? v[int((NR + 1) / 2)] : "-"}'; }

echo "# $size B, $ranks ranks over $transport, time per call (us), median of $reps alternating runs of $iters calls"
# A table row: the first four columns, and with -T the last two.
row() {
  printf '| %-13s | %8s | %8s | %6s |' "$1" "$2" "$3" "$4"
  [ $multiple = 1 ] && printf ' %13s | %6s |' "$5" "$6"
  echo
}
row collective Chorus "Open MPI" ratio "OMPI multiple" ratio
row ------------- -------- -------- ------ ------------- ------ | tr ' ' -
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {if (b + 0 > 0 && a + 0 > 0) printf "%.2fx", a / b; else print "-"}'; }
for i in "${!colls[@]}"; do
  c=() m=() t=()
  for _ in $(seq "$reps"); do
    c+=("$(chorus_time "$ranks" "${colls[$i]}")")
    [ $have_mpi = 1 ] && m+=("$(mpi_time "${mpi_names[$i]}")")
    [ $have_mpi = 1 ] && [ $multiple = 1 ] && t+=("$(mpi_time "${mpi_names[$i]}" 1)")
  done
  cm=$(echo "${c[*]}" | median)
  mm=- tm=-
  [ $have_mpi = 1 ] && mm=$(echo "${m[*]}" | median)
  [ $have_mpi = 1 ] && [ $multiple = 1 ] && tm=$(echo "${t[*]}" | median)
  row "${titles[$i]}" "$cm" "$mm" "$(ratio "$cm" "$mm")" "$tm" "$(ratio "$cm" "$tm")"
done
one=()
for _ in $(seq "$reps"); do one+=("$(chorus_time 1 all_reduce)"); done
echo "# software cost of one call on one rank (AllReduce, $size B): $(echo "${one[*]}" | median) us"
