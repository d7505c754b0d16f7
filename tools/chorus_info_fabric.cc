// SPDX-License-Identifier: Apache-2.0
// File: tools/chorus_info_fabric.cc
// chorus-info's fabric section: the RDMA devices libibverbs sees (ports, state, link layer,
// active MTU, every valid GID with its type and address), and the transports and devices UCX
// sees (uct's component -> memory domain -> transport resource query, as `ucx_info -d` walks
// them). A host without either says so on one line.
#include "tools/chorus_info_fabric.h"

#include <arpa/inet.h>
#include <fmt/format.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#if CHORUS_HAVE_VERBS
#include <infiniband/verbs.h>
#endif
#if CHORUS_HAVE_UCX
#include <uct/api/uct.h>
#endif

namespace chorus::info {

namespace {

#if CHORUS_HAVE_VERBS
const char* link_layer_name(uint8_t layer) {
  switch (layer) {
    case IBV_LINK_LAYER_INFINIBAND: return "InfiniBand";
    case IBV_LINK_LAYER_ETHERNET: return "Ethernet";
    default: return "unspecified";
  }
}

const char* gid_type_name(uint32_t type) {
  switch (type) {
    case IBV_GID_TYPE_IB: return "IB";
    case IBV_GID_TYPE_ROCE_V1: return "RoCE v1";
    case IBV_GID_TYPE_ROCE_V2: return "RoCE v2";
    default: return "unknown";
  }
}

int mtu_bytes(ibv_mtu mtu) { return mtu >= IBV_MTU_256 && mtu <= IBV_MTU_4096 ? 128 << mtu : 0; }

// "fe80::5054:ff:fe12:3456", or "::ffff:10.0.2.15" for an IPv4-mapped GID.
std::string gid_address(const ibv_gid& gid) {
  char text[INET6_ADDRSTRLEN] = {};
  if (inet_ntop(AF_INET6, gid.raw, text, sizeof(text)) == nullptr) return "?";
  return text;
}

void print_device(ibv_device* dev) {
  const char* name = ibv_get_device_name(dev);
  ibv_context* ctx = ibv_open_device(dev);
  if (ctx == nullptr) {
    fmt::print("  {}: cannot open it: {}\n", name, std::strerror(errno));
    return;
  }
  ibv_device_attr attr{};
  if (ibv_query_device(ctx, &attr) != 0) {
    fmt::print("  {}: ibv_query_device failed: {}\n", name, std::strerror(errno));
    ibv_close_device(ctx);
    return;
  }
  fmt::print("  {} ({}), firmware {}, {} port(s)\n", name,
             ibv_node_type_str(dev->node_type), attr.fw_ver, attr.phys_port_cnt);
  size_t gid_slots = 0;
  for (uint8_t port = 1; port <= attr.phys_port_cnt; ++port) {
    ibv_port_attr pa{};
    if (ibv_query_port(ctx, port, &pa) != 0) {
      fmt::print("    port {}: ibv_query_port failed: {}\n", port, std::strerror(errno));
      continue;
    }
    gid_slots += static_cast<size_t>(pa.gid_tbl_len);
    fmt::print("    port {}: {}, link layer {}, active MTU {} (max {}){}\n", port,
               ibv_port_state_str(pa.state), link_layer_name(pa.link_layer),
               mtu_bytes(pa.active_mtu), mtu_bytes(pa.max_mtu),
               pa.link_layer == IBV_LINK_LAYER_INFINIBAND ? fmt::format(", LID {:#x}", pa.lid)
                                                          : std::string());
  }
  // Valid entries only, every port, with their types (rdma-core 32+).
  std::vector<ibv_gid_entry> gids(gid_slots);
  ssize_t n = gids.empty() ? 0 : ibv_query_gid_table(ctx, gids.data(), gids.size(), 0);
  if (n < 0) {
    fmt::print("    GIDs: ibv_query_gid_table failed: {}\n", std::strerror(static_cast<int>(-n)));
  } else if (n == 0) {
    fmt::print("    GIDs: none (no address on the device's network interface?)\n");
  }
  for (ssize_t i = 0; i < n; ++i) {
    const ibv_gid_entry& g = gids[static_cast<size_t>(i)];
    fmt::print("    port {} GID[{}] {:<7} {}\n", g.port_num, g.gid_index, gid_type_name(g.gid_type),
               gid_address(g.gid));
  }
  ibv_close_device(ctx);
}
#endif  // CHORUS_HAVE_VERBS

#if CHORUS_HAVE_UCX
const char* device_type_name(uct_device_type_t type) {
  switch (type) {
    case UCT_DEVICE_TYPE_NET: return "network";
    case UCT_DEVICE_TYPE_SHM: return "shared memory";
    case UCT_DEVICE_TYPE_ACC: return "accelerator";
    case UCT_DEVICE_TYPE_SELF: return "loopback";
    default: return "other";
  }
}

// The transport resources of one memory domain; the number printed.
int print_md(uct_component_h component, const char* md_name) {
  uct_md_config_t* config = nullptr;
  if (uct_md_config_read(component, nullptr, nullptr, &config) != UCS_OK) return 0;
  uct_md_h md = nullptr;
  ucs_status_t st = uct_md_open(component, md_name, config, &md);
  uct_config_release(config);
  if (st != UCS_OK) {
    fmt::print("  {:<12} cannot open: {}\n", md_name, ucs_status_string(st));
    return 0;
  }
  uct_tl_resource_desc_t* resources = nullptr;
  unsigned count = 0;
  int printed = 0;
  if (uct_md_query_tl_resources(md, &resources, &count) == UCS_OK) {
    for (unsigned i = 0; i < count; ++i) {
      fmt::print("  {:<12} {:<10} {:<14} ({})\n", md_name, resources[i].tl_name,
                 resources[i].dev_name, device_type_name(resources[i].dev_type));
      ++printed;
    }
    uct_release_tl_resource_list(resources);
  }
  uct_md_close(md);
  return printed;
}
#endif  // CHORUS_HAVE_UCX

}  // namespace

void print_rdma_devices() {
#if CHORUS_HAVE_VERBS
  int n = 0;
  errno = 0;
  ibv_device** devs = ibv_get_device_list(&n);
  if (devs == nullptr || n == 0) {
    const int err = errno;
    fmt::print("RDMA devices (libibverbs): none{}\n",
               devs == nullptr && err != 0
                   ? fmt::format(" (ibv_get_device_list: {})", std::strerror(err))
                   : std::string());
    if (devs != nullptr) ibv_free_device_list(devs);
    return;
  }
  fmt::print("RDMA devices (libibverbs): {} (the verbs transport is opt-in: "
             "CHORUS_TRANSPORT=VERBS; NCCL_IB_HCA and NCCL_IB_GID_INDEX choose)\n",
             n);
  for (int i = 0; i < n; ++i) print_device(devs[i]);
  ibv_free_device_list(devs);
#else
  fmt::print("RDMA devices: not in this build (libibverbs was not found)\n");
#endif
}

void print_ucx_resources() {
#if CHORUS_HAVE_UCX
  uct_component_h* components = nullptr;
  unsigned ncomponents = 0;
  if (uct_query_components(&components, &ncomponents) != UCS_OK) {
    fmt::print("UCX transports (uct): none (uct_query_components failed)\n");
    return;
  }
  fmt::print("UCX transports (uct; memory domain, transport, device; UCX_TLS and UCX_NET_DEVICES "
             "choose):\n");
  int total = 0;
  for (unsigned c = 0; c < ncomponents; ++c) {
    uct_component_attr_t attr{};
    attr.field_mask = UCT_COMPONENT_ATTR_FIELD_NAME | UCT_COMPONENT_ATTR_FIELD_MD_RESOURCE_COUNT;
    if (uct_component_query(components[c], &attr) != UCS_OK) continue;
    std::vector<uct_md_resource_desc_t> mds(attr.md_resource_count);
    attr.field_mask = UCT_COMPONENT_ATTR_FIELD_MD_RESOURCES;
    attr.md_resources = mds.data();
    if (!mds.empty() && uct_component_query(components[c], &attr) != UCS_OK) continue;
    for (const uct_md_resource_desc_t& md : mds) total += print_md(components[c], md.md_name);
  }
  uct_release_component_list(components);
  if (total == 0) fmt::print("  none\n");
#else
  fmt::print("UCX transports: not in this build (UCX was not found)\n");
#endif
}

}  // namespace chorus::info
