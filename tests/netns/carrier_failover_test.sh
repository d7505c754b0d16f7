#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# File: tests/netns/carrier_failover_test.sh
# Two rails of three down, one after the other, the second the carrier of the first (issue 12,
# section 4: "only when every path to a peer is gone does the operation fail"): 2 hosts x 3
# rails of 1 Gbit/s, one TCP path per rail (CHORUS_NCHANNELS=3), an AllReduce of 8 MiB in a
# loop. Once both ranks are in the timed loop, rail 1 of host 1 goes down; its path fails over
# to rail 0. Once both ranks gave it up, rail 0 goes down too: its path, with rail 1's traffic
# inside it, fails over to rail 2 (transports/tcp/README.md, "Failover").
# Checked: the run ends without error on both ranks, nccl-tests' check finds every rank's
# results right, both ranks gave channel 1 up to channel 0 and then channel 0 up to channel 2,
# and rail 2 carried the traffic once the other two were down.
#   carrier_failover_test.sh TESTBED_SH CHORUS_RUN ALL_REDUCE_PERF
# Exit 77 (skipped) without root, iproute2, nsenter or unshare.
set -euo pipefail
tb=$1
export CHORUS_RUN=$2
allreduce=$3
# shellcheck source=tests/netns/lib.sh
. "$(dirname "$0")/lib.sh"
netns_require
netns_rank_workdir
cat > "$work/inner.sh" << 'INNER'
set -euo pipefail
work=$1
shift
rail_bytes() {  # bytes through host 0's rail $1, both directions
  echo $(($("$TESTBED" run 0 cat /sys/class/net/rail$1/statistics/tx_bytes) +
    $("$TESTBED" run 0 cat /sys/class/net/rail$1/statistics/rx_bytes)))
}
"$TESTBED" launch -n 2 --ifname rail -x CHORUS_NCHANNELS=3 -x CHORUS_PEER_TIMEOUT_MS=30000 \
  -x CHORUS_TIMEOUT_MS=60000 bash "$work/wrap.sh" "$work" "$@" -b 8M -e 8M -n 100 -w 1 -c 1 \
  > "$work/launch.log" 2>&1 &
launcher=$!
fail() {
  cat "$work/launch.log" "$work"/rank[01].log 2> /dev/null || true
  echo "FAIL: $*"
  kill $launcher 2> /dev/null || true
  exit 1
}
# Only once both ranks are in the timed loop and every rail carries data.
started=0
for _ in $(seq 1 300); do
  if [ "$started" = 0 ] && grep -q '(elements)' "$work/rank0.log" 2> /dev/null; then
    started=1 r0=$(rail_bytes 0) r1=$(rail_bytes 1) r2=$(rail_bytes 2)
  fi
  [ "$started" = 1 ] && [ $(($(rail_bytes 0) - r0)) -gt $((4 << 20)) ] &&
    [ $(($(rail_bytes 1) - r1)) -gt $((4 << 20)) ] &&
    [ $(($(rail_bytes 2) - r2)) -gt $((4 << 20)) ] && break
  kill -0 $launcher 2> /dev/null || break
  sleep 0.2
done
[ "$started" = 1 ] && kill -0 $launcher 2> /dev/null ||
  fail "the ranks did not reach their timed loop with every rail busy"
gave_up() {  # rank $1 gave channel $2 up to channel $3
  grep -q "tcp channel $2 to rank [01] is given up, its traffic continues on tcp channel $3" \
    "$work/rank$1.log" 2> /dev/null
}
wait_both() {
  for _ in $(seq 1 150); do
    gave_up 0 "$1" "$2" && gave_up 1 "$1" "$2" && return 0
    kill -0 $launcher 2> /dev/null || return 1
    sleep 0.2
  done
  return 1
}
"$TESTBED" link 1 1 down > /dev/null
wait_both 1 0 || fail "the ranks did not both give channel 1 up to channel 0"
"$TESTBED" link 1 0 down > /dev/null
wait_both 0 2 || fail "the ranks did not both give channel 0 (the carrier of channel 1) up to channel 2"
alone=$(rail_bytes 2)
for _ in $(seq 1 400); do kill -0 $launcher 2> /dev/null || break; sleep 0.2; done
kill -0 $launcher 2> /dev/null && fail "still running 80 s after the second rail went down"
wait $launcher || true
carried=$(($(rail_bytes 2) - alone))
for rank in 0 1; do
  rc=missing
  [ -f "$work/rank$rank.end" ] && read -r rc _ < "$work/rank$rank.end"
  echo "rank $rank exit $rc"
  grep "is given up, its traffic continues" "$work/rank$rank.log" | cut -c1-300 || true
  [ "$rc" = 0 ] || fail "rank $rank must finish without error"
done
grep -E '^ +[0-9]+ ' "$work/rank0.log"
grep -q "Out of bounds values : 0 OK" "$work/rank0.log" || fail "wrong results after the failovers"
echo "rail 2 carried $((carried >> 20)) MiB once rails 0 and 1 were down"
[ "$carried" -gt $((16 << 20)) ] || fail "rail 2 carried little after the second cut"
INNER
"$tb" exec --hosts 2 --rails 3 --rate 1gbit -- bash "$work/inner.sh" "$work" "$allreduce"
echo "carrier failover: the AllReduce finished, right, on the one rail left"
