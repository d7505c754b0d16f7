#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The real srun, not its variables set by hand: a private single-machine Slurm (slurmctld,
# slurmd and munged, all configured under one temp dir, on ports of this run's own) starts
# jobs whose ranks find each other with chorusCommInitFromEnv/chorusUniqueIdFromEnv alone:
#   srun -n 4 allreduce_env             every rank prints "right"
#   srun -n 4 all_reduce_perf           nccl-tests' "Out of bounds values : 0 OK"
#   srun -n 2 with CHORUS_JOB_SECRET    the secret reaches every task and they still agree
#   srun -N2 on two slurmd "nodes"      n1, n2 on this one machine (Debian's multiple-slurmd
#                                       build); the library sees one host, which is fine
# Every daemon is stopped by its pid on exit (also on failure or Ctrl-C), and the temp dir goes.
# Skips only when Slurm or munge is not installed.
#   slurm_test.sh <allreduce_env> <all_reduce_perf>
set -uo pipefail
prog=$1
perf=$2
# shellcheck source-path=SCRIPTDIR source=slurm_common.sh
. "$(dirname "${BASH_SOURCE[0]}")/slurm_common.sh"
slurm_require_tools
slurm_setup chorus-slurm

cleanup() {
  slurm_stop
  rm -rf "$work"
}
trap cleanup EXIT
# A signal ends the script through its EXIT trap.
trap 'exit 130' INT
trap 'exit 143' TERM HUP

host=$(hostname -s)
# Ports and job ids of this run's own, so that two runs on one host keep apart: Slurm's ports
# (below the ephemeral range and the other tests' ports), and chorus' rendezvous port, which it
# derives from the job id.
base=$((10000 + ($$ % 1500) * 4))
ctld_port=$base
first_job=$((1000 + ($$ % 100000) * 100))

slurm_start_munge

# The single node is this host under its own name: task 0's node is where chorus listens, so
# SLURM_STEP_NODELIST must name something that resolves. n1 and n2 are two more slurmd on this
# same machine (Debian builds Slurm with --enable-multiple-slurmd), in a partition of their own.
# Clients find the cluster through it; exported only now, so that only Slurm's processes carry it.
export SLURM_CONF=$work/slurm.conf
{
  slurm_conf_common
  cat << EOF
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$((base + 1))
FirstJobId=$first_job
NodeName=$host NodeAddr=127.0.0.1 Port=$((base + 1)) CPUs=2 RealMemory=1000 State=UNKNOWN
NodeName=n[1-2] NodeHostname=$host NodeAddr=127.0.0.1 Port=[$((base + 2))-$((base + 3))] CPUs=2 RealMemory=1000 State=UNKNOWN
PartitionName=ci Nodes=$host Default=YES MaxTime=5 State=UP
PartitionName=multi Nodes=n[1-2] Default=NO MaxTime=5 State=UP
EOF
} > "$SLURM_CONF"

# setsid: a Ctrl-C sent to this script's process group must not stop the daemons before the
# cleanup has ended the jobs through them (setsid execs in place here, so $! is the daemon).
setsid slurmctld -D -f "$SLURM_CONF" > "$work/log/slurmctld.out" 2>&1 &
daemon_pids+=($!)
for node in "$host" n1 n2; do
  setsid slurmd -D -f "$SLURM_CONF" -N "$node" > "$work/log/slurmd.$node.out" 2>&1 &
  daemon_pids+=($!)
done

# Ready when every node is idle.
slurm_wait_idle 3

# Wrong ranks fail fast rather than at srun's time limit.
export CHORUS_BOOTSTRAP_TIMEOUT_MS=20000
# Rank 0 listens on the step's first node, this host's short name: it must resolve.
if ! getent hosts "$host" > /dev/null; then
  echo "note: $host does not resolve; CHORUS_RENDEZVOUS_ADDR=127.0.0.1 for every job"
  export CHORUS_RENDEZVOUS_ADDR=127.0.0.1
fi

job "$work/env4.log" -n 4 --overcommit "$prog" 100003
expect_right "srun -n 4 allreduce_env" 4 "$work/env4.log" $?

job "$work/perf.log" -n 4 --overcommit "$perf" -b 8 -e 1M -f 4
rc=$?
# One world of 4 ranks (4 "Rank N" device lines), not 4 worlds of one.
ranks=$(grep -c '^#  *Rank  *[0-9]' "$work/perf.log")
if [ $rc -eq 0 ] && [ "$ranks" -eq 4 ] && grep -q "Out of bounds values : 0 OK" "$work/perf.log"; then
  echo "ok   srun -n 4 all_reduce_perf: 4 ranks, Out of bounds values : 0 OK"
else
  fail "srun -n 4 all_reduce_perf: exit status $rc, $ranks rank lines of 4"
  cat "$work/perf.log"
fi

# The job secret must reach every task through srun --export: each checks it, then runs the
# program, whose ranks authenticate each other with it.
# shellcheck disable=SC2016  # the task expands it
job "$work/secret.log" -N1 -n 2 --overcommit --export=ALL,CHORUS_JOB_SECRET=abc \
  bash -c '[ "$CHORUS_JOB_SECRET" = abc ] || { echo "CHORUS_JOB_SECRET=${CHORUS_JOB_SECRET-unset}"; exit 1; }; exec "$0" "$@"' \
  "$prog" 20011
expect_right "srun -N1 -n 2 --export=ALL,CHORUS_JOB_SECRET=abc allreduce_env" 2 "$work/secret.log" $?

# Two slurmd "nodes" on this machine: the step's first node, n1, is no host name, so point
# the rendezvous at the loopback address.
# shellcheck disable=SC2016
job "$work/multi.log" -p multi -N 2 --ntasks-per-node=2 --overcommit \
  --export=ALL,CHORUS_RENDEZVOUS_ADDR=127.0.0.1 bash -c 'echo "node $SLURMD_NODENAME task $SLURM_PROCID" >&2; exec "$0" "$@"' \
  "$prog" 100003
rc=$?
nodes=$(grep -o '^node n[12]' "$work/multi.log" | sort -u | wc -l)
[ "$nodes" -eq 2 ] || { fail "srun -N 2: tasks ran on $nodes node(s), not n1 and n2"; cat "$work/multi.log"; }
expect_right "srun -p multi -N 2 --ntasks-per-node=2 allreduce_env (slurmd n1, n2 on one host)" 4 "$work/multi.log" $rc

if [ "$failures" -ne 0 ]; then
  logs
  echo "slurm test: $failures failed"
  exit 1
fi
echo "slurm test: passed"
