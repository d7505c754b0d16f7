#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# File: bench/overlap/overlap_speed.sh
# The overlap scheduler on a real training step (examples/overlap_train: OpenBLAS forward and
# backward, SGD), on the multi-host test bed (scripts/testbed.sh): H hosts (default 2), one rank
# each, joined by one shaped link (default 1 Gbit/s), so that communication costs the network.
# Two shapes of model, each in one run of the example:
#   balanced   8 layers of 1024 x 1024, batch 1024: 32 MiB of gradients, communication under
#              the compute time on the development VM (-- the hidden fraction's target case,
#              comm <= compute)
#   comm-heavy 8 layers of 2048 x 2048, batch 256 (issue 13's model): 128 MiB of gradients,
#              communication well over the backward pass (-- where priority scheduling should
#              beat FIFO: the next forward pass starts while the later layers are on the wire)
# The example prints per policy (priority, fifo, ddp: FIFO with 25 MiB buckets and a 1 MiB first
# bucket, priority-fp8: priority with every piece reduced as FP8 with error feedback) the
# compute-only, communication-only and overlapped step times (medians, slowest rank),
# hidden = (compute + comm - overlap) / comm, the compute time of the overlapped step (its time
# less the waits for gradients) against compute alone, the CPU time a communication-only step
# costs a rank, and writes each policy's last step as a Chrome trace (JSON) into the output
# directory.
#
#   overlap_speed.sh [-B BUILD_DIR] [-o OUT_DIR] [--hosts H] [--rate RATE] [--steps S] [--quick]
# --quick: small models (a check that it runs, for CI), not a measurement.
# Exit status: 0 done, 1 failure, 77 skipped (needs root, or OpenBLAS for the example).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
# shellcheck source=bench/testbed_lib.sh
. "$root/bench/testbed_lib.sh"
build=build
out=
hosts=2
rate=1gbit
steps=5
quick=0
while [ $# -gt 0 ]; do
  case $1 in
    -B) build=$2; shift 2 ;;
    -o) out=$2; shift 2 ;;
    --hosts) hosts=$2; shift 2 ;;
    --rate) rate=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --quick) quick=1; shift ;;
    -h|--help) awk 'NR >= 3 && !/^#/ {exit} NR >= 3' "$0"; exit 0 ;;
    *) echo "overlap_speed.sh: unknown argument '$1' (try --help)" >&2; exit 2 ;;
  esac
done

testbed_require
build=$(cd "$build" && pwd)
run=$build/tools/chorus-run
example=$build/examples/overlap_train
if [ ! -x "$example" ]; then
  echo "SKIP: $example is not built (it needs OpenBLAS: scripts/install-deps.sh)"
  exit 77
fi
testbed_require_built overlap_speed.sh "chorus-run" "$run"
testbed_start_session ov
[ -n "$out" ] || out=$(mktemp -d /tmp/chorus-overlap.XXXXXX)
mkdir -p "$out"

"$testbed" up --hosts "$hosts" --rails 1 --rate "$rate" > "$out/up.log" 2>&1 ||
  { cat "$out/up.log"; exit 1; }
echo "# test bed: $hosts hosts, one rank each, one link tbf $rate; load average $(cut -d' ' -f1-3 /proc/loadavg), $(nproc) CPUs"
if [ "$quick" = 1 ]; then
  shapes=("quick:--layers 3 --width 256 --batch 64 --steps 2 --warmup 1")
else
  shapes=("balanced:--layers 8 --width 1024 --batch 1024 --steps $steps --warmup 1"
          "comm-heavy:--layers 8 --width 2048 --batch 256 --steps $steps --warmup 1")
fi
policies=priority,fifo,ddp,priority-fp8
for shape in "${shapes[@]}"; do
  name=${shape%%:*}
  # shellcheck disable=SC2206  # the arguments are words
  args=(${shape#*:})
  mkdir -p "$out/$name"
  echo "# $name: testbed.sh launch -n $hosts overlap_train ${args[*]}"
  "$testbed" launch -n "$hosts" --placement cyclic --ifname rail0 --chorus-run "$run" \
    "$example" "${args[@]}" --policies "$policies" --trace "$out/$name" | tee "$out/$name/table.txt"
  grep -q "^priority-fp8 *overlap" "$out/$name/table.txt" ||
    { echo "overlap_train did not finish" >&2; exit 1; }
done
echo "# traces (Chrome JSON): $out/<shape>/overlap_<policy>_rank<r>.json"
