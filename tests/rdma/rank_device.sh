#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Rank wrapper for two_hosts.sh: chorus-run --netns places rank r on host r % 2; this points
# UCX and Chorus's verbs transport (CHORUS_IB_HCA) at that host's RDMA device (the r % N-th of
# CHORUS_RDMA_DEVICES) and, for UCX's wire-up over tcp, at the interface that has the host's
# address in CHORUS_RDMA_HOST_IPS, then runs the rank (in a mount namespace whose /sys is its
# network namespace's).
#   rank_device.sh PROGRAM [ARGS...]      (CHORUS_RANK is set by the launcher)
set -euo pipefail
IFS=, read -ra devs <<< "${CHORUS_RDMA_DEVICES:?rank_device.sh runs under two_hosts.sh}"
IFS=, read -ra ips <<< "${CHORUS_RDMA_HOST_IPS:?rank_device.sh runs under two_hosts.sh}"
host=$((${CHORUS_RANK:?no CHORUS_RANK} % ${#devs[@]}))
iface=$(ip -o -4 addr show | awk -v ip="${ips[$host]}/" 'index($4, ip) == 1 {print $2; exit}')
[ -n "$iface" ] || { echo "rank_device.sh: no interface with ${ips[$host]} in this namespace" >&2; exit 1; }
IFS=, read -ra nss <<< "${CHORUS_RDMA_NETNS:?rank_device.sh runs under two_hosts.sh}"
export UCX_NET_DEVICES=${devs[$host]}:1,$iface CHORUS_IB_HCA==${devs[$host]}
# UCX finds network devices in /sys/class/net, which shows the namespace of whoever mounted
# /sys (chorus-run's, host A's): `ip netns exec` remounts it for the rank's own namespace.
exec ip netns exec "${nss[$host]}" "$@"
