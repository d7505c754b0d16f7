#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The hierarchical AllReduce across test-bed hosts (network namespaces with hostnames of their
# own, so each host's ranks share memory and reach the others over TCP): 2 hosts x 2 ranks
# placed alternately, then 3 hosts x 2 ranks in blocks, each rank's result bit-identical to
# every other's and right against fp64 (the mp worker's identical check), for allreduce:hier
# (in pipelined pieces at the larger count) and the tuner's choice.
#   hier_test.sh TESTBED_SH CHORUS_RUN MP_WORKER
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
log=$(mktemp)
trap 'rm -f "$log"' EXIT
check() {  # hosts ranks placement counts hosts_line
  local hosts=$1 n=$2 placement=$3 counts=$4 want=$5
  "$tb" exec --hosts "$hosts" --rails 1 -- sh -c "\"\$TESTBED\" launch -n $n --placement $placement \
    -x CHORUS_DEBUG=INFO -x CHORUS_DEBUG_SUBSYS=INIT -x CHORUS_TEST_DATATYPES=float,bfloat16 \
    $worker identical $counts allreduce:hier,auto" > "$log" 2>&1 ||
    { cat "$log"; echo "FAIL: $hosts hosts x $((n / hosts)) ranks"; exit 1; }
  if [ "$(grep -c "$want" "$log")" != "$n" ]; then
    grep "host(s)" "$log" || true
    echo "FAIL: expected '$want' on all $n ranks"
    exit 1
  fi
  grep "algorithms, 0 with failures" "$log"
}
check 2 4 cyclic 1001,2500007 "2 host(s): tbed-[a-z0-9]*-h0 (0 2), tbed-[a-z0-9]*-h1 (1 3)"
check 3 6 block 1001,300007 "3 host(s): tbed-[a-z0-9]*-h0 (0 1), tbed-[a-z0-9]*-h1 (2 3), tbed-[a-z0-9]*-h2 (4 5)"
echo "hier: the hierarchical AllReduce across 2 and 3 hosts passed"
