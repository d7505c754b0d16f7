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
echo "$((6 - failures)) passed, $failures failed"
[ "$failures" -eq 0 ]
