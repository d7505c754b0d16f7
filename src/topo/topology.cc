// SPDX-License-Identifier: Apache-2.0
// File: src/topo/topology.cc
// load_summary(): one hwloc topology load (I/O devices kept: PCI devices, bridges on their way,
// and the OS devices of interest), reduced to counts and the list of network devices.
#include "topo/topology.h"

#include <fmt/format.h>
#include <hwloc.h>

#include <cstdlib>

namespace chorus::topo {

namespace {
int count(hwloc_topology_t t, hwloc_obj_type_t type) {
  int n = hwloc_get_nbobjs_by_type(t, type);
  return n < 0 ? 0 : n;
}

std::string bitmap_list(hwloc_const_bitmap_t set) {
  if (set == nullptr) return "";
  char* text = nullptr;
  if (hwloc_bitmap_list_asprintf(&text, set) < 0 || text == nullptr) return "";
  std::string out = text;
  std::free(text);  // hwloc allocates with malloc
  return out;
}

std::string join_ints(const std::vector<int>& v) {
  std::string out;
  for (int x : v) out += fmt::format("{}{}", out.empty() ? "" : ",", x);
  return out;
}

Nic read_nic(hwloc_topology_t t, hwloc_obj_t dev) {
  Nic nic;
  nic.name = dev->name ? dev->name : "";
  nic.openfabrics = dev->attr->osdev.type == HWLOC_OBJ_OSDEV_OPENFABRICS;
  for (unsigned i = 0; i < dev->infos_count; ++i) {
    const auto& kv = dev->infos[i];
    nic.info.emplace_back(kv.name ? kv.name : "", kv.value ? kv.value : "");
  }
  // The PCI device the OS device sits on, if any (virtual devices have none).
  for (hwloc_obj_t p = dev->parent; p != nullptr; p = p->parent) {
    if (p->type == HWLOC_OBJ_PCI_DEVICE) {
      const auto& pci = p->attr->pcidev;
      nic.pci_bus_id =
          fmt::format("{:04x}:{:02x}:{:02x}.{:x}", pci.domain, pci.bus, pci.dev, pci.func);
      nic.pci_link_gbps = pci.linkspeed;
      if (const char* name = hwloc_obj_get_info_by_name(p, "PCIDevice")) nic.pci_device = name;
      break;
    }
    if (p->type != HWLOC_OBJ_BRIDGE && p->type != HWLOC_OBJ_OS_DEVICE) break;
  }
  hwloc_obj_t near = hwloc_get_non_io_ancestor_obj(t, dev);
  if (near != nullptr) {
    if (near->nodeset != nullptr) {
      for (int node = hwloc_bitmap_first(near->nodeset); node >= 0;
           node = hwloc_bitmap_next(near->nodeset, node))
        nic.numa_nodes.push_back(node);
    }
    hwloc_obj_t pkg = near->type == HWLOC_OBJ_PACKAGE
                          ? near
                          : hwloc_get_ancestor_obj_by_type(t, HWLOC_OBJ_PACKAGE, near);
    // Above the packages (a device on the machine's root complex): local to the one package
    // its CPUs cover, if there is only one.
    if (pkg == nullptr && near->cpuset != nullptr &&
        hwloc_get_nbobjs_inside_cpuset_by_type(t, near->cpuset, HWLOC_OBJ_PACKAGE) == 1)
      pkg = hwloc_get_next_obj_inside_cpuset_by_type(t, near->cpuset, HWLOC_OBJ_PACKAGE, nullptr);
    if (pkg != nullptr) nic.package = static_cast<int>(pkg->os_index);
    nic.cpus = bitmap_list(near->cpuset);
  }
  return nic;
}
}  // namespace

std::string Nic::info_value(const std::string& key) const {
  for (const auto& [k, v] : info)
    if (k == key) return v;
  return "";
}

std::string Nic::to_string() const {
  std::string out = fmt::format("{} ({})", name, openfabrics ? "RDMA" : "network");
  if (!pci_bus_id.empty()) {
    out += " PCI " + pci_bus_id;
    if (!pci_device.empty()) out += " [" + pci_device + "]";
    if (pci_link_gbps > 0) out += fmt::format(" {:.1f} GB/s", pci_link_gbps);
  }
  out += numa_nodes.empty() ? ", NUMA ?" : ", NUMA " + join_ints(numa_nodes);
  out += package >= 0 ? fmt::format(", package {}", package) : ", any package";
  if (!cpus.empty()) out += ", CPUs " + cpus;
  std::string infos;
  for (const auto& [k, v] : info) infos += fmt::format("{}{}={}", infos.empty() ? "" : ", ", k, v);
  if (!infos.empty()) out += "; " + infos;
  return out;
}

std::string Summary::to_string() const {
  std::string out = fmt::format(
      "{} package(s), {} NUMA node(s), {} core(s), {} hardware thread(s), L3 {} MiB, "
      "memory {} MiB{}",
      packages, numa_nodes, cores, pus, l3_bytes >> 20, memory_bytes >> 20,
      cpu_model.empty() ? "" : ", " + cpu_model);
  if (nics.empty()) return out + "\n  NICs: none";
  for (const Nic& nic : nics) out += "\n  NIC " + nic.to_string();
  return out;
}

Result<Summary> load_summary(const std::string& xml) {
  hwloc_topology_t t;
  if (hwloc_topology_init(&t) != 0) return internal_error("hwloc_topology_init failed");
  // PCI devices, the bridges above them and the OS devices (network, openfabrics, block, GPU):
  // the same filter applies to a topology read from XML.
  hwloc_topology_set_io_types_filter(t, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
  // Without hwloc's "pci" component (libpciaccess): its Linux backend finds the PCI devices in
  // sysfs all the same, bus ids included; libpciaccess only adds device names from pci.ids, at
  // the price of parsing that file (a minute under ASan) and of allocations it never frees,
  // which LeakSanitizer reports against the plug-in once hwloc has unloaded it.
  hwloc_topology_set_components(t, HWLOC_TOPOLOGY_COMPONENTS_FLAG_BLACKLIST, "pci");
  if (!xml.empty() &&
      hwloc_topology_set_xmlbuffer(t, xml.data(), static_cast<int>(xml.size()) + 1) != 0) {
    hwloc_topology_destroy(t);
    return invalid_argument("hwloc cannot parse the topology XML");
  }
  if (hwloc_topology_load(t) != 0) {
    hwloc_topology_destroy(t);
    return internal_error("hwloc_topology_load failed");
  }
  Summary s;
  s.packages = count(t, HWLOC_OBJ_PACKAGE);
  s.numa_nodes = count(t, HWLOC_OBJ_NUMANODE);
  s.cores = count(t, HWLOC_OBJ_CORE);
  s.pus = count(t, HWLOC_OBJ_PU);
  for (int i = 0; i < count(t, HWLOC_OBJ_L3CACHE); ++i) {
    hwloc_obj_t o = hwloc_get_obj_by_type(t, HWLOC_OBJ_L3CACHE, i);
    if (o && o->attr && o->attr->cache.size > s.l3_bytes) s.l3_bytes = o->attr->cache.size;
  }
  hwloc_obj_t root = hwloc_get_root_obj(t);
  if (root) s.memory_bytes = root->total_memory;
  if (hwloc_obj_t pkg = hwloc_get_obj_by_type(t, HWLOC_OBJ_PACKAGE, 0)) {
    if (const char* model = hwloc_obj_get_info_by_name(pkg, "CPUModel")) s.cpu_model = model;
    while (!s.cpu_model.empty() && s.cpu_model.back() == ' ') s.cpu_model.pop_back();  // padded
  }
  for (hwloc_obj_t dev = hwloc_get_next_osdev(t, nullptr); dev != nullptr;
       dev = hwloc_get_next_osdev(t, dev)) {
    hwloc_obj_osdev_type_t type = dev->attr->osdev.type;
    if (type == HWLOC_OBJ_OSDEV_NETWORK || type == HWLOC_OBJ_OSDEV_OPENFABRICS)
      s.nics.push_back(read_nic(t, dev));
  }
  hwloc_topology_destroy(t);
  return s;
}

}  // namespace chorus::topo
