#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# One binary (examples/allreduce_env, chorusCommInitFromEnv) started the ways clusters start
# ranks, with no unique id handed round: chorus-run; an env:// start by hand (torchrun's
# variables); Open MPI's mpirun; torchrun itself (Debian's python3-torch); Slurm's variables
# by hand (the real srun is tests/launcher/slurm_test.sh's). Every rank must print "right".
# Then what goes wrong: a rank with another job secret, a rank that never starts, no launcher
# at all: each fails within the bootstrap timeout, saying why.
#   env_launch_test.sh <allreduce_env> <chorus-run>
set -uo pipefail
prog=$1
run=$2
work=$(mktemp -d /tmp/chorus-envlaunch-XXXXXX)
trap 'rm -rf "$work"' EXIT
export CHORUS_BOOTSTRAP_TIMEOUT_MS=20000
failures=0
# A port range of its own per run, so two runs of this test on one host keep apart: 24100-31899,
# below the kernel's ephemeral ports (32768 up), which any connection of a test running beside this
# one may hold (CI once saw torchrun's port taken that way), and apart from slurm_test.sh's ports
# (10000-15999) and run_torch_tests.sh's (16200-24099).
base=$((24100 + ($$ % 390) * 20))

fail() {
  echo "FAIL $1"
  failures=$((failures + 1))
}

# expect_right <label> <ranks> <log>: the log holds <ranks> "right" lines and no "WRONG".
expect_right() {
  local n
  n=$(grep -c ' right$' "$3")
  if [ "$n" -ne "$2" ] || grep -q WRONG "$3"; then
    fail "$1: $n of $2 ranks right"
    cat "$3"
  else
    echo "ok   $1: $2 ranks right"
  fi
}

# by_hand <label> <ranks> <started> <per-rank env function>: starts ranks 0..started-1.
by_hand() {
  local label=$1 n=$2 started=$3 envf=$4 r pids=()
  for ((r = 0; r < started; r++)); do
    # shellcheck disable=SC2046
    env $($envf "$r" "$n") timeout 120 "$prog" 20011 > "$work/$label.$r" 2>&1 &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p"; done
  cat "$work/$label".* > "$work/$label.log"
}

env_torch() { echo "RANK=$1 WORLD_SIZE=$2 LOCAL_RANK=$1 MASTER_ADDR=127.0.0.1 MASTER_PORT=$base"; }
env_slurm() {
  echo "SLURM_PROCID=$1 SLURM_NTASKS=$2 SLURM_LOCALID=$1 SLURM_JOB_ID=$$ SLURM_STEP_ID=0" \
    "SLURM_STEP_NODELIST=localhost CHORUS_RENDEZVOUS_PORT=$((base + 2))"
}

timeout 120 "$run" -n 3 "$prog" 20011 > "$work/chorus-run.log" 2>&1
expect_right "chorus-run -n 3" 3 "$work/chorus-run.log"

by_hand env 3 3 env_torch
expect_right "env:// by hand (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT)" 3 "$work/env.log"

by_hand slurm 2 2 env_slurm
expect_right "Slurm's variables by hand (SLURM_STEP_NODELIST=localhost)" 2 "$work/slurm.log"

if command -v mpirun > /dev/null; then
  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout 120 \
    mpirun -n 3 --oversubscribe "$prog" 20011 > "$work/mpirun.log" 2>&1
  expect_right "mpirun -n 3" 3 "$work/mpirun.log"
else
  echo "skip mpirun: not installed"
fi

if /usr/bin/python3 -c 'import torch.distributed.run' 2> /dev/null; then
  # --redirects/--tee 9:1: torch 1.13's defaults fail to parse on Python 3.11.
  timeout 180 /usr/bin/python3 -m torch.distributed.run --nproc_per_node 3 \
    --master_addr 127.0.0.1 --master_port $((base + 4)) --redirects 9:1 --tee 9:1 --no_python \
    "$prog" 20011 > "$work/torchrun.log" 2>&1
  expect_right "torchrun --nproc_per_node 3 --no_python" 3 "$work/torchrun.log"
else
  echo "skip torchrun: Debian's python3-torch is not installed"
fi

# A rank with another secret fails to authenticate; the others give up within the timeout.
export CHORUS_BOOTSTRAP_TIMEOUT_MS=3000
env_secret() { echo "CHORUS_JOB_SECRET=$([ "$1" = 1 ] && echo other || echo ours) $(env_torch "$@" | sed "s/MASTER_PORT=$base/MASTER_PORT=$((base + 6))/")"; }
start=$(date +%s)
by_hand secret 3 3 env_secret
if grep -q "rank 1: authentication failed" "$work/secret.1" && ! grep -q ' right$' "$work/secret.log"; then
  echo "ok   wrong secret: rank 1 says authentication failed, no rank ran"
else
  fail "wrong secret"
  cat "$work/secret.log"
fi

# A rank that never starts: the others stop at the timeout, naming it.
env_missing() { env_torch "$@" | sed "s/MASTER_PORT=$base/MASTER_PORT=$((base + 8))/"; }
by_hand missing 3 2 env_missing
if grep -q "never joined: 2" "$work/missing.log" && ! grep -q ' right$' "$work/missing.log"; then
  echo "ok   missing rank: 'never joined: 2'"
else
  fail "missing rank"
  cat "$work/missing.log"
fi
elapsed=$(($(date +%s) - start))
[ "$elapsed" -lt 60 ] || fail "the failing jobs took ${elapsed} s (bootstrap timeout 3 s)"

# No launcher at all.
if env -u RANK -u WORLD_SIZE -u OMPI_COMM_WORLD_RANK -u SLURM_PROCID -u CHORUS_UNIQUE_ID \
   "$prog" > "$work/none.log" 2>&1; then
  fail "no launcher: the program ran"
elif grep -q "no launcher found in the environment" "$work/none.log"; then
  echo "ok   no launcher: 'no launcher found in the environment'"
else
  fail "no launcher"
  cat "$work/none.log"
fi

[ $failures -eq 0 ] && echo "env launch test: passed" || echo "env launch test: $failures failed"
exit $((failures != 0))
