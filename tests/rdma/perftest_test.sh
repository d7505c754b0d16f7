#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Checks the soft-RoCE bed itself with rdma-core's and perftest's own tools, no Chorus code:
# ib_write_bw (RDMA WRITE, 64 KiB messages) between two processes, then ibv_rc_pingpong with
# --chk (SEND/RECV, every received buffer checked). On one device (two processes, the
# device's loopback), or, under two_hosts.sh, from host B's device to host A's across the
# link, which must then have carried the packets. The device's sent_pkts counter must grow by
# at least one packet per message.
#   perftest_test.sh            exit 77 without an RDMA device (unless CHORUS_RDMA_REQUIRED=1)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=rdma_lib.sh
. "$here/rdma_lib.sh"
rdma_require_device
for tool in ib_write_bw ibv_rc_pingpong; do
  command -v "$tool" > /dev/null || { echo "FAIL: $tool is missing (perftest, ibverbs-utils)"; exit 1; }
done
iters=${CHORUS_RDMA_PERFTEST_ITERS:-300}
if [ -n "${CHORUS_RDMA_NETNS:-}" ]; then   # two hosts: server on A, client on B
  IFS=, read -r ns_srv ns_cli <<< "$CHORUS_RDMA_NETNS"
  IFS=, read -r dev_srv dev_cli <<< "$CHORUS_RDMA_DEVICES"
  IFS=, read -r ip_srv _ <<< "$CHORUS_RDMA_HOST_IPS"
  IFS=, read -r link_srv link_cli <<< "$CHORUS_RDMA_LINKS"
else
  ns_srv= ns_cli= link_srv= link_cli=
  dev_srv=$(rdma_default_device) dev_cli=$dev_srv ip_srv=127.0.0.1
fi
gid_srv=$(rdma_ipv4_gid "$dev_srv")
gid_cli=$(rdma_ipv4_gid "$dev_cli")
echo "server: $dev_srv gid $gid_srv ${ns_srv:+netns $ns_srv}; client: $dev_cli gid $gid_cli ${ns_cli:+netns $ns_cli}"
port=$((20000 + $$ % 10000))
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT

# pair NAME SERVER-ARGS... -- CLIENT-ARGS...: server in ns_srv, client in ns_cli; both must pass.
pair() {
  local name=$1 srv=() cli=()
  shift
  while [ "$1" != -- ]; do srv+=("$1"); shift; done
  shift
  cli=("$@")
  echo "== $name"
  echo "server: ${srv[*]}"
  echo "client: ${cli[*]}"
  rdma_in_netns "$ns_srv" timeout 120 "${srv[@]}" > "$logs/srv" 2>&1 &
  local sp=$! crc=0 src=0
  rdma_wait_listen "$port" "$ns_srv" || true
  rdma_in_netns "$ns_cli" timeout 120 "${cli[@]}" > "$logs/cli" 2>&1 || crc=$?
  wait "$sp" || src=$?
  echo "-- client (exit $crc):"; cat "$logs/cli"
  echo "-- server (exit $src):"; cat "$logs/srv"
  if [ "$crc" != 0 ] || [ "$src" != 0 ]; then echo "FAIL: $name"; exit 1; fi
}

sent0=$(rdma_counter "$dev_cli" sent_pkts)
wire0=
[ -z "$link_cli" ] || wire0=$(rdma_link_tx_packets "$link_cli")
pair "ib_write_bw, 64 KiB x $iters" \
  ib_write_bw -d "$dev_srv" -x "$gid_srv" -p "$port" -s 65536 -n "$iters" -F -- \
  ib_write_bw -d "$dev_cli" -x "$gid_cli" -p "$port" -s 65536 -n "$iters" -F "$ip_srv"
grep -qE '^ *65536 +[0-9]+' "$logs/cli" || { echo "FAIL: ib_write_bw printed no result line"; exit 1; }
sent1=$(rdma_counter "$dev_cli" sent_pkts)
echo "$dev_cli sent_pkts: $sent0 -> $sent1"
if [ $((sent1 - sent0)) -lt "$iters" ]; then
  echo "FAIL: $dev_cli sent fewer packets than messages"; exit 1
fi
if [ -n "$link_cli" ]; then
  wire1=$(rdma_link_tx_packets "$link_cli")
  echo "link ${link_cli#*:} tx_packets: $wire0 -> $wire1"
  if [ $((wire1 - wire0)) -lt "$iters" ]; then
    echo "FAIL: the RDMA traffic did not cross the link between the hosts"; exit 1
  fi
fi
pair "ibv_rc_pingpong --chk, 4 KiB x $iters" \
  ibv_rc_pingpong -d "$dev_srv" -g "$gid_srv" -p "$port" -s 4096 -n "$iters" --chk -- \
  ibv_rc_pingpong -d "$dev_cli" -g "$gid_cli" -p "$port" -s 4096 -n "$iters" --chk "$ip_srv"
echo "perftest: passed"
