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
for tool in slurmctld slurmd srun sinfo scontrol scancel munged munge unmunge runuser; do
  if ! command -v "$tool" > /dev/null; then
    echo "skip: $tool is not installed (apt-get install slurmctld slurmd slurm-client munge)"
    exit 0
  fi
done
[ "$(id -u)" -eq 0 ] || { echo "skip: needs root (the daemons run as root and munge)"; exit 0; }

# Run inside a Slurm job, srun would join that job (SLURM_JOB_ID...) instead of starting one here.
while read -r v; do unset "$v"; done < <(compgen -e | grep -E '^(SLURM|SRUN|SALLOC|SBATCH)_')

work=$(mktemp -d /tmp/chorus-slurm-XXXXXX)
# munged runs as munge and must reach its socket dir below this one.
chmod 0755 "$work"
mkdir -p "$work/munge" "$work/state" "$work/spool" "$work/log"
daemon_pids=()  # $! of every daemon started in the background, in case its pid file never appears
srun_pid=

# stop <pid>...: TERM, then KILL whatever is still there after 10 s.
stop() {
  local p i alive
  [ $# -gt 0 ] || return 0
  kill -TERM "$@" 2> /dev/null
  for ((i = 0; i < 100; i++)); do
    alive=0
    for p in "$@"; do kill -0 "$p" 2> /dev/null && alive=1; done
    [ $alive -eq 0 ] && return 0
    sleep 0.1
  done
  kill -KILL "$@" 2> /dev/null
}

pids_of() {  # the pids in the pid files that exist, and the bare pids, given
  local f
  for f in "$@"; do
    if [ -f "$f" ]; then cat "$f"; elif [[ "$f" =~ ^[0-9]+$ ]]; then echo "$f"; fi
  done | sort -u
}

# Processes of this run's Slurm that outlived their daemons (slurmstepd, tasks): the only ones
# whose environment names this run's slurm.conf. Call it with SLURM_CONF no longer exported,
# so that grep does not find itself.
strays() {
  local f p
  while read -r f; do
    p=${f#/proc/}
    echo "${p%%/*}"
  done < <(grep -lzx "SLURM_CONF=$work/slurm.conf" /proc/[0-9]*/environ 2> /dev/null)
}

cleanup() {
  local left
  # A second Ctrl-C must not cut the cleanup short.
  trap '' INT TERM HUP
  trap - EXIT
  [ -n "$srun_pid" ] && stop "$srun_pid"
  # Tasks run under slurmstepd, which outlives slurmd: end the jobs while slurmctld still runs.
  if [ -f "$work/slurmctld.pid" ] && kill -0 "$(cat "$work/slurmctld.pid")" 2> /dev/null; then
    timeout 5 scancel --quiet --user=root 2> /dev/null
    for ((i = 0; i < 50; i++)); do
      [ -z "$(timeout 5 squeue -h -o %i 2> /dev/null)" ] && break
      sleep 0.1
    done
  fi
  # shellcheck disable=SC2046
  stop $(pids_of "$work"/slurmd.*.pid "${daemon_pids[@]}")
  # shellcheck disable=SC2046
  stop $(pids_of "$work/slurmctld.pid")
  export -n SLURM_CONF 2> /dev/null
  left=$(strays)
  if [ -n "$left" ]; then
    echo "cleanup: stopping $(wc -w <<< "$left") leftover process(es) of this run's jobs"
    # shellcheck disable=SC2086
    stop $left
  fi
  # shellcheck disable=SC2046
  stop $(pids_of "$work/munge/munged.pid")
  rm -rf "$work"
}
trap cleanup EXIT
# A signal ends the script through its EXIT trap.
trap 'exit 130' INT
trap 'exit 143' TERM HUP

logs() {
  local f
  for f in "$work"/munge/munged.log "$work"/log/*.log "$work"/log/*.out; do
    [ -s "$f" ] || continue
    echo "---- ${f#"$work"/} (last 25 lines)"
    tail -n 25 "$f"
  done
}

die() {
  echo "FAIL $1"
  logs
  echo "slurm test: failed"
  exit 1
}

host=$(hostname -s)
# Ports and job ids of this run's own, so that two runs on one host keep apart: Slurm's ports
# (below the ephemeral range and the other tests' ports), and chorus' rendezvous port, which it
# derives from the job id.
base=$((10000 + ($$ % 1500) * 4))
ctld_port=$base
first_job=$((1000 + ($$ % 100000) * 100))

# munge: a private munged with its own key, socket, pid, log and seed.
sock=$work/munge/munge.sock
dd if=/dev/urandom of="$work/munge/munge.key" bs=1024 count=1 status=none
chown -R munge:munge "$work/munge"
chmod 0755 "$work/munge"  # 0700 fails: munged wants the socket dir searchable by all
chmod 0400 "$work/munge/munge.key"
# munged forks once its socket is up, and writes its pid file before that.
if ! runuser -u munge -- munged --socket="$sock" --key-file="$work/munge/munge.key" \
  --pid-file="$work/munge/munged.pid" --log-file="$work/munge/munged.log" \
  --seed-file="$work/munge/munged.seed" > "$work/log/munged.out" 2>&1; then
  cat "$work/log/munged.out"
  die "munged did not start"
fi
munge -S "$sock" -n | unmunge -S "$sock" > "$work/log/unmunge.out" 2>&1 ||
  { cat "$work/log/unmunge.out"; die "munge credential round trip through $sock"; }

# The single node is this host under its own name: task 0's node is where chorus listens, so
# SLURM_STEP_NODELIST must name something that resolves. n1 and n2 are two more slurmd on this
# same machine (Debian builds Slurm with --enable-multiple-slurmd), in a partition of their own.
# Clients find the cluster through it; exported only now, so that only Slurm's processes carry it.
export SLURM_CONF=$work/slurm.conf
cat > "$SLURM_CONF" << EOF
ClusterName=chorusci
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$((base + 1))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$sock
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
MpiDefault=none
SwitchType=switch/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
ReturnToService=2
SlurmdParameters=config_overrides
FirstJobId=$first_job
StateSaveLocation=$work/state
SlurmdSpoolDir=$work/spool/%n
SlurmctldPidFile=$work/slurmctld.pid
SlurmdPidFile=$work/slurmd.%n.pid
SlurmctldLogFile=$work/log/slurmctld.log
SlurmdLogFile=$work/log/slurmd.%n.log
MailProg=/bin/true
NodeName=$host NodeAddr=127.0.0.1 Port=$((base + 1)) CPUs=2 RealMemory=1000 State=UNKNOWN
NodeName=n[1-2] NodeHostname=$host NodeAddr=127.0.0.1 Port=[$((base + 2))-$((base + 3))] CPUs=2 RealMemory=1000 State=UNKNOWN
PartitionName=ci Nodes=$host Default=YES MaxTime=5 State=UP
PartitionName=multi Nodes=n[1-2] Default=NO MaxTime=5 State=UP
EOF

# setsid: a Ctrl-C sent to this script's process group must not stop the daemons before the
# cleanup has ended the jobs through them (setsid execs in place here, so $! is the daemon).
setsid slurmctld -D -f "$SLURM_CONF" > "$work/log/slurmctld.out" 2>&1 &
daemon_pids+=($!)
for node in "$host" n1 n2; do
  setsid slurmd -D -f "$SLURM_CONF" -N "$node" > "$work/log/slurmd.$node.out" 2>&1 &
  daemon_pids+=($!)
done

# Ready when every node is idle (about a second here); bounded, and a daemon that exits early
# ends the wait at once.
ready=0
for ((i = 0; i < 300; i++)); do
  for p in "${daemon_pids[@]}"; do
    kill -0 "$p" 2> /dev/null || { cat "$work"/log/*.out; die "a Slurm daemon (pid $p) exited while starting"; }
  done
  states=$(timeout 5 sinfo -h -N -o '%N %t' 2> /dev/null | sort -u)
  if [ "$(grep -c ' idle$' <<< "$states")" -eq 3 ]; then
    ready=1
    break
  fi
  sleep 0.1
done
[ $ready -eq 1 ] || die "the nodes were not idle within 30 s (sinfo: $(tr '\n' ' ' <<< "${states:-nothing}"))"

failures=0
fail() {
  echo "FAIL $1"
  failures=$((failures + 1))
}
# Wrong ranks fail fast rather than at srun's time limit.
export CHORUS_BOOTSTRAP_TIMEOUT_MS=20000
# Rank 0 listens on the step's first node, this host's short name: it must resolve.
if ! getent hosts "$host" > /dev/null; then
  echo "note: $host does not resolve; CHORUS_RENDEZVOUS_ADDR=127.0.0.1 for every job"
  export CHORUS_RENDEZVOUS_ADDR=127.0.0.1
fi

# job <log> <srun options and program...>: srun in the background so that a signal is
# handled at once; -t 2 (minutes) and timeout bound it twice.
job() {
  local log=$1 rc
  shift
  timeout 90 srun -t 2 --kill-on-bad-exit=1 "$@" > "$log" 2>&1 &
  srun_pid=$!
  wait $srun_pid
  rc=$?
  srun_pid=
  return $rc
}

# expect_right <label> <ranks> <log> <rc>: srun exited 0 and printed <ranks> "right" lines.
expect_right() {
  local n
  n=$(grep -c ' right$' "$3")
  if [ "$4" -ne 0 ] || [ "$n" -ne "$2" ] || grep -q WRONG "$3"; then
    fail "$1: exit status $4, $n of $2 ranks right"
    cat "$3"
  else
    echo "ok   $1: $2 ranks right"
  fi
}

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

if [ $failures -ne 0 ]; then
  logs
  echo "slurm test: $failures failed"
  exit 1
fi
echo "slurm test: passed"
