#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
#
# Runs the Chorus torch.distributed backend tests under torchrun, 3 ranks each:
#   collectives_test.py  every collective x dtype x op vs gloo / a local reference
#   ddp_test.py          DDP training (plain and with allreduce_hook) matches gloo, ranks bit-identical
#   hooks_test.py        chorus_torch.hooks: overlap_hook equals plain DDP, fp8_hook stays close
#   dead_rank_test.py    a dead rank becomes a prompt RuntimeError naming it
#   silent_rank_test.py  a live rank that stops calling: the group's timeout ends the wait, naming it
#   init_methods_test.py tcp:// and file:// bootstrap (plain processes, no torchrun)
#   ep_test.py           chorus_torch.ep.Buffer (MoE dispatch/combine, normal and low-latency) vs a
#                        reference, 2 and 4 ranks
#   examples/moe_layer.py the example MoE layer matches its dense computation (NPROC ranks), in
#                        normal and low-latency (--low-latency) mode
# Prints "ok <test>" or "FAIL <test>" per test and exits non-zero if any failed.
#
# Usage: tests/torch/run_torch_tests.sh <build-dir>
#   env CHORUS_TORCH_BACKEND_UNDER_TEST=gloo  run against gloo alone (develops the tests without the
#                                             chorus backend; then <build-dir>/bindings/torch need not exist)
#   env NPROC=3 (ranks), TEST_TIMEOUT=240 (seconds per test), KEEP_LOGS=1 (print log dir)
# Skips (exit 0, "skip: ...") only when /usr/bin/python3 cannot import torch, or (chorus mode) when
# <build-dir>/bindings/torch/chorus_torch does not exist.
#
# torchrun is launched as `/usr/bin/python3 -m torch.distributed.run` (the Debian torch lives there,
# not in the python3 on PATH) with `--redirects 9:1 --tee 9:1`, which dodges torchrun's Python 3.11
# crash in Std.from_str (pytorch#92319): a mapping for a non-existent local rank leaves all real ranks
# un-redirected.
set -u

BUILD=${1:-}
if [ -z "$BUILD" ]; then
    echo "usage: $0 <build-dir>" >&2
    exit 2
fi
BUILD=$(cd "$BUILD" 2>/dev/null && pwd || echo "$BUILD")
HERE=$(cd "$(dirname "$0")" && pwd)
PY=/usr/bin/python3
UT=${CHORUS_TORCH_BACKEND_UNDER_TEST:-chorus}
NPROC=${NPROC:-3}
TEST_TIMEOUT=${TEST_TIMEOUT:-240}

if ! "$PY" -c 'import torch, torch.distributed' >/dev/null 2>&1; then
    echo "skip: $PY cannot import torch"
    exit 0
fi
if [ "$UT" = chorus ] && [ ! -e "$BUILD/bindings/torch/chorus_torch" ] \
        && ! ls "$BUILD"/bindings/torch/chorus_torch*.so >/dev/null 2>&1; then
    echo "skip: $BUILD/bindings/torch/chorus_torch does not exist (chorus torch backend not built)"
    exit 0
fi

export PYTHONPATH="$BUILD/bindings/torch${PYTHONPATH:+:$PYTHONPATH}"
export CHORUS_TORCH_BACKEND_UNDER_TEST="$UT"
LOGDIR=$(mktemp -d "${TMPDIR:-/tmp}/chorus-torch-tests.XXXXXX")

# A free TCP port near a base derived from our pid, so concurrent runs on one host don't collide.
free_port() {
    "$PY" - "$1" <<'PYEOF'
import socket, sys
base = int(sys.argv[1])
# 16200-24099: below the kernel's ephemeral ports (32768 up), which a connection could take between
# this check and torchrun's bind, and apart from the launcher tests' ports.
for p in list(range(base, 24100)) + list(range(16200, base)):
    # torchrun needs the port itself; the workers' gloo/chorus listeners use ephemeral ports.
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", p))
        print(p)
        break
    except OSError:
        pass
    finally:
        s.close()
PYEOF
}
PORT_BASE=$((16200 + ($$ * 7) % 7900))

