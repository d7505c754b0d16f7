#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Runs its arguments in host A's network namespace (the first of CHORUS_RDMA_NETNS, set by
# two_hosts.sh): a test that forks its ranks itself (tests/mp/fault_test.cc) starts there, and
# moves the ranks meant for host B into B's namespace.
#   two_hosts.sh in_host_a.sh PROGRAM [ARGS...]
set -euo pipefail
: "${CHORUS_RDMA_NETNS:?in_host_a.sh runs under two_hosts.sh}"
exec ip netns exec "${CHORUS_RDMA_NETNS%%,*}" "$@"
