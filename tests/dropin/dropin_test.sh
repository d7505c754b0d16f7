#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The drop-in libnccl.so.2, proved the hard way: a client compiled and linked against a
# different libnccl.so.2 (a stand-in whose every call fails) runs correctly, as 3 processes,
# when Chorus's library is preloaded, and as 2 with Chorus's directory on LD_LIBRARY_PATH; a
# dlopen/dlsym client finds every function of nccl.h (and its pnccl twin) in it.
#   dropin_test.sh CHORUS_LIBNCCL STANDIN_LIBNCCL NCCL_CLIENT DLOPEN_CLIENT NCCL_H
set -euo pipefail
chorus_lib=$1
standin_lib=$2
client=$3
dlopen_client=$4
header=$5
chorus_dir=$(dirname "$chorus_lib")
work=$(mktemp -d /tmp/chorus-dropin-XXXXXX)
trap 'rm -rf "$work"' EXIT

soname=$(readelf -dW "$chorus_lib" | sed -nE 's/.*\(SONAME\).*\[(.*)\]/\1/p')
[ "$soname" = libnccl.so.2 ] || { echo "FAIL: SONAME is '$soname', not libnccl.so.2"; exit 1; }
needed=$(readelf -dW "$client" | sed -nE 's/.*\(NEEDED\).*\[(libnccl[^]]*)\]/\1/p')
[ "$needed" = libnccl.so.2 ] || { echo "FAIL: the client needs '$needed'"; exit 1; }

# Starts NRANKS client processes with the given environment; all must print "right".
run_job() {
  local name=$1 nranks=$2
  shift 2
  local pids=() r status=0
  rm -f "$work/id"
  for ((r = 0; r < nranks; r++)); do
    env "$@" timeout 120 "$client" "$r" "$nranks" "$work/id" > "$work/$name.$r" 2>&1 &
    pids+=($!)
  done
  for ((r = 0; r < nranks; r++)); do wait "${pids[$r]}" || status=1; done
  if [ $status -ne 0 ] || [ "$(cat "$work/$name".* | grep -c ' right$')" -ne "$nranks" ]; then
    echo "FAIL: $name"
    cat "$work/$name".*
    exit 1
  fi
  echo "$name: $nranks processes, every rank's results right"
}

# 1. Alone, the client meets the stand-in and fails: the check below can fail.
if timeout 60 "$client" 0 1 "$work/alone" > "$work/alone.out" 2>&1; then
  echo "FAIL: the client ran without Chorus: it is not linked against the stand-in"
  exit 1
fi
grep -q "stand-in libnccl.so.2" "$work/alone.out" ||
  { echo "FAIL: the client did not meet the stand-in"; cat "$work/alone.out"; exit 1; }
echo "without Chorus: the stand-in answered, the client failed (as it must)"

# 2. LD_PRELOAD ahead of the stand-in; NCCL_DEBUG=VERSION says who answered.
run_job preload 3 LD_PRELOAD="$chorus_lib" NCCL_DEBUG=VERSION
grep -q "Chorus: chorus .*loaded from .*libnccl.so.2" "$work/preload.0" ||
  { echo "FAIL: NCCL_DEBUG=VERSION does not say Chorus"; cat "$work/preload.0"; exit 1; }
grep "Chorus:" "$work/preload.0" | head -1

# 3. LD_LIBRARY_PATH instead of the stand-in's directory.
run_job library_path 2 LD_LIBRARY_PATH="$chorus_dir"

# 4. dlopen + dlsym of every declared function and its pnccl twin.
syms=$(grep -oE '^(ncclResult_t|const char\*|void)[[:space:]]+p?nccl[A-Z][A-Za-z]*\(' "$header" |
       sed -E 's/.*[[:space:]](p?nccl[A-Za-z]*)\(/\1/' | sort -u)
[ "$(echo "$syms" | wc -l)" -ge 80 ] || { echo "FAIL: too few functions read from $header"; exit 1; }
# shellcheck disable=SC2086
LD_LIBRARY_PATH="$chorus_dir" timeout 120 "$dlopen_client" 3 $syms
# ... and the same client finds the stand-in wanting: the check can fail.
# shellcheck disable=SC2086
if LD_LIBRARY_PATH="$(dirname "$standin_lib")" timeout 60 "$dlopen_client" 3 $syms > "$work/dlopen_standin" 2>&1; then
  echo "FAIL: the dlopen client accepted the stand-in"
  exit 1
fi
echo "dlopen client on the stand-in: refused ($(grep -c 'not found' "$work/dlopen_standin") symbols missing)"
echo "drop-in test: passed"
