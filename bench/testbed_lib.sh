# SPDX-License-Identifier: Apache-2.0
# shellcheck shell=bash
# Sourced by the benchmarks that run on the multi-host test bed (scripts/testbed.sh): the checks
# they all make before starting, the bed's name and cleanup, and tc rate arithmetic. Expects
# $root (the repository) to be set.

# Exits 77 (skipped, for ctest) unless this is root with iproute2, tc and nsenter.
testbed_require() {
  if [ "$(id -u)" != 0 ] || ! command -v ip > /dev/null || ! command -v tc > /dev/null ||
     ! command -v nsenter > /dev/null; then
    echo "SKIP: the test bed needs root, iproute2, tc and nsenter"
    exit 77
  fi
}

# testbed_require_built SCRIPT WHAT FILE...: exits 1 naming the first FILE that is not an
# executable ("SCRIPT: FILE is missing: build WHAT").
testbed_require_built() {
  local script=$1 what=$2 f
  shift 2
  for f in "$@"; do
    [ -x "$f" ] || { echo "$script: $f is missing: build $what" >&2; exit 1; }
  done
}

# testbed_start_session PREFIX: $testbed is the bed's script, TESTBED_NAME a name of its own
# (PREFIX and the pid); on exit the bed comes down, after the caller's bench_cleanup if it
# defines one.
testbed_start_session() {
  # shellcheck disable=SC2154  # the sourcing script sets root
  testbed=${root:?bench/testbed_lib.sh needs root}/scripts/testbed.sh
  export TESTBED_NAME=$1$$
  trap testbed_end_session EXIT
  trap 'exit 130' INT TERM
}
testbed_end_session() {
  if declare -F bench_cleanup > /dev/null; then bench_cleanup || true; fi
  TESTBED_QUIET=1 "$testbed" down > /dev/null 2>&1 || true
}

# tc_rate_bytes RATE: a tc rate (1gbit, 200mbit, 500kbit, 1000) in bytes per second.
tc_rate_bytes() {
  awk -v r="$1" 'BEGIN { v = r + 0; u = tolower(r); sub(/^[0-9.]+/, "", u)
    f = u == "gbit" ? 1e9 : u == "mbit" ? 1e6 : u == "kbit" ? 1e3 : 1; printf "%.0f", v * f / 8 }'
}
