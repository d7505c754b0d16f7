#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Installs what is needed, builds, and runs the whole test suite (README command 2; .ci/run):
# the ctest suite of the normal build, the tests that need an RDMA device (label rdma) in the
# soft-RoCE guest (scripts/test-rdma.sh), then the core suite under ASan+UBSan and under TSan
# and a short run of every fuzzer (scripts/sanitizers.sh). Each stage prints "stage time:".
#   scripts/test.sh                      everything
#   scripts/test.sh [ctest arguments]    the normal build's ctest only, e.g. scripts/test.sh -L unit
#   CHORUS_TEST_STAGES="test rdma asan tsan fuzz" scripts/test.sh   chosen stages (default: all of
#                                        them, or "test" when ctest arguments are given)
set -euo pipefail
cd "$(dirname "$0")/.."
total=$(date +%s)
scripts/install-deps.sh
echo "stage time: install-deps $(($(date +%s) - total)) s"
if [ $# -gt 0 ]; then
  stages=${CHORUS_TEST_STAGES:-test}
else
  stages=${CHORUS_TEST_STAGES:-test rdma asan tsan fuzz}
fi
jobs=$(nproc)
if [[ " $stages " == *" test "* ]]; then
  start=$(date +%s)
  cmake -S . -B build-test -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCHORUS_WERROR=ON -DCHORUS_BUILD_TESTS=ON
  cmake --build build-test -j"$jobs"
  echo "stage time: build $(($(date +%s) - start)) s"
  start=$(date +%s)
  # Label rdma needs an RDMA device: the rdma stage runs it in the soft-RoCE guest.
  ctest --test-dir build-test -j"$jobs" --output-on-failure --no-tests=error -LE rdma "$@"
  echo "stage time: test suite $(($(date +%s) - start)) s"
fi
if [[ " $stages " == *" rdma "* ]]; then
  start=$(date +%s)
  scripts/test-rdma.sh
  echo "stage time: rdma $(($(date +%s) - start)) s"
fi
sanitizer_stages=()
for s in asan tsan fuzz; do
  if [[ " $stages " == *" $s "* ]]; then sanitizer_stages+=("$s"); fi
done
if [ ${#sanitizer_stages[@]} -gt 0 ]; then scripts/sanitizers.sh "${sanitizer_stages[@]}"; fi
echo "scripts/test.sh ($stages): $(($(date +%s) - total)) s"
