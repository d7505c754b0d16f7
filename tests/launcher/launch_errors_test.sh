#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# chorus-run given a program it cannot start (missing file, no execute bit, a directory, a name
# not on PATH) must print why, exit non-zero, and stop nothing but its own ranks: the shell that
# called it (same process group, as in make or a CI job) survives to print its own line.
#   launch_errors_test.sh <chorus-run>
set -u
run=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
printf '#!/bin/sh\nexit 0\n' > "$tmp/not-executable"
chmod 0644 "$tmp/not-executable"
mkdir "$tmp/a-directory"
failures=0
check() {  # check <label> <expected text in stderr> <program>
  local label=$1 expect=$2 program=$3
  # A child shell in our process group runs chorus-run and reports after it.
  out=$(bash -c '"$1" -n 3 "$2" 2>"$3/err"; echo "caller survived, status $?"' _ "$run" "$program" "$tmp")
  err=$(cat "$tmp/err")
  if [[ "$out" != "caller survived, status "* ]]; then
    echo "FAIL $label: the calling shell did not survive (output: '$out')"; failures=$((failures + 1)); return
  fi
  if [[ "$out" == "caller survived, status 0" ]]; then
    echo "FAIL $label: chorus-run exited 0"; failures=$((failures + 1)); return
  fi
  if [[ "$err" != *"$expect"* ]]; then
    echo "FAIL $label: stderr '$err' does not say '$expect'"; failures=$((failures + 1)); return
  fi
  echo "ok   $label: $out; $err"
}
check "missing file" "No such file" "$tmp/does-not-exist"
check "no execute bit" "no execute permission" "$tmp/not-executable"
check "a directory" "is a directory" "$tmp/a-directory"
check "not on PATH" "no executable of that name on PATH" "chorus-no-such-program-$$"
# And a program that starts and fails still makes chorus-run fail, with the rank named.
out=$(bash -c '"$1" -n 2 false 2>"$2/err"; echo "status $?"' _ "$run" "$tmp")
if [[ "$out" == "status 0" ]] || ! grep -q "rank" "$tmp/err"; then
  echo "FAIL failing program: $out; $(cat "$tmp/err")"; failures=$((failures + 1))
else
  echo "ok   failing program: $out"
fi
# -x NAME=VALUE overrides an inherited NAME in every rank.
out=$(CHORUS_X_PROBE=inherited "$run" -n 2 -x CHORUS_X_PROBE=given sh -c 'echo "$CHORUS_X_PROBE"' 2>&1 | sort -u)
if [ "$out" != "given" ]; then
  echo "FAIL -x override: ranks saw '$out'"; failures=$((failures + 1))
else
  echo "ok   -x override: ranks saw '$out'"
fi
# Command-line mistakes are named, not only answered with the usage line (exit status 2).
usage_check() {  # usage_check <label> <expected text in stderr> <chorus-run arguments...>
  local label=$1 expect=$2
  shift 2
  err=$("$run" "$@" 2>&1 >/dev/null)
  status=$?
  if [ "$status" -ne 2 ] || [[ "$err" != *"$expect"* ]] || [[ "$err" != *"usage:"* ]]; then
    echo "FAIL $label: status $status, stderr '$err' does not say '$expect'"
    failures=$((failures + 1))
  else
    echo "ok   $label: ${err%%$'\n'*}"
  fi
}
usage_check "-n 0" "-n must be at least 1 (got 0)" -n 0 true
usage_check "-n x" "-n 'x' is not a number" -n x true
usage_check "no program" "no program to start" -n 2
usage_check "unknown option" "unknown option '--nope'" --nope -n 2 true
usage_check "bad --timeout" "--timeout '-1' is not a number of seconds" -n 2 --timeout -1 true
help=$("$run" --help 2>&1)
if [ $? -ne 0 ] || [[ "$help" != *"--timeout SECONDS"* ]]; then
  echo "FAIL --help: '$help'"; failures=$((failures + 1))
else
  echo "ok   --help"
fi
# A timeout that fires names itself: "stopped by the launcher after --timeout 1 s".
out=$("$run" -n 2 --timeout 1 sleep 30 2>&1)
status=$?
if [ "$status" -eq 0 ] || [[ "$out" != *"was stopped by the launcher after --timeout 1 s"* ]]; then
  echo "FAIL --timeout fired: status $status, '$out'"; failures=$((failures + 1))
else
  echo "ok   --timeout fired: ${out%%$'\n'*}"
fi
# A failing rank stops the others, and they say so.
out=$("$run" -n 2 sh -c '[ "$CHORUS_RANK" = 1 ] && exit 3; exec sleep 30' 2>&1)
if [[ "$out" != *"rank 1 "*"exited with 3"* ]] || [[ "$out" != *"rank 0 "*"stopped by the launcher after rank 1 failed"* ]]; then
  echo "FAIL a failing rank stops the others: '$out'"; failures=$((failures + 1))
else
  echo "ok   a failing rank stops the others"
fi
echo "$((14 - failures)) passed, $failures failed"
[ "$failures" -eq 0 ]
