# SPDX-License-Identifier: Apache-2.0
# shellcheck shell=bash
# Helpers for the tests that start a private Slurm (slurm_test.sh, slurm_testbed_test.sh):
# sourced, not run. They keep their state in these variables:
#   work          the temp dir of the run (slurm_setup makes it): munge/, state/, spool/, log/
#   slurm_client  a command prefix that runs Slurm's clients (srun, sinfo, scancel, squeue)
#                 where slurmctld can be reached; empty: here
#   daemon_pids   $! of every daemon started in the background, in case its pid file never appears
#   srun_pid      the srun (its timeout) of the job now running
#   failures      how many checks failed (fail)

# slurm_require_tools [tool...]: "skip: ..." and exit 0 unless Slurm, munge, the given tools
# and root are there.
# shellcheck disable=SC2120  # the tools beyond Slurm's are optional
slurm_require_tools() {
  local tool
  for tool in slurmctld slurmd srun sinfo scontrol scancel squeue munged munge unmunge runuser "$@"; do
    if ! command -v "$tool" > /dev/null; then
      echo "skip: $tool is not installed (apt-get install slurmctld slurmd slurm-client munge iproute2 util-linux)"
      exit 0
    fi
  done
  [ "$(id -u)" -eq 0 ] || { echo "skip: needs root (the daemons run as root and munge)"; exit 0; }
}

# slurm_setup <prefix>: the temp dir and the variables above. Run inside a Slurm job, srun
# would join that job (SLURM_JOB_ID...) instead of starting one here: Slurm's variables go.
slurm_setup() {
  local v
  while read -r v; do unset "$v"; done < <(compgen -e | grep -E '^(SLURM|SRUN|SALLOC|SBATCH)_')
  work=$(mktemp -d "/tmp/$1-XXXXXX")
  # munged runs as munge and must reach its socket dir below this one.
  chmod 0755 "$work"
  mkdir -p "$work/munge" "$work/state" "$work/spool" "$work/log"
  slurm_client=()
  daemon_pids=()
  srun_pid=
  failures=0
}

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

# slurm_stop: ends the jobs, stops every daemon by its pid and whatever of the jobs is left;
# leaves $work (the caller removes it). Runs from an EXIT trap: ignores further signals.
slurm_stop() {
  local left i
  # A second Ctrl-C must not cut the cleanup short.
  trap '' INT TERM HUP
  trap - EXIT
  [ -n "$srun_pid" ] && stop "$srun_pid"
  # Tasks run under slurmstepd, which outlives slurmd: end the jobs while slurmctld still runs.
  if [ -f "$work/slurmctld.pid" ] && kill -0 "$(cat "$work/slurmctld.pid")" 2> /dev/null; then
    timeout 5 "${slurm_client[@]}" scancel --quiet --user=root 2> /dev/null
    for ((i = 0; i < 50; i++)); do
      [ -z "$(timeout 5 "${slurm_client[@]}" squeue -h -o %i 2> /dev/null)" ] && break
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
}

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

fail() {
  echo "FAIL $1"
  failures=$((failures + 1))
}

# slurm_start_munge: a private munged with its own key, socket, pid, log and seed; sets $sock.
slurm_start_munge() {
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
}

# slurm_conf_common: the lines of slurm.conf that do not depend on the nodes (the caller adds
# SlurmctldHost, the ports, FirstJobId, NodeName and PartitionName lines).
slurm_conf_common() {
  cat << EOF
ClusterName=chorusci
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
StateSaveLocation=$work/state
SlurmdSpoolDir=$work/spool/%n
SlurmctldPidFile=$work/slurmctld.pid
SlurmdPidFile=$work/slurmd.%n.pid
SlurmctldLogFile=$work/log/slurmctld.log
SlurmdLogFile=$work/log/slurmd.%n.log
MailProg=/bin/true
EOF
}

# slurm_wait_idle <nodes>: until sinfo shows <nodes> idle nodes (about a second); bounded (30 s),
# and a daemon that exits early ends the wait at once.
slurm_wait_idle() {
  local i p states=
  for ((i = 0; i < 300; i++)); do
    for p in "${daemon_pids[@]}"; do
      kill -0 "$p" 2> /dev/null || { cat "$work"/log/*.out; die "a Slurm daemon (pid $p) exited while starting"; }
    done
    states=$(timeout 5 "${slurm_client[@]}" sinfo -h -N -o '%N %t' 2> /dev/null | sort -u)
    [ "$(grep -c ' idle$' <<< "$states")" -eq "$1" ] && return 0
    sleep 0.1
  done
  die "the nodes were not idle within 30 s (sinfo: $(tr '\n' ' ' <<< "${states:-nothing}"))"
}

# job <log> <srun options and program...>: srun in the background so that a signal is
# handled at once; -t 2 (minutes) and timeout bound it twice.
job() {
  local log=$1 rc
  shift
  timeout 90 "${slurm_client[@]}" srun -t 2 --kill-on-bad-exit=1 "$@" > "$log" 2>&1 &
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
