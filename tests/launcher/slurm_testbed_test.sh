#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# srun across hosts: a private Slurm on the multi-host test bed (scripts/testbed.sh, one rail),
# one slurmd per test-bed host, each in its host's network and UTS namespaces (NodeName = the
# host's hostname, NodeAddr = its rail-0 address), slurmctld in host 0's, munged here (its unix
# socket is a file, which every namespace reaches). Each host resolves the bed's hostnames to
# their rail addresses through /etc/netns/<host ns>/hosts (what `ip netns exec` mounts on
# /etc/hosts), as a cluster's DNS or /etc/hosts would, so the ranks find task 0's node by its
# name alone:
#   srun -N H -n 2H allreduce_env      every rank prints "right", 2 ranks on each host's hostname;
#                                      CHORUS_DEBUG=INFO: rank 0 listens on host 0's rail
#                                      address, the others join from their hosts' rail
#                                      addresses, every rank sees H hosts, its neighbour over
#                                      shm and the 2(H-1) others over TCP
#   srun -N H -n 2H all_reduce_perf    "Out of bounds values : 0 OK", one world of 2H ranks
#                                      on H hostnames
# Every daemon is stopped by its pid on exit (also on failure or Ctrl-C), then the bed goes
# down and the hosts files and the temp dir are removed. Skips (exit 0) only without Slurm,
# munge, iproute2, util-linux or root.
#   slurm_testbed_test.sh <allreduce_env> <all_reduce_perf> <testbed.sh> [hosts (3)]
set -uo pipefail
prog=$1
perf=$2
testbed=$3
hosts=${4:-3}
# shellcheck source-path=SCRIPTDIR source=slurm_common.sh
. "$(dirname "${BASH_SOURCE[0]}")/slurm_common.sh"
slurm_require_tools ip nsenter unshare tc
slurm_setup chorus-slurm-bed

# A bed of this run's own (names: 1 to 12 of [a-z0-9]).
bed=sl$(($$ % 10000000))
host_ns() { echo "tbed-$bed-h$1"; }
bed_up=
hosts_files=()
made_etc_netns=

cleanup() {
  local d
  slurm_stop
  [ -z "$bed_up" ] || "$testbed" down --name "$bed" > /dev/null 2>&1
  for d in "${hosts_files[@]}"; do
    rm -f "$d/hosts"
    rmdir "$d" 2> /dev/null
  done
  # Only when this run made it, and only when empty: others' files stay.
  [ -z "$made_etc_netns" ] || rmdir /etc/netns 2> /dev/null
  rm -rf "$work"
}
trap cleanup EXIT
# A signal ends the script through its EXIT trap.
trap 'exit 130' INT
trap 'exit 143' TERM HUP

echo "[$SECONDS s] test bed '$bed': $hosts hosts x 1 rail"
bed_up=1
"$testbed" up --name "$bed" --hosts "$hosts" --rails 1 > "$work/log/testbed-up.out" 2>&1 ||
  { cat "$work/log/testbed-up.out"; die "testbed.sh up --name $bed --hosts $hosts --rails 1"; }

# Hosts files (below) of earlier runs killed before their cleanup: their namespaces are gone.
for d in /etc/netns/tbed-sl*-h*; do
  if [ ! -d "$d" ] || [ -e "/run/netns/${d##*/}" ]; then continue; fi
  rm -f "$d/hosts"
  rmdir "$d" 2> /dev/null
done
# Names as a cluster has them: every host's hostname at its rail-0 address, in each host's
# /etc/hosts (ip netns exec bind-mounts /etc/netns/<ns>/hosts there, for every process started
# through it: the daemons, so their jobs, and the clients).
names=$(for ((h = 0; h < hosts; h++)); do echo "10.240.0.$((h + 1)) $(host_ns "$h")"; done)
[ -d /etc/netns ] || made_etc_netns=1
for ((h = 0; h < hosts; h++)); do
  d=/etc/netns/$(host_ns "$h")
  [ ! -e "$d" ] || die "$d exists already (a bed of the same name?)"
  mkdir -p "$d" || die "mkdir $d"
  hosts_files+=("$d")
  printf '127.0.0.1 localhost\n::1 localhost ip6-localhost ip6-loopback\n%s\n' "$names" > "$d/hosts"