run_torchrun() {  # <log> <script> [args...]
    local log=$1 script=$2
    shift 2
    local port
    port=$(free_port "$PORT_BASE")
    PORT_BASE=$((port + 1))
    timeout -k 10 "$TEST_TIMEOUT" "$PY" -m torch.distributed.run --nproc_per_node "$NPROC" \
        --redirects 9:1 --tee 9:1 --master_addr 127.0.0.1 --master_port "$port" \
        "$HERE/$script" --backend-under-test "$UT" "$@" >"$log" 2>&1
}

# Count distinct ranks that printed a success line.  Matched anywhere in a line (grep -o), not at its
# start: the ranks share torchrun's stdout, and one rank's line can land glued onto another's.
count_ok() {  # <log> <regex ending in 'rank '>
    grep -o "$2[0-9]*" "$1" | sort -u | wc -l
}

FAILED=0
report() {  # <name> <ok:0|1> <log> [why]
    if [ "$2" = 0 ]; then
        echo "ok   $1"
    else
        echo "FAIL $1${4:+ ($4)}"
        echo "---- failures reported in $3:"
        grep -o -E '(MISMATCH|EXCEPTION|WATCHDOG|dead rank test: FAIL|silent rank test: FAIL|moe_layer: TOO LARGE|ddp test: [0-9]+ FAIL|init methods test: FAIL|\[rank [0-9]+\] FAIL)[^[]*' "$3" \
            | sort -u | head -60
        echo "---- last lines of $3:"
        grep -v -e 'UserWarning' -e '^  warnings.warn' "$3" | tail -15
        echo "----"
        FAILED=1
    fi
}

echo "torch tests: backend under test '$UT', $NPROC ranks, build $BUILD, logs in $LOGDIR"

# collectives: every rank must print its final line, and torchrun must exit 0
log=$LOGDIR/collectives.log
run_torchrun "$log" collectives_test.py; rc=$?
n=$(count_ok "$log" 'collectives test: [0-9]* checks passed on rank ')
if [ $rc = 0 ] && [ "$n" = "$NPROC" ]; then report collectives_test 0 "$log"; grep -o 'collectives test: [0-9]* checks passed on rank 0 ([^)]*)' "$log" | head -1
else report collectives_test 1 "$log" "rc=$rc, $n/$NPROC ranks passed"; fi

log=$LOGDIR/ddp.log
run_torchrun "$log" ddp_test.py; rc=$?
n=$(count_ok "$log" 'ddp test: OK on rank ')
if [ $rc = 0 ] && [ "$n" = "$NPROC" ]; then report ddp_test 0 "$log"
else report ddp_test 1 "$log" "rc=$rc, $n/$NPROC ranks OK"; fi

# Chorus's DDP hooks (overlap scheduler, FP8) against plain DDP on the same group.
if [ "$UT" = chorus ]; then
    log=$LOGDIR/hooks.log
    run_torchrun "$log" hooks_test.py; rc=$?
    n=$(count_ok "$log" 'hooks test: OK on rank ')
    if [ $rc = 0 ] && [ "$n" = "$NPROC" ]; then report hooks_test 0 "$log"; grep -h '\[rank 0\] \(overlap_hook\|fp8_hook\)' "$log"
    else report hooks_test 1 "$log" "rc=$rc, $n/$NPROC ranks OK"; fi
fi

