// SPDX-License-Identifier: Apache-2.0
// File: src/topo/topology.h
// The host's topology as hwloc sees it: packages, NUMA nodes, cores, hardware threads, caches.
// Used by chorus-info now and by ring ordering and NIC affinity later.
#pragma once

#include <string>

#include "common/status.h"

namespace chorus::topo {

struct Summary {
  int packages = 0;
  int numa_nodes = 0;
  int cores = 0;
  int pus = 0;  // hardware threads
  unsigned long long l3_bytes = 0;  // largest L3 (0 if none)
  unsigned long long memory_bytes = 0;
  std::string cpu_model;
  std::string to_string() const;
};

// Loads the topology of this host (or of the hwloc XML in `xml`, for tests).
Result<Summary> load_summary(const std::string& xml = "");

}  // namespace chorus::topo
