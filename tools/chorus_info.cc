// SPDX-License-Identifier: Apache-2.0
// File: tools/chorus_info.cc
// chorus-info: what this Chorus build and this host offer — version, kernels, transports and
// network interfaces, RDMA devices and UCX's transports, the hwloc topology (NICs with their
// PCI bus id and NUMA node included), and every parameter with its value and description.
//   chorus-info                everything
//   chorus-info --params       parameters only
//   chorus-info --fabric       RDMA devices (ports, GIDs) and UCX's transports and devices only
//   chorus-info --tune [FILE]  measure the transports' alpha/beta, show the tuner's choices,
//                              and write them to FILE for CHORUS_TUNER_FILE
//   chorus-info --help         the options
//   chorus-info --topo FILE    the cluster a topology file describes (src/topo/README.md):
//                              hosts, rails, intra-host link, each rank's host, local index
//                              and rail, the host-aware ring's inter-host hops; exit 1 and
//                              the parse error ("FILE:LINE: expected ...") when it is invalid
#include <chorus/chorus.h>
#include <fmt/format.h>

#include <cstring>
#include <string>

#include "net/socket.h"
#include "common/params.h"
#include "common/process.h"
#include "kernels/reduce/reduce.h"
#include "tools/chorus_info_fabric.h"
#include "tools/chorus_info_topo.h"
#include "tools/chorus_info_tune.h"
#include "topo/topology.h"
#include "transports/registry.h"

namespace {

void print_params() {
  fmt::print("Parameters (CHORUS_<NAME>, NCCL_<alias> where NCCL has the same meaning):\n");
  for (const chorus::params::Param* p : chorus::params::all()) {
    std::string alias = p->nccl_alias() ? fmt::format(" (NCCL_{})", p->nccl_alias()) : "";
    fmt::print("  {:<28} = {:<12} [{}; default {}]{}\n      {}\n", p->env_name(), p->value_string(),
               p->source(), p->default_string(), alias, p->description());
  }
}

void print_transports() {
  using namespace chorus;
  fmt::print("Transports (registered; CHORUS_TRANSPORT=<name> forces one):\n");
  for (const TransportDesc* d : transports()) {
    const char* reach = d->caps.reach == TransportCaps::Reach::kSameProcess ? "one process"
                        : d->caps.reach == TransportCaps::Reach::kSameHost  ? "one host"
                                                                            : "any host";
    fmt::print("  {:<7} {}\n          reach: {}; declared cost {} us + bytes / {} GB/s{}{}\n",
               d->name, d->summary, reach, d->cost.alpha_us, d->cost.beta_gbps,
               d->caps.registration ? "; registers memory" : "",
               d->caps.one_sided_put ? "; one-sided put" : "");
    if (d->caps.opt_in)
      fmt::print("          opened only when CHORUS_TRANSPORT={} forces it or CHORUS_TUNER_FILE "
                 "measures it\n", d->name);
  }
  auto ifaces = net::list_interfaces();
  auto picked = net::pick_interface();
  // Addresses without a port: an interface has none (":0" read like a port to connect to).
  fmt::print("Network: interface {}\n",
             picked.ok() ? fmt::format("{} {}", picked->name, picked->addr.ip_string())
                         : picked.status().message());
  if (ifaces.ok()) {
    for (const auto& i : *ifaces)
      fmt::print("          candidate {} {}{}\n", i.name, i.addr.ip_string(), i.loopback ? " (loopback)" : "");
  }
  chorus::info::print_rdma_devices();
  chorus::info::print_ucx_resources();
}

constexpr const char* kUsage =
    "usage: {} [--params | --fabric | --tune [FILE] | --topo FILE | --help]\n";

int help(const char* self) {
  fmt::print(kUsage, self);
  fmt::print(
      "What this Chorus build and this host offer.\n"
      "  (no option)     everything: version and build, SIMD kernels, host and hwloc topology,\n"
      "                  transports and network interfaces, RDMA devices, UCX transports, the\n"
      "                  tuner (the cost model a communicator of this host measures, and the\n"
      "                  algorithm it picks per collective and size), every parameter\n"
      "  --params        every parameter (CHORUS_<NAME>, NCCL_<alias>) with its value, where\n"
      "                  the value came from, its default and what it does\n"
      "  --fabric        RDMA devices (ports, GIDs) and UCX's transports and devices only\n"
      "  --tune [FILE]   measure alpha/beta of every transport between two ranks, show the\n"
      "                  tuner's choices, and write them to FILE for CHORUS_TUNER_FILE\n"
      "  --topo FILE     the cluster a topology file (CHORUS_TOPO_FILE) describes: hosts, rails,\n"
      "                  each rank's host, local index and rail; exit 1 naming the line of\n"
      "                  an invalid file\n"
      "  -h, --help      this text\n"
      "TRACE logging (CHORUS_DEBUG=TRACE) needs a build with cmake -DCHORUS_ENABLE_TRACE=ON.\n");
  return 0;
}

int usage_error(const char* self, const std::string& what) {
  fmt::print(stderr, "chorus-info: {}\n", what);
  fmt::print(stderr, kUsage, self);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  const char* arg = argc > 1 ? argv[1] : nullptr;
  auto is = [arg](const char* name) { return arg != nullptr && std::strcmp(arg, name) == 0; };
  if (is("-h") || is("--help")) return help(argv[0]);
  if (is("--tune")) {
    if (argc > 3) return usage_error(argv[0], "--tune takes at most one FILE");
    return chorus::info::tune(argc > 2 ? argv[2] : nullptr);
  }
  if (is("--topo")) {
    if (argc != 3) return usage_error(argv[0], "--topo needs one FILE");
    return chorus::info::print_cluster(argv[2]);
  }
  if (is("--fabric")) {
    if (argc > 2) return usage_error(argv[0], fmt::format("unexpected argument '{}'", argv[2]));
    chorus::info::print_rdma_devices();
    chorus::info::print_ucx_resources();
    return 0;
  }
  bool params_only = is("--params");
  if (arg != nullptr && !params_only)
    return usage_error(argv[0], fmt::format("unknown option '{}'", arg));
  if (argc > 2) return usage_error(argv[0], fmt::format("unexpected argument '{}'", argv[2]));
  if (!params_only) {
    chorus::ProcessContext& process = chorus::ProcessContext::get();
    fmt::print("{}\n", chorusBuildInfo());
    fmt::print("Kernels: {}\n", chorus::kernels::kernels().isa);
    fmt::print("Host: {} (host id {:#018x})\n", process.hostname(), process.host_hash());
    auto topo = chorus::topo::load_summary();
    fmt::print("Topology (hwloc): {}\n",
               topo.ok() ? topo->to_string() : topo.status().message());
    print_transports();
    chorus::info::print_tuner();
  }
  print_params();
  return 0;
}
