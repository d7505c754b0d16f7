#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# A host that vanishes without closing its sockets (issue 12, section 4: power loss, a pulled
# cable): on the test bed, every link of host 1 is taken down at once in the middle of a loop of
# collectives. Both ranks must fail with an error naming the other one within
# CHORUS_PEER_TIMEOUT_MS (4 s here) plus slack, not at the 300 s operation timeout:
#   - AllReduce: both ranks have sent data that is never acknowledged (Connection::check_alive);
#   - Broadcast from rank 1: rank 0 only receives, so nothing of its own is unacknowledged and
#     TCP keepalive must notice the silence (net::set_keepalive).
# Each rank runs under a wrapper that records its exit status, its end time and its output, and
# exits 0, so that chorus-run does not stop the other rank when the first one fails: each rank's
# own detection is what is checked.
#   host_loss_test.sh TESTBED_SH CHORUS_RUN ALL_REDUCE_PERF BROADCAST_PERF
# Exit 77 (skipped) without root, iproute2, nsenter or unshare.
set -euo pipefail
tb=$1
export CHORUS_RUN=$2
allreduce=$3
broadcast=$4
# shellcheck source=tests/netns/lib.sh
. "$(dirname "$0")/lib.sh"
netns_require
netns_rank_workdir
cat > "$work/inner.sh" << 'INNER'
set -euo pipefail
work=$1 case=$2
shift 2
tool=("$@")
limit_s=15  # CHORUS_PEER_TIMEOUT_MS=4000, checked every 100 ms; generous for a loaded machine
rm -f "$work"/rank[01].*
"$TESTBED" launch -n 2 --ifname rail -x CHORUS_PEER_TIMEOUT_MS=4000 -x CHORUS_TIMEOUT_MS=300000 \
  bash "$work/wrap.sh" "$work" "${tool[@]}" -b 4M -e 4M -n 2000 -w 1 -c 0 > "$work/launch.log" 2>&1 &
launcher=$!
# Cut host 1 off only once both ranks are in the timed loop: rank 0 has printed the table's
# header (every rank joined and set up) and bytes flow on host 0's rails. A cut before that
# would test bootstrap instead (whose own bound, CHORUS_BOOTSTRAP_TIMEOUT_MS, is 120 s).
rail_bytes() {
  local sum=0 r
  for r in $(seq 0 $((TESTBED_RAILS - 1))); do
    sum=$((sum + $("$TESTBED" run 0 cat /sys/class/net/rail$r/statistics/tx_bytes) +
      $("$TESTBED" run 0 cat /sys/class/net/rail$r/statistics/rx_bytes)))
  done
  echo "$sum"
}
started=0
for _ in $(seq 1 300); do  # 60 s: setup is slow on a loaded machine
  if [ "$started" = 0 ] && grep -q '(elements)' "$work/rank0.log" 2> /dev/null; then
    started=$(rail_bytes)
  fi
  [ "$started" != 0 ] && [ $(($(rail_bytes) - started)) -gt $((64 << 20)) ] && break
  if ! kill -0 $launcher 2> /dev/null; then break; fi
  sleep 0.2
done
if [ "$started" = 0 ] || ! kill -0 $launcher 2> /dev/null; then
  cat "$work/launch.log" "$work"/rank[01].log 2> /dev/null || true
  echo "FAIL: $case: the ranks did not reach their timed loop (or ended before the cut)"
  kill $launcher 2> /dev/null || true
  exit 1
fi
cut=$(date +%s%N)
for r in $(seq 0 $((TESTBED_RAILS - 1))); do "$TESTBED" link 1 "$r" down > /dev/null; done
# Each rank must end within limit_s; a rank that hangs is reported here, with its output,
# rather than by the test's own timeout.
for _ in $(seq 1 $((limit_s * 2 * 5))); do
  kill -0 $launcher 2> /dev/null || break
  sleep 0.2
done
if kill -0 $launcher 2> /dev/null; then
  for rank in 0 1; do
    [ -f "$work/rank$rank.end" ] || { echo "rank $rank still running; its output:"; cat "$work/rank$rank.log"; }
  done
  echo "FAIL: $case: a rank was still running $((limit_s * 2)) s after the cut"
  kill $launcher 2> /dev/null || true
  exit 1
fi
wait $launcher || true
for rank in 0 1; do
  peer=$((1 - rank))
  if [ ! -f "$work/rank$rank.end" ]; then
    cat "$work/launch.log" "$work/rank$rank.log" 2> /dev/null || true
    echo "FAIL: $case: rank $rank did not finish"; exit 1
  fi
  read -r rc end < "$work/rank$rank.end"
  took_ms=$(((end - cut) / 1000000))
  msg=$(grep -m1 -E "rank $peer .*(acknowledged none|stopped answering)" "$work/rank$rank.log" || true)
  echo "$case: rank $rank exit $rc after $took_ms ms: ${msg:-<no message>}" | cut -c1-400
  if [ "$rc" = 0 ] || [ -z "$msg" ] || [ "$took_ms" -gt $((limit_s * 1000)) ]; then
    cat "$work/rank$rank.log"
    echo "FAIL: $case: rank $rank must fail within ${limit_s} s naming rank $peer as unreachable"
    exit 1
  fi
done
INNER
# A fresh bed for each case (the inner script takes every rail of host 1 down).
"$tb" exec --hosts 2 --rails 2 --rate 1gbit -- bash "$work/inner.sh" "$work" allreduce "$allreduce"
"$tb" exec --hosts 2 --rails 2 --rate 1gbit -- bash "$work/inner.sh" "$work" broadcast "$broadcast" -r 1
echo "host_loss: both ranks named the vanished peer within the bound"
