#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The shared library exports every function of include/nccl.h with its pnccl* twin, the full
# NCCL 2.28 host API, and nothing outside nccl*/pnccl*/chorus*.
#   exports_test.sh path/to/libchorus.so path/to/nccl.h
set -euo pipefail
lib=$1
header=$2
syms=$(nm -D --defined-only "$lib" | awk '{print $3}' | sed 's/@.*//' | sort -u)
status=0

unexpected=$(echo "$syms" | grep -Ev '^(nccl|pnccl|chorus)[A-Z]' || true)
if [ -n "$unexpected" ]; then
  echo "FAIL: symbols exported outside nccl*/pnccl*/chorus*:"
  echo "$unexpected" | head -50
  status=1
fi

# NCCL 2.28's host API, spelled out so that a function missing from the header is caught too.
nccl_228="ncclMemAlloc ncclMemFree ncclGetVersion ncclGetUniqueId ncclCommInitRankConfig
  ncclCommInitRank ncclCommInitAll ncclCommFinalize ncclCommDestroy ncclCommAbort ncclCommRevoke
  ncclCommSplit ncclCommShrink ncclCommInitRankScalable ncclGetErrorString ncclGetLastError
  ncclResetDebugInit ncclCommGetAsyncError ncclCommCount ncclCommCuDevice ncclCommUserRank
  ncclCommRegister ncclCommDeregister ncclCommWindowRegister ncclCommWindowDeregister
  ncclRedOpCreatePreMulSum ncclRedOpDestroy ncclReduce ncclBcast ncclBroadcast ncclAllReduce
  ncclReduceScatter ncclAllGather ncclAlltoAll ncclGather ncclScatter ncclSend ncclRecv
  ncclGroupStart ncclGroupEnd ncclGroupSimulateEnd"
# Declarations: "<return type> ncclName(" at the start of a line.
declared=$(grep -oE '^(ncclResult_t|const char\*|void)[[:space:]]+nccl[A-Z][A-Za-z]*\(' "$header" |
           sed -E 's/.*(nccl[A-Za-z]*)\(/\1/' | sort -u)
count=0
for f in $nccl_228 $declared; do
  for s in "$f" "p$f"; do
    if ! grep -qx "$s" <<< "$syms"; then
      echo "FAIL: $s is not exported"
      status=1
    fi
  done
  count=$((count + 1))
done
for f in $nccl_228; do
  if ! grep -qx "$f" <<< "$declared"; then
    echo "FAIL: $f is not declared in $header"
    status=1
  fi
done
echo "checked $(echo "$syms" | wc -l) exported symbols against $count NCCL functions"
exit $status
