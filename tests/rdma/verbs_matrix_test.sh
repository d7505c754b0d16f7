#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The multi-process collective matrix (tests/mp/mp_worker.cc) over Chorus's verbs transport
# (CHORUS_TRANSPORT=VERBS, or CHORUS_RDMA_TRANSPORT), with rings of 8 slots of 8 KiB so that the larger messages wrap
# them (as the single-host verbs matrix of tests/mp/mp_test.cc). Under two_hosts.sh rank r runs
# on host r % 2 with that host's device (rank_device.sh sets CHORUS_IB_HCA); the devices'
# sent_pkts counters must grow by CHORUS_RDMA_MIN_PACKETS (default 5000) each, and the link
# between the hosts must carry packets.
#   verbs_matrix_test.sh CHORUS_RUN WORKER NRANKS [worker args...]
# Exit 77 without an RDMA device.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=rdma_lib.sh
. "$here/rdma_lib.sh"
run=$1 worker=$2 nranks=$3
shift 3
rdma_require_device
export CHORUS_TRANSPORT=${CHORUS_RDMA_TRANSPORT:-VERBS} CHORUS_IB_SLOTS=${CHORUS_IB_SLOTS:-8}
export CHORUS_IB_SLOT_BYTES=${CHORUS_IB_SLOT_BYTES:-8192}
min_packets=${CHORUS_RDMA_MIN_PACKETS:-5000}
ulimit -l unlimited 2> /dev/null || true
if [ -n "${CHORUS_RDMA_NETNS:-}" ]; then
  devices=$CHORUS_RDMA_DEVICES
  launch=(ip netns exec "${CHORUS_RDMA_NETNS%%,*}" "$run" -n "$nranks" --timeout 600
          --netns "$CHORUS_RDMA_NETNS" "$here/rank_device.sh" "$worker" "$@")
else
  devices=$(rdma_default_device)
  export CHORUS_IB_HCA="=$devices"
  launch=("$run" -n "$nranks" --timeout 600 "$worker" "$@")
fi
IFS=, read -ra devs <<< "$devices"
rdma_count_start "${devs[@]}"
echo "verbs devices ${devices}${CHORUS_RDMA_NETNS:+ hosts $CHORUS_RDMA_NETNS}: ${launch[*]}"
start=$(date +%s)
"${launch[@]}" || exit 1
echo "matrix: $nranks ranks passed in $(($(date +%s) - start)) s"
rdma_count_check "$min_packets"
