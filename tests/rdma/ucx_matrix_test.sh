#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The multi-process collective matrix (tests/mp/mp_worker.cc, as the UCX tcp/shared-memory
# matrix of tests/mp/mp_test.cc) with Chorus's UCX transport forced and UCX's data on the RDMA
# device: UCX_TLS=rc_verbs,tcp,self, UCX_NET_DEVICES=<device>:1,<the host's TCP interface>.
# rc_verbs carries the data; it connects endpoint to endpoint, so UCX needs a second transport
# for its wire-up messages. That is normally ud_verbs (UCX_TLS=rc_v), but UCX 1.13's ud_verbs
# does not work over rxe here (ucx_perftest -t tag_lat with UCX_TLS=ud_v,self aborts with an
# endpoint timeout after 30 s, while ib_send_bw -c UD passes on the same device), so the wire-up
# goes over tcp on the host's own interface (lo, or the host's veth under two_hosts.sh). The
# device's sent_pkts counter must grow by at least CHORUS_RDMA_MIN_PACKETS (50000; the 2-rank
# matrix sent ~360000 1 KiB packets with every datatype, ~71000 with the 4 datatypes of the
# rdma stage), and under two_hosts.sh the link between the hosts must
# carry packets too.
#   ucx_matrix_test.sh CHORUS_RUN WORKER NRANKS [worker args...]
# Single host: all ranks on $CHORUS_RDMA_DEV / $RXE_DEV / the first device. Under two_hosts.sh
# (CHORUS_RDMA_NETNS set): rank r runs in host r % 2's namespace on host r % 2's device
# (rank_device.sh). UCX_TLS may be overridden with CHORUS_RDMA_UCX_TLS. Exit 77 without an
# RDMA device.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=rdma_lib.sh
. "$here/rdma_lib.sh"
run=$1 worker=$2 nranks=$3
shift 3
rdma_require_device
export CHORUS_TRANSPORT=UCX
export UCX_TLS=${CHORUS_RDMA_UCX_TLS:-rc_verbs,tcp,self}
min_packets=${CHORUS_RDMA_MIN_PACKETS:-50000}
# The guest is emulated (TCG, 2 vCPUs for ranks, rxe and the kernel's veth backlog): an ACK can
# take longer than UCX's 1 s rc timeout, and after 7 retries UCX gives the endpoint up ("Endpoint
# timeout", seen once in three two-host runs). Give the emulator room; a caller may still set it.
export UCX_RC_VERBS_TIMEOUT=${UCX_RC_VERBS_TIMEOUT:-10s}
# Memory locked by registrations: the guest runs as root, but say it for other machines too.
ulimit -l unlimited 2> /dev/null || true
if [ -n "${CHORUS_RDMA_NETNS:-}" ]; then
  devices=$CHORUS_RDMA_DEVICES
  launch=(ip netns exec "${CHORUS_RDMA_NETNS%%,*}" "$run" -n "$nranks" --timeout 600
          --netns "$CHORUS_RDMA_NETNS" "$here/rank_device.sh" "$worker" "$@")
else
  devices=$(rdma_default_device)
  export UCX_NET_DEVICES=$devices:1,lo
  launch=("$run" -n "$nranks" --timeout 600 "$worker" "$@")
fi
IFS=, read -ra devs <<< "$devices"
rdma_count_start "${devs[@]}"
echo "UCX_TLS=$UCX_TLS devices ${devices}${CHORUS_RDMA_NETNS:+ hosts $CHORUS_RDMA_NETNS}: ${launch[*]}"
start=$(date +%s)
if ! "${launch[@]}"; then
  for d in "${devs[@]}"; do
    echo "$d counters: $(cd "/sys/class/infiniband/$d/ports/1/hw_counters" && grep -H . * | tr '\n' ' ')"
  done
  exit 1
fi
echo "matrix: $nranks ranks passed in $(($(date +%s) - start)) s"
rdma_count_check "$min_packets"