done
for ((h = 0; h < hosts; h++)); do
  got=$("$testbed" run --name "$bed" "$h" sh -c "hostname; getent hosts $(host_ns 0) | cut -d' ' -f1")
  [ "$got" = "$(host_ns "$h")"$'\n'10.240.0.1 ] ||
    die "host $h: hostname and the address of $(host_ns 0): $(tr '\n' ' ' <<< "$got"), not $(host_ns "$h") 10.240.0.1"
done

slurm_start_munge

# Every host has its own network namespace, so Slurm's default ports serve every run: no
# other Slurm can be listening in this bed. srun, sinfo, scancel and squeue run in host 0.
slurm_client=("$testbed" run --name "$bed" 0)
export SLURM_CONF=$work/slurm.conf
{
  slurm_conf_common
  cat << EOF
SlurmctldHost=$(host_ns 0)(10.240.0.1)
SlurmctldPort=6817
SlurmdPort=6818
NodeName=tbed-$bed-h[0-$((hosts - 1))] NodeAddr=$(seq -s, -f '10.240.0.%g' 1 "$hosts") CPUs=2 RealMemory=1000 State=UNKNOWN
PartitionName=bed Nodes=tbed-$bed-h[0-$((hosts - 1))] Default=YES MaxTime=5 State=UP
EOF
} > "$SLURM_CONF"
# slurmd runs under `ip netns exec`, whose mount namespace has a fresh /sys without the cgroup
# file systems: the cgroup plugin's autodetection ("No filesystem mounted on /sys/fs/cgroup")
# would stop slurmd. Named, the plugin loads without looking; nothing here uses cgroups
# (proctrack/linuxproc, task/none).
echo "CgroupPlugin=cgroup/v1" > "$work/cgroup.conf"

# setsid: a Ctrl-C sent to this script's process group must not stop the daemons before the
# cleanup has ended the jobs through them. setsid, testbed.sh run, ip netns exec, nsenter and
# env all exec in place: $! is the daemon.
setsid "$testbed" run --name "$bed" 0 slurmctld -D -f "$SLURM_CONF" > "$work/log/slurmctld.out" 2>&1 &
daemon_pids+=($!)
for ((h = 0; h < hosts; h++)); do
  setsid "$testbed" run --name "$bed" "$h" slurmd -D -f "$SLURM_CONF" -N "$(host_ns "$h")" \
    > "$work/log/slurmd.$(host_ns "$h").out" 2>&1 &
  daemon_pids+=($!)
done
slurm_wait_idle "$hosts"
echo "[$SECONDS s] Slurm up: slurmctld on $(host_ns 0), a slurmd on each of $hosts hosts"

# Wrong ranks fail fast rather than at srun's time limit.
export CHORUS_BOOTSTRAP_TIMEOUT_MS=20000
ranks=$((hosts * 2))
tcp_peers=$((ranks - 2))

# per_host <log> <pattern before the hostname>: "h0 h1 ..." counts of lines per host, e.g. "2 2 2".
per_host() {
  local h out=()
  for ((h = 0; h < hosts; h++)); do out+=("$(grep -c "$2$(host_ns "$h")\b" "$1")"); done
  echo "${out[*]}"
}
two_each=$(printf '2 %.0s' $(seq "$hosts"))
two_each=${two_each% }

job "$work/env.log" -N "$hosts" -n "$ranks" env CHORUS_DEBUG=INFO CHORUS_DEBUG_SUBSYS=INIT,BOOTSTRAP \
  "$prog" 100003
rc=$?
expect_right "srun -N $hosts -n $ranks allreduce_env" "$ranks" "$work/env.log" $rc
got=$(per_host "$work/env.log" 'allreduce_env: rank [0-9]* of [0-9]* on ')
[ "$got" = "$two_each" ] || fail "allreduce_env: ranks per host $got, not $two_each"
# The rendezvous: task 0's node by its name, so host 0's rail address; every other rank joins
# from its own host's rail address, none over the loopback.
grep -q "bootstrap root listening on 10\.240\.0\.1:[0-9]* (from the environment)" "$work/env.log" ||
  fail "allreduce_env: no 'bootstrap root listening on 10.240.0.1:... (from the environment)'"
