#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# Runs its arguments where an RDMA device exists (the soft-RoCE test guest, a host with an
# HCA); elsewhere exits 77, which ctest reports as skipped (SKIP_RETURN_CODE), or 1 when
# CHORUS_RDMA_REQUIRED=1 (the guest of scripts/test-rdma.sh sets it).
for d in /sys/class/infiniband/*; do
  if [ -e "$d" ]; then exec "$@"; fi
done
if [ "${CHORUS_RDMA_REQUIRED:-0}" = 1 ]; then
  echo "no RDMA device in /sys/class/infiniband, and CHORUS_RDMA_REQUIRED=1" >&2
  exit 1
fi
echo "no RDMA device in /sys/class/infiniband: skipped"
exit 77
