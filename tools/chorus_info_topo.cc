// SPDX-License-Identifier: Apache-2.0
// File: tools/chorus_info_topo.cc
// chorus-info --topo FILE: what Chorus makes of a topology file, for planning on clusters this
// machine cannot build. One line per rank, so scripts can check the placement with awk.
#include "tools/chorus_info_topo.h"

#include <fmt/format.h>

#include <cstdio>
#include <string>
#include <vector>

#include "algo/tuner.h"
#include "topo/cluster.h"

namespace chorus::info {

namespace {

// The tuner's AllReduce choices on the cluster, with the model's times: what a job there would
// run, beside the host-aware ring.
void print_plan(const topo::Cluster& c) {
  const algo::CostModel model = algo::model_of(c);
  const algo::Shape shape = algo::shape_of(c);
  fmt::print("AllReduce plan (the tuner's model from the file: {}):\n", model.to_string());
  fmt::print("  {:>12}  {:<8} {:>14} {:>12} {:>16}\n", "bytes", "choice", "predicted us",
             "algbw GB/s", "ring / choice");
  for (size_t bytes = 8; bytes <= (size_t{1} << 30); bytes *= 16) {
    const algo::Choice choice = algo::choose(model, CollKind::kAllReduce, bytes, shape, 1);
    const double t = algo::predict_us(model, choice.algo, CollKind::kAllReduce, bytes, shape);
    const double ring = algo::predict_us(model, algo::Algo::kRing, CollKind::kAllReduce, bytes, shape);
    std::string name = algo::algo_name(choice.algo);
    if (choice.algo == algo::Algo::kHierarchical)
      name += fmt::format(" ({} across)", algo::algo_name(algo::across_hosts_algo(model, bytes, shape)));
    fmt::print("  {:>12}  {:<8} {:>14.1f} {:>12.3f} {:>15.2f}x\n", bytes, name, t,
               t > 0 ? static_cast<double>(bytes) / t / 1e3 : 0.0, t > 0 ? ring / t : 1.0);
  }
}

}  // namespace

int print_cluster(const char* path) {
  auto parsed = topo::read_cluster_file(path);
  if (!parsed.ok()) {
    fmt::print(stderr, "chorus-info: {}\n", parsed.status().message());
    return 1;
  }
  const topo::Cluster& c = *parsed;
  const int per_host = c.ranks_per_host();
  fmt::print("Cluster {}: {} host(s), {} rank(s) ({}), {} rail(s)\n", path, c.hosts().size(),
             c.nranks(), per_host > 0 ? fmt::format("{} per host", per_host) : "hosts differ",
             c.rails().size());
  fmt::print("Intra-host link: {} us + bytes / {} GB/s\n", c.intra().alpha_us,
             c.intra().gbytes_per_s);
  fmt::print("Rails (every host has each; a rank sends on rail <local index> mod {}):\n",
             c.rails().size());
  for (size_t i = 0; i < c.rails().size(); ++i) {
    const topo::Rail& rail = c.rails()[i];
    fmt::print("  {:>3}  {:<12} {} us + bytes / {} Gbit/s ({} GB/s)\n", i, rail.name, rail.alpha_us,
               rail.gbits_per_s, rail.gbits_per_s / 8);
  }
  fmt::print("Hosts:\n");
  for (size_t h = 0; h < c.hosts().size(); ++h) {
    const int first = c.first_rank(static_cast<int>(h));
    const int n = c.hosts()[h].ranks;
    fmt::print("  {:>5}  {:<12} {} rank(s): {}\n", h, c.hosts()[h].name, n,
               n == 1 ? fmt::format("{}", first) : fmt::format("{}-{}", first, first + n - 1));
  }
  fmt::print("Ranks:\n  {:>5}  {:<12} {:>5}  {}\n", "rank", "host", "local", "rail");
  for (int r = 0; r < c.nranks(); ++r) {
    fmt::print("  {:>5}  {:<12} {:>5}  {}\n", r, c.hosts()[c.host_of(r)].name, c.local_index(r),
               c.rails()[c.rail_of(r)].name);
  }
  const std::vector<uint64_t> host = c.host_of_rank();
  fmt::print(
      "Ring (hosts in the order of their lowest rank, each host's ranks adjacent): {} "
      "inter-host hop(s) over {} rank(s)\n",
      topo::inter_host_hops(topo::host_ring_order(host), host), c.nranks());
  print_plan(c);
  return 0;
}

}  // namespace chorus::info
