#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The hierarchical AllReduce across test-bed hosts (network namespaces with hostnames of their
# own, so each host's ranks share memory and reach the others over TCP): 2 hosts x 2 ranks
# placed alternately, then 3 hosts x 2 ranks in blocks, each rank's result bit-identical to
# every other's and right against fp64 (the mp worker's identical check), for allreduce:hier
# (in pipelined pieces at the larger count) and the tuner's choice, and the hierarchical
# Broadcast and Reduce from every root, in place and not, every rank's result checked (Reduce:
# every operator); then 2 hosts x 2 rails,
# each rail carrying its local rank's cross-host traffic.
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
  "$tb" exec --hosts "$hosts" --rails 1 -- sh -c "\"\$TESTBED\" launch -n $n --placement $placement \
    -x CHORUS_TEST_DATATYPES=float,bfloat16 $worker broadcast $counts broadcast:hier" > "$log" 2>&1 ||
    { cat "$log"; echo "FAIL: Broadcast on $hosts hosts x $((n / hosts)) ranks"; exit 1; }
  grep "Broadcast cases (broadcast:hier), 0 failures" "$log"
  "$tb" exec --hosts "$hosts" --rails 1 -- sh -c "\"\$TESTBED\" launch -n $n --placement $placement \
    -x CHORUS_TEST_DATATYPES=float,bfloat16 $worker reduce $counts reduce:hier" > "$log" 2>&1 ||
    { cat "$log"; echo "FAIL: Reduce on $hosts hosts x $((n / hosts)) ranks"; exit 1; }
  grep "Reduce cases (reduce:hier), 0 failures" "$log"
}
check 2 4 cyclic 1001,2500007 "2 host(s): tbed-[a-z0-9]*-h0 (0 2), tbed-[a-z0-9]*-h1 (1 3)"
check 3 6 block 1001,300007 "3 host(s): tbed-[a-z0-9]*-h0 (0 1), tbed-[a-z0-9]*-h1 (2 3), tbed-[a-z0-9]*-h2 (4 5)"
# Rail-aligned: 2 hosts x 2 rails, CHORUS_SOCKET_IFNAME=rail (both rails): local rank i's
# cross-host pairs use rail i, so the hierarchical AllReduce loads both of host 0's links.
cat > "$log.sh" << 'INNER'
set -e
worker=$1
tx() { "$TESTBED" run 0 cat "/sys/class/net/rail$1/statistics/tx_bytes"; }
a0=$(tx 0) a1=$(tx 1)
"$TESTBED" launch -n 4 --placement cyclic --ifname rail -x CHORUS_TEST_DATATYPES=float   -x CHORUS_DEBUG=INFO -x CHORUS_DEBUG_SUBSYS=NET "$worker" identical 2500007 allreduce:hier
b0=$(tx 0) b1=$(tx 1)
echo "host 0 sent $(((b0 - a0) >> 20)) MiB on rail0, $(((b1 - a1) >> 20)) MiB on rail1"
# Each of the 6 float AllReduces of 10 MB sends half a block (2.5 MB) per rank across: at least
# 10 MiB on each rail.
[ $((b0 - a0)) -gt $((10 << 20)) ] && [ $((b1 - a1)) -gt $((10 << 20)) ]
INNER
"$tb" exec --hosts 2 --rails 2 -- bash "$log.sh" "$worker" > "$log" 2>&1 ||
  { cat "$log"; echo "FAIL: the hierarchical AllReduce did not use both rails"; rm -f "$log.sh"; exit 1; }
rm -f "$log.sh"
grep "on rail1\|MiB on rail0" "$log"
echo "hier: the hierarchical AllReduce, Broadcast and Reduce across 2 and 3 hosts, and the AllReduce on 2 rails, passed"
