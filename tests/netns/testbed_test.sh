#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The multi-host test bed (scripts/testbed.sh): 2 hosts x 2 rails, a Chorus job across them
# (ranks on one host over shared memory, across hosts over TCP, each host with its own
# hostname), shaping changed while a job runs, a link taken down and up, background traffic,
# the rollback of a failed `up`, the one-shot `exec`, `cleanup-stale`, and that `down` leaves
# no namespace, mount or state behind.
#   testbed_test.sh TESTBED_SH CHORUS_RUN MP_WORKER [ALL_REDUCE_PERF]
# Exit 77 (skipped) without root, iproute2, nsenter or unshare.
set -uo pipefail
tb=$1
run=$2
worker=$3
perf=${4:-}
if [ "$(id -u)" != 0 ] || ! command -v ip > /dev/null || ! command -v tc > /dev/null ||
  ! command -v nsenter > /dev/null || ! command -v unshare > /dev/null; then
  echo "SKIP: the test bed needs root, iproute2 (ip, tc) and util-linux (nsenter, unshare)"
  exit 77
fi
# Unique names per run (several ctest runs may share the machine); state in a private root.
export TESTBED_STATE_ROOT=/run/testbed
name=ct$$
name2=cu$$
name3=cx$$
export CHORUS_RUN=$run
work=$(mktemp -d)
cleanup() {
  for n in "$name" "$name2" "$name3"; do "$tb" down --name "$n" > /dev/null 2>&1; done
  rm -rf "$work"
}
trap cleanup EXIT
fail() {
  echo "FAIL: $*"
  exit 1
}
leftovers() {  # leftovers NAME: what of bed NAME still exists
  ip netns list | grep -E "^tbed-$1-" || true
  [ ! -e "$TESTBED_STATE_ROOT/$1" ] || echo "state dir $TESTBED_STATE_ROOT/$1"
  grep -F "$TESTBED_STATE_ROOT/$1/" /proc/self/mountinfo || true
}
t0=$(date +%s)

echo "[$SECONDS s] == up: 2 hosts x 2 rails, links at 1gbit"
"$tb" up --name "$name" --hosts 2 --rails 2 --rate 1gbit || fail "up"
[ "$("$tb" run --name "$name" 0 hostname)" = "tbed-$name-h0" ] || fail "host 0's hostname"
[ "$("$tb" run --name "$name" 1 hostname)" = "tbed-$name-h1" ] || fail "host 1's hostname"
[ "$(hostname)" != "tbed-$name-h0" ] || fail "the caller's hostname changed"
"$tb" run --name "$name" 1 ip -br addr show rail1 | grep -q "10.241.0.2/24" || fail "host 1 rail 1 address"

check_job() {  # check_job LOG: 4 ranks, 2 per host, each 1 peer over shm and 2 over tcp
  local log=$1 n
  n=$(grep -c "ready on tbed-$name-h[01]: peers over direct 0, shm 1, tcp 2" "$log")
  [ "$n" = 4 ] || { cat "$log"; fail "expected 4 ranks with 1 shm and 2 tcp peers, got $n"; }
  [ "$(grep -c "ready on tbed-$name-h0:" "$log")" = 2 ] || fail "2 ranks on host 0"
}

echo "[$SECONDS s] == a Chorus job: 4 ranks, 2 per host (block placement), matrix"
CHORUS_DEBUG=INFO "$tb" launch --name "$name" -n 4 --placement block --timeout 120 \
  "$worker" matrix 1000 > "$work/job1.log" 2>&1 || { tail -40 "$work/job1.log"; fail "job 1"; }
check_job "$work/job1.log"
if [ -n "$perf" ]; then
  echo "== all_reduce_perf -c 1, 4 ranks, cyclic placement"
  CHORUS_DEBUG=INFO "$tb" launch --name "$name" -n 4 --timeout 120 \
    "$perf" -b 8 -e 1M -f 32 -n 2 -w 1 -c 1 > "$work/perf.log" 2>&1 ||
    { tail -40 "$work/perf.log"; fail "all_reduce_perf"; }
  check_job "$work/perf.log"
  grep -q "Out of bounds values : 0 OK" "$work/perf.log" || fail "all_reduce_perf results"
fi

echo "[$SECONDS s] == shaping changed while a job runs"
rx0=$("$tb" run --name "$name" 1 cat /sys/class/net/rail0/statistics/rx_bytes)
CHORUS_DEBUG=INFO "$tb" launch --name "$name" -n 4 --placement block --timeout 120 \
  "$worker" matrix 300 > "$work/job2.log" 2>&1 &
