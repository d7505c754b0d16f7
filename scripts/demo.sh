#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# File: scripts/demo.sh
# The one-command demo: installs the Debian packages (scripts/install-deps.sh, a no-op when
# they are present), builds Release in ./build (tests off, for speed), then runs the
# nccl-tests-compatible AllReduce, ReduceScatter, AllGather and AlltoAll benchmarks on 4 local
# ranks (4 processes started by chorus-run), 8 B to 64 MiB by powers of two, float, printing
# the four tables. Exits non-zero if a step fails or any benchmark reports #wrong > 0 or an
# error.
#
# Runtime on 2 cores: the four runs take about 25 s with nccl-tests' defaults (-n 20 timed
# iterations, -w 1 warm-up iteration), which the demo keeps; a first build adds a few minutes.
# Overrides (environment): BUILD_DIR (build), DEMO_RANKS (4), DEMO_MAXBYTES (64M),
# DEMO_ITERS (20), DEMO_WARMUP (1).
set -euo pipefail

cd "$(dirname "$0")/.."
build=${BUILD_DIR:-build}
ranks=${DEMO_RANKS:-4}
maxbytes=${DEMO_MAXBYTES:-64M}
iters=${DEMO_ITERS:-20}
warmup=${DEMO_WARMUP:-1}
tools=(all_reduce_perf reduce_scatter_perf all_gather_perf alltoall_perf)

banner() { printf '\n==== %s\n' "$*"; }

banner "dependencies (scripts/install-deps.sh)"
scripts/install-deps.sh

banner "configure and build: Release in ${build}"
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DCHORUS_BUILD_TESTS=OFF
cmake --build "$build" -j"$(nproc)" --target chorus-run "${tools[@]}"

status=0
summary=()
for tool in "${tools[@]}"; do
  banner "${tool}: ${ranks} ranks (chorus-run -n ${ranks}), 8 B..${maxbytes}, float," \
         "-n ${iters} -w ${warmup}"
  start=$SECONDS
  if "$build/tools/chorus-run" -n "$ranks" --timeout 900 "$build/bench/coll/$tool" \
       -b 8 -e "$maxbytes" -f 2 -d float -n "$iters" -w "$warmup" -c 1; then
    summary+=("${tool}: OK ($((SECONDS - start)) s)")
  else
    summary+=("${tool}: FAILED, exit status $? ($((SECONDS - start)) s)")
    status=1
  fi
done

banner "summary"
printf '%s\n' "${summary[@]}"
if [ "$status" -ne 0 ]; then
  echo "demo: FAILED (wrong results or errors above)" >&2
else
  echo "demo: all four benchmarks ran with 0 wrong elements"
fi
exit "$status"
