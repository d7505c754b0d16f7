#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Installs what is needed, builds, and runs the whole test suite (README command 2; .ci/run).
#   scripts/test.sh [extra ctest arguments, e.g. -L unit]
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
jobs=$(nproc)
cmake -S . -B build-test -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCHORUS_WERROR=ON -DCHORUS_BUILD_TESTS=ON
cmake --build build-test -j"$jobs"
start=$(date +%s)
ctest --test-dir build-test -j"$jobs" --output-on-failure --no-tests=error "$@"
echo "test suite: $(( $(date +%s) - start )) s"
