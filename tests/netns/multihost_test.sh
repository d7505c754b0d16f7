#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Several hosts on one machine: two network namespaces joined by a veth link stand for two
# hosts. chorus-run starts ranks alternately in each; ranks on one "host" talk over shared
# memory, across "hosts" over TCP, and the bootstrap crosses the link.
#   multihost_test.sh CHORUS_RUN WORKER NRANKS [worker args...]
# Exit 77 (skipped) when network namespaces cannot be created (not root).
set -euo pipefail
run=$1
worker=$2
nranks=$3
shift 3
if [ "$(id -u)" != 0 ] || ! command -v ip > /dev/null; then
  echo "SKIP: network namespaces need root and iproute2"
  exit 77
fi
tag=$$
ns0=chorus-h0-$tag
ns1=chorus-h1-$tag
cleanup() {
  ip netns del "$ns0" 2> /dev/null || true
  ip netns del "$ns1" 2> /dev/null || true
}
trap cleanup EXIT
ip netns add "$ns0"
ip netns add "$ns1"
ip link add "cv0-$tag" type veth peer name "cv1-$tag"
ip link set "cv0-$tag" netns "$ns0"
ip link set "cv1-$tag" netns "$ns1"
ip -n "$ns0" addr add 10.231.0.1/24 dev "cv0-$tag"
ip -n "$ns1" addr add 10.231.0.2/24 dev "cv1-$tag"
for ns in "$ns0" "$ns1"; do
  ip -n "$ns" link set lo up
done
ip -n "$ns0" link set "cv0-$tag" up
ip -n "$ns1" link set "cv1-$tag" up
# The launcher (and the bootstrap root it creates) lives on host 0.
ip netns exec "$ns0" "$run" -n "$nranks" --timeout 600 --netns "$ns0,$ns1" "$worker" "$@"
echo "multihost: $nranks ranks on 2 hosts passed"
