#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The rdma stage of CI (scripts/test.sh runs it after the normal suite): the tests of ctest
# label rdma, which need an RDMA device, run inside the soft-RoCE guest (scripts/rxe-guest.sh:
# Debian's kernel with rdma_rxe in QEMU, booted once) on the normal stage's build, build-test.
#   scripts/test-rdma.sh [ctest arguments]     e.g. scripts/test-rdma.sh -R perftest
# Builds what the tests need first (nothing when the test stage already built it). In the guest
# CHORUS_RDMA_REQUIRED=1 turns a test's "no RDMA device" skip into a failure. Environment:
# CHORUS_RDMA_BUILD_DIR (default build-test, the test stage's), CHORUS_RXE_TIMEOUT (whole guest
# run, default 1500 s) and the others of scripts/rxe-guest.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${CHORUS_RDMA_BUILD_DIR:-build-test}
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCHORUS_WERROR=ON \
  -DCHORUS_BUILD_TESTS=ON > /dev/null
cmake --build "$build" -j"$(nproc)" --target chorus-run chorus_mp_worker chorus_mp_tests \
  chorus_unit_tests chorus_fault_tests chorus-info
scripts/rxe-guest.sh --timeout "${CHORUS_RXE_TIMEOUT:-1500}" -e CHORUS_RDMA_REQUIRED=1 -- \
  ctest --test-dir "$build" -L rdma --output-on-failure --no-tests=error "$@"