joined=$(grep -o 'rank [0-9]* joined from [0-9.]*' "$work/env.log" | awk '{print $NF}' | sort -V | uniq -c |
  awk '{printf "%s%s x%s", sep, $2, $1; sep=", "}')
# 2 per host (rank 0 too: it joins the root it runs).
want_joined=$(for ((h = 0; h < hosts; h++)); do echo "10.240.0.$((h + 1))"; done |
  awk '{printf "%s%s x2", sep, $1; sep=", "}')
[ "$joined" = "$want_joined" ] || fail "allreduce_env: ranks joined from $joined, not $want_joined"
grep -q 'joined from 127\.' "$work/env.log" && fail "allreduce_env: a rank joined over the loopback"
ready=$(grep -c "ready on tbed-$bed-h[0-9]*: peers over .*shm 1, tcp $tcp_peers;.* $hosts host(s): " "$work/env.log")
[ "$ready" -eq "$ranks" ] ||
  fail "allreduce_env: $ready of $ranks ranks ready with 1 peer over shm, $tcp_peers over tcp, $hosts hosts"
got=$(per_host "$work/env.log" 'ready on ')
[ "$got" = "$two_each" ] || fail "allreduce_env: 'ready on' lines per host $got, not $two_each"
if [ $failures -eq 0 ]; then
  echo "ok   ranks on $hosts hosts ($two_each), root on 10.240.0.1, joined from $joined, each rank: shm 1, tcp $tcp_peers"
else
  grep -E 'listening|joined from|ready on' "$work/env.log"
fi

# rail_bytes: "tx rx" bytes of every host's rail0 so far.
rail_bytes() {
  local h
  for ((h = 0; h < hosts; h++)); do
    "$testbed" run --name "$bed" "$h" cat /sys/class/net/rail0/statistics/tx_bytes /sys/class/net/rail0/statistics/rx_bytes
  done | paste -sd' '
}
before=$(rail_bytes)
job "$work/perf.log" -N "$hosts" -n "$ranks" "$perf" -b 8 -e 1M -f 4
rc=$?
after=$(rail_bytes)
# The TCP transport's traffic went over the rails: every host sent and received over 1 MB
# on its rail0 during the job (about 40 MB at 3 hosts).
moved=$(paste -d' ' <(tr ' ' '\n' <<< "$after") <(tr ' ' '\n' <<< "$before") |
  awk '{printf "%s%d", (NR > 1 ? " " : ""), ($1 - $2) / 1000000}')
# shellcheck disable=SC2086
low=$(printf '%s\n' $moved | awk '$1 < 1' | wc -l)
# One world of 2H ranks (2H "Rank N" device lines), on H hosts.
nrank=$(grep -c '^#  *Rank  *[0-9]' "$work/perf.log")
got=$(per_host "$work/perf.log" '^#  *Rank  *[0-9]* .*')
if [ $rc -eq 0 ] && [ "$nrank" -eq "$ranks" ] && [ "$got" = "$two_each" ] && [ "$low" -eq 0 ] &&
  grep -q "Out of bounds values : 0 OK" "$work/perf.log"; then
  echo "ok   srun -N $hosts -n $ranks all_reduce_perf: $ranks ranks ($got per host), Out of bounds values : 0 OK;" \
    "MB over rail0 per host (tx rx): $moved"
else
  fail "srun -N $hosts -n $ranks all_reduce_perf: exit status $rc, $nrank rank lines of $ranks, per host $got," \
    "MB over rail0 per host (tx rx): $moved (each should be 1 or more)"
  cat "$work/perf.log"
fi

if [ "$failures" -ne 0 ]; then
  logs
  echo "slurm test bed test: $failures failed"
  exit 1
fi
echo "[$SECONDS s] slurm test bed test: passed"