# MoE dispatch/combine (chorus_torch.ep), at 2 and 4 ranks whatever NPROC is, and the example layer.
if [ "$UT" = chorus ]; then
    for ranks in 2 4; do
        log=$LOGDIR/ep_$ranks.log
        NPROC=$ranks run_torchrun "$log" ep_test.py; rc=$?
        n=$(count_ok "$log" 'ep test: OK on rank ')
        if [ $rc = 0 ] && [ "$n" = "$ranks" ]; then report "ep_test ($ranks ranks)" 0 "$log"
        else report "ep_test ($ranks ranks)" 1 "$log" "rc=$rc, $n/$ranks ranks OK"; fi
    done
    for mode in "" --low-latency; do
        name="examples/moe_layer.py${mode:+ $mode}"
        log=$LOGDIR/moe_layer${mode:+_ll}.log
        port=$(free_port "$PORT_BASE")
        PORT_BASE=$((port + 1))
        timeout -k 10 "$TEST_TIMEOUT" "$PY" -m torch.distributed.run --nproc_per_node "$NPROC" \
            --redirects 9:1 --tee 9:1 --master_addr 127.0.0.1 --master_port "$port" \
            "$HERE/../../examples/moe_layer.py" ${mode:+"$mode"} >"$log" 2>&1; rc=$?
        n=$(count_ok "$log" 'moe_layer: OK on rank ')
        if [ $rc = 0 ] && [ "$n" = "$NPROC" ]; then report "$name" 0 "$log"; grep -o 'moe_layer: OK on rank 0 [^)]*)' "$log"
        else report "$name" 1 "$log" "rc=$rc, $n/$NPROC ranks OK"; fi
    done
fi

# dead rank: torchrun's exit status reflects the deliberate death, so judge by the survivors' lines.
if [ "$NPROC" -ge 3 ]; then
    log=$LOGDIR/dead_rank.log
    run_torchrun "$log" dead_rank_test.py; rc=$?
    n=$(count_ok "$log" 'dead rank test: OK on rank ')
    if [ "$n" = $((NPROC - 1)) ]; then report dead_rank_test 0 "$log"; grep -h 'RuntimeError after' "$log" | head -1
    else report dead_rank_test 1 "$log" "$n/$((NPROC - 1)) survivors OK, torchrun rc=$rc"; fi
    # silent rank: alive but not calling; the group's timeout (4 s) must end the others' wait.
    log=$LOGDIR/silent_rank.log
    run_torchrun "$log" silent_rank_test.py; rc=$?
    n=$(count_ok "$log" 'silent rank test: OK on rank ')
    if [ "$n" = $((NPROC - 1)) ]; then report silent_rank_test 0 "$log"; grep -h 'RuntimeError after' "$log" | head -1
    else report silent_rank_test 1 "$log" "$n/$((NPROC - 1)) survivors OK, torchrun rc=$rc"; fi
else
    echo "skip dead_rank_test, silent_rank_test (need >= 3 ranks)"
fi

# tcp:// and file:// init: NPROC plain processes with explicit --rank/--world-size (torchrun would
# only ever exercise env://).
run_plain() {  # <log> <init-method>
    local log=$1 method=$2 pids=() r rc=0
    : >"$log"
    for r in $(seq 0 $((NPROC - 1))); do
        timeout -k 10 "$TEST_TIMEOUT" "$PY" "$HERE/init_methods_test.py" --backend-under-test "$UT" \
            --init-method "$method" --rank "$r" --world-size "$NPROC" >>"$log" 2>&1 &
        pids+=($!)
    done
    for r in "${pids[@]}"; do wait "$r" || rc=1; done
    return $rc
}
port=$(free_port "$PORT_BASE")
for method in "tcp://127.0.0.1:$port" "file://$LOGDIR/filestore"; do
    name="init_methods_test ${method%%://*}://"
    log=$LOGDIR/init_${method%%://*}.log
    run_plain "$log" "$method"; rc=$?
    n=$(count_ok "$log" 'init methods test: OK on rank ')
    if [ $rc = 0 ] && [ "$n" = "$NPROC" ]; then report "$name" 0 "$log"
    else report "$name" 1 "$log" "rc=$rc, $n/$NPROC ranks OK"; fi
done

if [ "$FAILED" = 0 ] && [ -z "${KEEP_LOGS:-}" ]; then rm -rf "$LOGDIR"; fi
[ "$FAILED" = 0 ] && echo "torch tests: all passed" || echo "torch tests: FAILED (logs in $LOGDIR)"
exit $FAILED
