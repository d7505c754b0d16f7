# SPDX-License-Identifier: Apache-2.0
# shellcheck shell=bash
# File: tests/netns/lib.sh
# Shared by the test-bed tests that judge each rank on its own (sourced, not run).

# Exits 77 (skipped) without what the test bed needs: root, iproute2, nsenter and unshare.
netns_require() {
  if [ "$(id -u)" != 0 ] || ! command -v ip > /dev/null || ! command -v nsenter > /dev/null ||
    ! command -v unshare > /dev/null; then
    echo "SKIP: the test bed needs root, iproute2 and util-linux (nsenter, unshare)"
    exit 77
  fi
}

# Sets $work to a fresh directory, removed on exit, holding wrap.sh: `bash $work/wrap.sh $work
# TOOL ARGS...` runs one rank's tool with its output in $work/rank<R>.log, then writes "<exit
# status> <end time, ns>" to $work/rank<R>.end and exits 0, so that chorus-run does not stop
# the other rank when the first one fails: each rank's own behaviour is what a test checks.
netns_rank_workdir() {
  work=$(mktemp -d)
  # shellcheck disable=SC2064  # expanded now: $work is this directory
  trap "rm -rf '$work'" EXIT
  cat > "$work/wrap.sh" << 'RANK'
out=$1/rank$CHORUS_RANK
shift
rc=0
"$@" > "$out.log" 2>&1 || rc=$?
echo "$rc $(date +%s%N)" > "$out.end"
exit 0
RANK
}
