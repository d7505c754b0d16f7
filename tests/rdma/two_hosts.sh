#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Two "hosts" on one soft-RoCE machine (the guest of scripts/rxe-guest.sh), each a network
# namespace with its own RDMA device, and RDMA traffic between them crossing a veth link:
#   two_hosts.sh [--mode routed|netns] COMMAND [ARGS...]
# runs COMMAND (in the root namespace) with
#   CHORUS_RDMA_NETNS     nsA,nsB         the hosts (names under /run/netns, for chorus-run --netns)
#   CHORUS_RDMA_DEVICES   rxeA,rxeB       host i's RDMA device
#   CHORUS_RDMA_HOST_IPS  10.234.0.1,...  host i's TCP address (bootstrap, perftest's socket)
#   CHORUS_RDMA_LINKS     ns:veth,...     the two ends of the RDMA link ("" = root namespace)
# and removes everything afterwards. Exit: COMMAND's; 77 when it cannot run here (no root,
# no rdma_rxe), unless CHORUS_RDMA_REQUIRED=1.
#
# Modes. rdma_rxe of Debian 12's kernel (6.1) is not namespace-aware: its UDP socket (port
# 4791) and its route lookups live in the initial namespace only (`ip_route_output_key(&init_net,
# ...)` in drivers/infiniband/sw/rxe/rxe_net.c; per-namespace rxe is Zhu Yanjun's 2026 series
# "RDMA/rxe: Support RDMA link creation and destruction per net namespace"). Seen in the guest:
#   - `rdma system set netns exclusive` fails with EBUSY once any namespace exists, and moving a
#     device (`rdma dev set rxe0 netns NS`) fails with EOPNOTSUPP: ib_device_set_netns_put()
#     requires a driver with disassociate_ucontext, which rxe has not;
#   - rxe devices created inside two namespaces on the ends of a veth pair (`--mode netns`)
#     get their GIDs, but RC traffic between them fails at once: ib_write_bw's client gets
#     "Completion with error ... Failed status 2" (IBV_WC_LOC_QP_OP_ERR).
# So:
#   routed (default): the RDMA link is a veth pair in the root namespace, one rxe device on each
#     end, and policy routing sends traffic between the two ends' addresses over the pair
#     instead of through the local table (accept_local on both ends). The hosts are two
#     namespaces joined by a second veth pair that carries their TCP; in the default "shared"
#     RDMA namespace mode every process sees both devices, and host i's processes use device i.
#     The tests check that the link's veth really carried the RDMA packets.
#   netns: each end of the RDMA link moved into its host's namespace and its rxe device created
#     there: what a namespace-aware rxe will allow; kept to show what a kernel does with it.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=rdma_lib.sh
. "$here/rdma_lib.sh"
mode=routed
if [ "${1:-}" = --mode ]; then mode=$2; shift 2; fi
case $mode in routed | netns) ;; *) echo "two_hosts.sh: --mode routed|netns" >&2; exit 2 ;; esac
[ $# -gt 0 ] || { echo "usage: two_hosts.sh [--mode routed|netns] COMMAND [ARGS...]" >&2; exit 2; }
if [ "$(id -u)" != 0 ] || ! command -v ip > /dev/null || ! command -v rdma > /dev/null; then
  rdma_skip "two hosts need root and iproute2 (ip, rdma)"
fi
[ -d /sys/module/rdma_rxe ] || rdma_skip "no rdma_rxe module loaded (run in the soft-RoCE guest: scripts/test-rdma.sh)"

tag=$$
nsa=chorus-ra-$tag nsb=chorus-rb-$tag
da=crd0-$tag db=crd1-$tag        # the RDMA link
ha=crh0-$tag hb=crh1-$tag        # the hosts' TCP link (routed mode)
rxa=rxe_h0_$tag rxb=rxe_h1_$tag
ipa=10.233.0.1 ipb=10.233.0.2
local_moved=0 old_all_rp= old_backlog=
cleanup() {
  set +e
  rdma link delete "$rxa" 2> /dev/null
  rdma link delete "$rxb" 2> /dev/null
  ip netns exec "$nsa" rdma link delete "$rxa" 2> /dev/null
  ip netns exec "$nsb" rdma link delete "$rxb" 2> /dev/null
  ip link del "$da" 2> /dev/null
  ip rule del pref 100 2> /dev/null
  ip rule del pref 101 2> /dev/null
  if [ "$local_moved" = 1 ]; then
    ip rule add pref 0 lookup local
    ip rule del pref 1000 lookup local
  fi
  [ -z "$old_all_rp" ] || sysctl -qw net.ipv4.conf.all.rp_filter="$old_all_rp"
  [ -z "$old_backlog" ] || sysctl -qw net.core.netdev_max_backlog="$old_backlog"
  ip netns del "$nsa" 2> /dev/null
  ip netns del "$nsb" 2> /dev/null
}
trap cleanup EXIT

wait_gid() {  # dev [netns]: the RoCE v2 IPv4 GID index, or fail
  local g
  if g=$(rdma_ipv4_gid "$1"); then echo "$g"; return 0; fi
  echo "two_hosts.sh: $1 got no RoCE v2 IPv4 GID; its table:" >&2
  grep -H . /sys/class/infiniband/"$1"/ports/1/gids/{0..3} >&2 || true
  return 1
}

ip netns add "$nsa"
ip netns add "$nsb"
ip -n "$nsa" link set lo up
ip -n "$nsb" link set lo up
ip link add "$da" type veth peer name "$db"
if [ "$mode" = routed ]; then
  ip link add "$ha" type veth peer name "$hb"
  ip link set "$ha" netns "$nsa"
  ip link set "$hb" netns "$nsb"
  ip -n "$nsa" addr add 10.234.0.1/24 dev "$ha"
  ip -n "$nsb" addr add 10.234.0.2/24 dev "$hb"
  ip -n "$nsa" link set "$ha" up
  ip -n "$nsb" link set "$hb" up
  host_ips=10.234.0.1,10.234.0.2
  links=":$da,:$db"
  # The RDMA link, in the root namespace. Packets between two local addresses normally never
  # leave the machine (the local table answers first); here the local table is looked up after
  # two rules that send A->B out of A's end and B->A out of B's end, and each end accepts
  # packets from a local source address.
  old_all_rp=$(sysctl -n net.ipv4.conf.all.rp_filter)
  # a veth delivers through the per-CPU backlog (1000 packets by default); rxe sends bursts
  old_backlog=$(sysctl -n net.core.netdev_max_backlog)
  sysctl -qw net.core.netdev_max_backlog=100000
  sysctl -qw net.ipv4.conf.all.rp_filter=0
  for d in "$da" "$db"; do
    sysctl -qw "net.ipv4.conf.$d.rp_filter=0" "net.ipv4.conf.$d.accept_local=1"
  done
  ip addr add "$ipa/24" dev "$da"
  ip addr add "$ipb/24" dev "$db"
  ip link set "$da" up
  ip link set "$db" up
  ip route add "$ipb/32" dev "$da" src "$ipa" table 233
  ip route add "$ipa/32" dev "$db" src "$ipb" table 234
  ip rule add pref 100 iif lo from "$ipa" to "$ipb" lookup 233
  ip rule add pref 101 iif lo from "$ipb" to "$ipa" lookup 234
  ip rule add pref 1000 lookup local
  local_moved=1
  ip rule del pref 0 lookup local
  rdma link add "$rxa" type rxe netdev "$da"
  rdma link add "$rxb" type rxe netdev "$db"
else
  ip link set "$da" netns "$nsa"
  ip link set "$db" netns "$nsb"
  ip -n "$nsa" addr add "$ipa/24" dev "$da"
  ip -n "$nsb" addr add "$ipb/24" dev "$db"
  ip -n "$nsa" link set "$da" up
  ip -n "$nsb" link set "$db" up
  host_ips=$ipa,$ipb
  links="$nsa:$da,$nsb:$db"
  echo "two_hosts.sh: rdma system: $(rdma system show 2>&1)"
  ip netns exec "$nsa" rdma link add "$rxa" type rxe netdev "$da"
  ip netns exec "$nsb" rdma link add "$rxb" type rxe netdev "$db"
fi
gida=$(wait_gid "$rxa")
gidb=$(wait_gid "$rxb")
echo "two_hosts.sh ($mode): host A = netns $nsa, $rxa (gid $gida) on $da $ipa;" \
  "host B = netns $nsb, $rxb (gid $gidb) on $db $ipb; TCP $host_ips"
export CHORUS_RDMA_NETNS=$nsa,$nsb CHORUS_RDMA_DEVICES=$rxa,$rxb CHORUS_RDMA_HOST_IPS=$host_ips
export CHORUS_RDMA_LINKS=$links CHORUS_RDMA_GIDS=$gida,$gidb
set +e
"$@"
rc=$?
set -e
exit "$rc"
