// SPDX-License-Identifier: Apache-2.0
// File: src/topo/topology.h
// The host's topology as hwloc sees it: packages, NUMA nodes, cores, hardware threads, caches,
// and the network devices (Ethernet interfaces, RDMA devices) with the NUMA nodes and package
// they hang off. Used by chorus-info now and by ring ordering and NIC affinity later.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "common/status.h"

namespace chorus::topo {

// One network device: an OS device hwloc classes as network (eth0, ib0) or openfabrics
// (mlx5_0, rxe0).
struct Nic {
  std::string name;          // eth0, mlx5_0
  bool openfabrics = false;  // an RDMA device (verbs) rather than a network interface
  std::string pci_bus_id;    // "0000:00:03.0"; empty for virtual devices (lo, rxe over veth)
  std::string pci_device;    // the PCI device's name (from a topology XML; load_summary()
                             // of this host leaves it empty: no pci.ids lookup)
  float pci_link_gbps = 0;   // PCI link speed in GB/s as hwloc reports it (0: unknown)
  // Locality: the NUMA nodes (OS indices) and package (OS index) of the device's closest
  // non-I/O ancestor. A device attached above the packages is local to the package its CPUs
  // cover when there is one package, and to none (-1) when there are several.
  std::vector<int> numa_nodes;
  int package = -1;
  std::string cpus;  // that ancestor's cpuset as a list, e.g. "0-15"
  // hwloc's info attributes of the OS device, in hwloc's order: Address and Port (network),
  // NodeGUID, SysImageGUID, Port1State, Port1LID, Port1GID0 ... (openfabrics).
  std::vector<std::pair<std::string, std::string>> info;
  // The value of info attribute `key`, or empty.
  std::string info_value(const std::string& key) const;
  // "mlx5_0 (RDMA) PCI 0000:81:00.0 [ConnectX-6] 31.5 GB/s, NUMA 1, package 0, CPUs 8-15;
  //  NodeGUID=..., Port1State=4"
  std::string to_string() const;
};

struct Summary {
  int packages = 0;
  int numa_nodes = 0;
  int cores = 0;
  int pus = 0;                      // hardware threads
  unsigned long long l3_bytes = 0;  // largest L3 (0 if none)
  unsigned long long memory_bytes = 0;
  std::string cpu_model;
  std::vector<Nic> nics;  // in hwloc's order (PCI bus order, then virtual devices)
  // One line of counts, then one indented line per NIC ("NICs: none" when there is none).
  std::string to_string() const;
};

// Loads the topology of this host (or of the hwloc XML in `xml`, for tests), I/O devices
// included.
Result<Summary> load_summary(const std::string& xml = "");

}  // namespace chorus::topo
