#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# One rail taken down mid-collective, and up again (issue 12, section 4): 2 hosts x 2 rails of
# 1 Gbit/s, one TCP path per rail (CHORUS_NCHANNELS=2). Once both ranks are in the timed loop,
# rail 1 of host 1 goes down. Host 1's rank sees its interface down and gives that path up
# (within CHORUS_LIVENESS_MS), and tells the peer over rail 0; otherwise a rank gives a path up
# after CHORUS_PEER_TIMEOUT_MS without an acknowledgement. The path's traffic, from the first
# byte the peer did not get, continues on rail 0 (transports/tcp/README.md, "Failover"). Once
# both have given it up, the rail comes back; the ranks reconnect the path in the background
# and move its traffic back onto it.
# Checked, for AllReduce and for send/receive: the run ends without error, every rank's results
# are right (-c 1: nccl-tests' check on every rank), both ranks say they gave the path up and
# later that it works again, rail 0 carried traffic while rail 1 was down, and rail 1 carried
# traffic again after it came back. The AllReduce case runs with CHORUS_PEER_TIMEOUT_MS=30000,
# beyond the wait for the failover, and checks that host 1 named its interface and host 0
# followed its word: the failover came from the interface's state, not from the timeout (2 s
# in the send/receive case).
#   failover_test.sh TESTBED_SH CHORUS_RUN ALL_REDUCE_PERF SENDRECV_PERF
# Exit 77 (skipped) without root, iproute2, nsenter or unshare.
set -euo pipefail
tb=$1
export CHORUS_RUN=$2
allreduce=$3
sendrecv=$4
# shellcheck source=tests/netns/lib.sh
. "$(dirname "$0")/lib.sh"
netns_require
netns_rank_workdir
cat > "$work/inner.sh" << 'INNER'
set -euo pipefail
work=$1 case=$2
shift 2
rm -f "$work"/rank[01].*
rail_bytes() {  # bytes through host 0's rail $1, both directions
  echo $(($("$TESTBED" run 0 cat /sys/class/net/rail$1/statistics/tx_bytes) +
    $("$TESTBED" run 0 cat /sys/class/net/rail$1/statistics/rx_bytes)))
}
peer_timeout_ms=2000
[ "$case" = allreduce ] && peer_timeout_ms=30000
"$TESTBED" launch -n 2 --ifname rail -x CHORUS_NCHANNELS=2 -x CHORUS_PEER_TIMEOUT_MS=$peer_timeout_ms \
  -x CHORUS_TIMEOUT_MS=60000 bash "$work/wrap.sh" "$work" "$@" -b 8M -e 8M -n 80 -w 1 -c 1 \
  > "$work/launch.log" 2>&1 &
launcher=$!
# Cut only once both ranks are in the timed loop and both rails carry data.
started=0
for _ in $(seq 1 300); do
  if [ "$started" = 0 ] && grep -q '(elements)' "$work/rank0.log" 2> /dev/null; then
    started=1 r0=$(rail_bytes 0) r1=$(rail_bytes 1)
  fi
  [ "$started" = 1 ] && [ $(($(rail_bytes 0) - r0)) -gt $((8 << 20)) ] &&
    [ $(($(rail_bytes 1) - r1)) -gt $((8 << 20)) ] && break
  kill -0 $launcher 2> /dev/null || break
  sleep 0.2
done
if [ "$started" = 0 ] || ! kill -0 $launcher 2> /dev/null; then
  cat "$work/launch.log" "$work"/rank[01].log 2> /dev/null || true
  echo "FAIL: $case: the ranks did not reach their timed loop with both rails busy"
  kill $launcher 2> /dev/null || true
  exit 1
fi
"$TESTBED" link 1 1 down > /dev/null
after=$(rail_bytes 0)
given_up() { grep -q "is given up, its traffic continues" "$work/rank$1.log" 2> /dev/null; }
for _ in $(seq 1 150); do
  given_up 0 && given_up 1 && break
  kill -0 $launcher 2> /dev/null || break
  sleep 0.2
done
sleep 1  # traffic on rail 0 alone
moved=$(($(rail_bytes 0) - after))
"$TESTBED" link 1 1 up > /dev/null
back=$(rail_bytes 1)
for _ in $(seq 1 400); do kill -0 $launcher 2> /dev/null || break; sleep 0.2; done
if kill -0 $launcher 2> /dev/null; then
  cat "$work"/rank[01].log
  echo "FAIL: $case: still running 80 s after rail 1 went down"
  kill $launcher 2> /dev/null || true
  exit 1
fi
wait $launcher || true
returned=$(($(rail_bytes 1) - back))
for rank in 0 1; do
  rc=missing
  [ -f "$work/rank$rank.end" ] && read -r rc _ < "$work/rank$rank.end"
  msg=$(grep -m1 "is given up, its traffic continues" "$work/rank$rank.log" || true)
  again=$(grep -m1 "works again" "$work/rank$rank.log" || true)
  echo "$case: rank $rank exit $rc: ${msg:-<no failover message>}" | cut -c1-300
  echo "$case: rank $rank: ${again:-<no recovery message>}" | cut -c1-300
  if [ "$rc" != 0 ] || [ -z "$msg" ] || [ -z "$again" ]; then
    cat "$work/rank$rank.log"
    echo "FAIL: $case: rank $rank must finish without error, give the path up, and take it back"
    exit 1
  fi
done
if [ "$case" = allreduce ] && ! grep -q "lost its interface rail1" "$work/rank1.log"; then
  cat "$work/rank1.log"
  echo "FAIL: $case: host 1 did not give rail 1 up for its interface being down"
  exit 1
fi
if [ "$case" = allreduce ] && ! grep -q "rank 1 .* gave up tcp channel 1" "$work/rank0.log"; then
  cat "$work/rank0.log"
  echo "FAIL: $case: host 0 did not follow host 1's word that rail 1 is given up"
  exit 1
fi
grep -E '^ +[0-9]+ ' "$work/rank0.log"
if ! grep -q "Out of bounds values : 0 OK" "$work/rank0.log"; then
  cat "$work/rank0.log"
  echo "FAIL: $case: wrong results after the failover"
  exit 1
fi
echo "$case: rail 0 carried $((moved >> 20)) MiB while rail 1 was down; rail 1 carried" \
  "$((returned >> 20)) MiB after it came back"
[ "$moved" -gt $((16 << 20)) ] || { echo "FAIL: $case: rail 0 carried little after the cut"; exit 1; }
[ "$returned" -gt $((16 << 20)) ] || { echo "FAIL: $case: rail 1 was not used again"; exit 1; }
INNER
# A fresh bed for each case (the inner script takes a rail down).
"$tb" exec --hosts 2 --rails 2 --rate 1gbit -- bash "$work/inner.sh" "$work" allreduce "$allreduce"
"$tb" exec --hosts 2 --rails 2 --rate 1gbit -- bash "$work/inner.sh" "$work" sendrecv "$sendrecv"
echo "failover: both collectives finished, right, over the surviving rail and then both again"
