#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The ring and chain algorithms around the host-aware ring (Comm::ring()): 5 ranks on 2 test-bed
# hosts placed alternately (ranks 0 2 4 on one host, 1 3 on the other, so the ring is 0 2 4 1 3
# and not rank order), every collective with ring / chain forced, checked by the mp worker's
# matrix; then the same with CHORUS_RING=RANK.
#   ring_test.sh TESTBED_SH CHORUS_RUN MP_WORKER
# Exit 77 (skipped) without root, iproute2, nsenter or unshare.
set -euo pipefail
tb=$1
export CHORUS_RUN=$2
worker=$3
if [ "$(id -u)" != 0 ] || ! command -v ip > /dev/null || ! command -v nsenter > /dev/null ||
  ! command -v unshare > /dev/null; then
  echo "SKIP: the test bed needs root, iproute2 and util-linux (nsenter, unshare)"
  exit 77
fi
algos=allreduce:ring,reducescatter:ring,allgather:ring,broadcast:chain,reduce:chain
log=$(mktemp)
trap 'rm -f "$log"' EXIT
for ring in HOST RANK; do
  "$tb" exec --hosts 2 --rails 1 -- sh -c "\"\$TESTBED\" launch -n 5 --placement cyclic \
    -x CHORUS_ALGO=$algos -x CHORUS_RING=$ring -x CHORUS_DEBUG=INFO -x CHORUS_DEBUG_SUBSYS=INIT \
    $worker matrix 3001" > "$log" 2>&1 || { cat "$log"; echo "FAIL: CHORUS_RING=$ring"; exit 1; }
  want="ring 0 2 4 1 3"
  [ "$ring" = RANK ] && want="ring 0 1 2 3 4"
  if [ "$(grep -c "$want\$" "$log")" != 5 ]; then
    grep "ring " "$log" || true
    echo "FAIL: CHORUS_RING=$ring: expected '$want' on all 5 ranks"
    exit 1
  fi
  grep -E "cases, 0 failures" "$log"
done
echo "ring: host-aware and rank-order rings across 2 hosts passed"
