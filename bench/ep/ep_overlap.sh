#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# File: bench/ep/ep_overlap.sh
# ep_overlap (dispatch and combine queued on a host stream under computation, see
# ep_overlap.cc) with an already built ep_overlap and chorus-run: 2 processes over shared memory
# on this host, then (root only) 2 ranks on the test bed's 2 hosts joined by one tbf-shaped link
# (scripts/testbed.sh; default 1 Gbit/s), where the calls wait on the link and can hide.
#   ep_overlap.sh BUILD_DIR [--rate RATE] [-- ep_overlap options...]
# Results: stdout and bench/ep/results/ep_overlap.txt.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
# shellcheck source=bench/testbed_lib.sh
. "$root/bench/testbed_lib.sh"
build=$(cd "${1:?usage: ep_overlap.sh BUILD_DIR [--rate RATE] [-- ep_overlap options...]}" && pwd)
shift
rate=1gbit
extra=()
while [ $# -gt 0 ]; do
  case $1 in
    --rate) rate=$2; shift 2 ;;
    --) shift; extra=("$@"); break ;;
    *) echo "ep_overlap.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
run=$build/tools/chorus-run
bench=$build/bench/ep_overlap
testbed_require_built ep_overlap.sh "the ep_overlap and chorus-run targets" "$run" "$bench"
mkdir -p "$here/results"
exec > >(tee "$here/results/ep_overlap.txt") 2>&1
echo "# ep_overlap.sh $(date -u +%Y-%m-%dT%H:%M:%SZ), git $(git -C "$root" rev-parse --short HEAD 2> /dev/null || echo '?')"
echo "# load average before: $(cut -d' ' -f1-3 /proc/loadavg), $(nproc) CPUs"
echo "# shared memory, 2 processes"
"$run" -n 2 --timeout 900 -x CHORUS_TRANSPORT=SHM "$bench" "${extra[@]+"${extra[@]}"}"
if [ "$(id -u)" = 0 ]; then
  testbed_require
  testbed_start_session epo
  log=$(mktemp)
  "$testbed" up --hosts 2 --rails 1 --rate "$rate" > "$log" 2>&1 || { cat "$log"; exit 1; }
  rm -f "$log"
  echo "# test bed: 2 hosts, 1 rank each, one link tbf $rate both ways (TCP)"
  "$testbed" launch -n 2 --placement cyclic --timeout 900 --chorus-run "$run" "$bench" \
    "${extra[@]+"${extra[@]}"}"
else
  echo "# test bed skipped: it needs root"
fi
echo "# load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