job=$!
"$tb" shape --name "$name" 1 0 100mbit --burst 64k --limit 256k || fail "shape"
sleep 0.3
"$tb" shape --name "$name" 1 0 300mbit || fail "reshape"
wait "$job" || { tail -40 "$work/job2.log"; fail "job under shaping"; }
check_job "$work/job2.log"
rx1=$("$tb" run --name "$name" 1 cat /sys/class/net/rail0/statistics/rx_bytes)
[ "$rx1" -gt "$rx0" ] || fail "the job did not cross rail 0"
"$tb" run --name "$name" 1 tc qdisc show dev rail0 | grep -q "tbf.*rate 300Mbit" || fail "host side not shaped"
ip netns exec "tbed-$name-s0" tc qdisc show dev h1 | grep -q "tbf.*rate 300Mbit" || fail "switch side not shaped"
"$tb" unshape --name "$name" 1 0 || fail "unshape"
! "$tb" run --name "$name" 1 tc qdisc show dev rail0 | grep -q tbf || fail "still shaped"

echo "[$SECONDS s] == link down and up"
"$tb" link --name "$name" 1 1 down || fail "link down"
! ip netns exec "tbed-$name-h0" timeout 2 bash -c "exec 3<> /dev/tcp/10.241.0.2/9" 2> /dev/null || fail "rail 1 still carries"
"$tb" link --name "$name" 1 1 up || fail "link up"
out=$(ip netns exec "tbed-$name-h0" timeout 3 bash -c "exec 3<> /dev/tcp/10.241.0.2/9" 2>&1)
[[ "$out" == *refused* ]] || fail "rail 1 does not carry again: $out"
echo "[$SECONDS s] == a job on rail 1 after it came back"
"$tb" launch --name "$name" -n 2 --ifname rail1 --timeout 120 "$worker" matrix 300 \
  > "$work/job3.log" 2>&1 || { tail -40 "$work/job3.log"; fail "job on rail 1"; }

echo "[$SECONDS s] == background traffic on host 0 rail 1, its shaping changed under it"
txbytes() { ip netns exec "tbed-$name-h0" cat /sys/class/net/rail1/statistics/tx_bytes; }
rate_mbit() {  # bits per second sent on host 0 rail 1 over 1 s, in Mbit/s
  local a b
  a=$(txbytes)
  sleep 1
  b=$(txbytes)
  echo $(((b - a) * 8 / 1000000))
}
"$tb" traffic --name "$name" 0 1 start --dir up || fail "traffic start"
sleep 0.5
fast=$(rate_mbit)
"$tb" shape --name "$name" 0 1 100mbit || fail "shape under traffic"
sleep 1
slow=$(rate_mbit)
"$tb" traffic --name "$name" 0 1 stop || fail "traffic stop"
echo "traffic on host 0 rail 1: $fast Mbit/s at 1gbit, $slow Mbit/s after shaping to 100mbit"
[ "$fast" -gt 300 ] || fail "background traffic: only $fast Mbit/s on a 1gbit link"
[ "$slow" -lt 180 ] && [ "$slow" -gt 20 ] || fail "shaped to 100mbit under traffic, $slow Mbit/s"
"$tb" status --name "$name" || fail "status"

echo "[$SECONDS s] == down leaves nothing"
"$tb" down --name "$name" || fail "down"
left=$(leftovers "$name")
[ -z "$left" ] || fail "left behind: $left"

echo "[$SECONDS s] == a failed up rolls back"
TESTBED_TEST_FAIL_UP=1 "$tb" up --name "$name2" --hosts 2 --rails 2 && fail "up should have failed"
left=$(leftovers "$name2")
[ -z "$left" ] || fail "a failed up left: $left"

echo "[$SECONDS s] == exec: up, command, down"
"$tb" exec --name "$name3" --hosts 3 --rails 1 -- \
  bash -c '[ "$TESTBED_NETNS" = "tbed-$TESTBED_NAME-h0,tbed-$TESTBED_NAME-h1,tbed-$TESTBED_NAME-h2" ] &&
           "$TESTBED" run --name "$TESTBED_NAME" 2 hostname | grep -q h2$' || fail "exec"
left=$(leftovers "$name3")
[ -z "$left" ] || fail "exec left: $left"

echo "[$SECONDS s] == cleanup-stale removes a bed whose exec was killed"
"$tb" exec --name "$name3" --hosts 2 --rails 1 -- sleep 60 > /dev/null 2>&1 &
ex=$!
for _ in $(seq 100); do [ -f "$TESTBED_STATE_ROOT/$name3/config" ] && break; sleep 0.1; done
[ -f "$TESTBED_STATE_ROOT/$name3/config" ] || fail "exec bed did not come up"
sleeper=$(pgrep -P "$ex" -x sleep)
kill -KILL "$ex"
wait "$ex" 2> /dev/null
[ -z "$sleeper" ] || kill "$sleeper" 2> /dev/null
[ -n "$(leftovers "$name3")" ] || fail "expected leftovers after kill -9"
"$tb" cleanup-stale || fail "cleanup-stale"
left=$(leftovers "$name3")
[ -z "$left" ] || fail "cleanup-stale left: $left"
echo "testbed: passed in $(($(date +%s) - t0)) s"
