// SPDX-License-Identifier: Apache-2.0
// File: tools/chorus_info_topo.h
// `chorus-info --topo FILE`: a cluster described by a topology file (src/topo/cluster.h).
#pragma once

namespace chorus::info {

// Parses the topology file at `path` and prints its intra-host link, rails, hosts, one line per
// rank (host, local index, rail) and the host-aware ring's inter-host hops. Returns the exit
// status: 0, or 1 (the parse error printed on stderr).
int print_cluster(const char* path);

}  // namespace chorus::info
