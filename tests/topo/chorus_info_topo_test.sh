#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# chorus-info --topo on the example topology files: the 2x2x2 cluster's hosts, rails and every
# rank's host, local index and rail; the 64x8x4 cluster's 512 ranks, rail-aligned placement and
# 64 inter-host hops; an invalid file exits 1 with "FILE:LINE: ..." on stderr.
#   chorus_info_topo_test.sh CHORUS_INFO
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
info=$1
fail() { echo "FAIL: $*"; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

out=$("$info" --topo "$here/cluster_2x2x2.topo")
echo "$out"
grep -qF "2 host(s), 4 rank(s) (2 per host), 2 rail(s)" <<< "$out" || fail "2x2x2: no summary line"
grep -qF "Intra-host link: 0.5 us + bytes / 40 GB/s" <<< "$out" || fail "2x2x2: no intra line"
grep -qE "^ +1  nic1 +2 us \+ bytes / 100 Gbit/s \(12.5 GB/s\)$" <<< "$out" || fail "2x2x2: no rail nic1 line"
grep -qE "^ +1  beta +2 rank\(s\): 2-3$" <<< "$out" || fail "2x2x2: no host beta line"
# rank host local rail, one line each, in the Ranks section
ranks=$(sed -n '/^Ranks:/,/^Ring/p' <<< "$out" | awk '$1 ~ /^[0-9]+$/ {print $1, $2, $3, $4}')
expected=$'0 alpha 0 nic0\n1 alpha 1 nic1\n2 beta 0 nic0\n3 beta 1 nic1'
[ "$ranks" = "$expected" ] || fail "2x2x2 ranks: got"$'\n'"$ranks"
grep -qF "2 inter-host hop(s) over 4 rank(s)" <<< "$out" || fail "2x2x2: ring hops"

out=$("$info" --topo "$here/cluster_64x8x4.topo")
grep -qF "64 host(s), 512 rank(s) (8 per host), 4 rail(s)" <<< "$out" || fail "64x8x4: no summary line"
n=$(sed -n '/^Ranks:/,/^Ring/p' <<< "$out" | awk '$1 ~ /^[0-9]+$/' | wc -l)
[ "$n" = 512 ] || fail "64x8x4: $n rank lines, not 512"
bad=$(sed -n '/^Ranks:/,/^Ring/p' <<< "$out" |
      awk '$1 ~ /^[0-9]+$/ && ($2 != "h" int($1 / 8) || $3 != $1 % 8 || $4 != "mlx5_" ($1 % 8) % 4)')
[ -z "$bad" ] || fail "64x8x4: misplaced ranks:"$'\n'"$bad"
grep -qF "64 inter-host hop(s) over 512 rank(s)" <<< "$out" || fail "64x8x4: ring hops"
echo "ok: 64x8x4, 512 ranks rail-aligned, 64 inter-host hops"

printf 'intra 0.5 40\nrail nic0 2 100\nhost a 2\nhost a 2\n' > "$tmp/dup.topo"
set +e
err=$("$info" --topo "$tmp/dup.topo" 2>&1 > /dev/null)
rc=$?
set -e
echo "$err"
[ "$rc" = 1 ] || fail "invalid file: exit $rc, not 1"
grep -qF "$tmp/dup.topo:4: host 'a' is already defined on line 3" <<< "$err" || fail "invalid file: no error"
set +e
"$info" --topo "$tmp/missing.topo" > /dev/null 2>&1
rc=$?
set -e
[ "$rc" = 1 ] || fail "missing file: exit $rc, not 1"
echo "ok: invalid files exit 1 with the error"
