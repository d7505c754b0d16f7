// SPDX-License-Identifier: Apache-2.0
#include "topo/topology.h"

#include <fmt/format.h>
#include <hwloc.h>

namespace chorus::topo {

namespace {
int count(hwloc_topology_t t, hwloc_obj_type_t type) {
  int n = hwloc_get_nbobjs_by_type(t, type);
  return n < 0 ? 0 : n;
}
}  // namespace

std::string Summary::to_string() const {
  return fmt::format("{} package(s), {} NUMA node(s), {} core(s), {} hardware thread(s), L3 {} "
                     "MiB, memory {} MiB{}",
                     packages, numa_nodes, cores, pus, l3_bytes >> 20, memory_bytes >> 20,
                     cpu_model.empty() ? "" : ", " + cpu_model);
}

Result<Summary> load_summary(const std::string& xml) {
  hwloc_topology_t t;
  if (hwloc_topology_init(&t) != 0) return internal_error("hwloc_topology_init failed");
  if (!xml.empty() && hwloc_topology_set_xmlbuffer(t, xml.data(), static_cast<int>(xml.size()) + 1) != 0) {
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
  }
  hwloc_topology_destroy(t);
  return s;
}

}  // namespace chorus::topo
