// SPDX-License-Identifier: Apache-2.0
// File: src/algo/tuner_topo.cc
// The tuner's view of a cluster described by a topology file (tuner.h: model_of, shape_of).
#include <algorithm>

#include "algo/tuner.h"
#include "topo/cluster.h"

namespace chorus::algo {

CostModel model_of(const topo::Cluster& cluster) {
  CostModel m;
  const auto& rails = cluster.rails();
  const auto slowest = std::min_element(rails.begin(), rails.end(), [](const auto& a, const auto& b) {
    return a.gbits_per_s < b.gbits_per_s;
  });
  m.alpha_us = slowest->alpha_us;
  m.beta_gbps = slowest->gbits_per_s / 8;
  m.intra_alpha_us = cluster.intra().alpha_us;
  m.intra_beta_gbps = cluster.intra().gbytes_per_s;
  // Folding streams memory as the intra-host link does: the same figure.
  m.gamma_gbps = cluster.intra().gbytes_per_s;
  m.source = "topology file";
  return m;
}

Shape shape_of(const topo::Cluster& cluster) {
  return Shape{cluster.nranks(), static_cast<int>(cluster.hosts().size()),
               cluster.ranks_per_host(), static_cast<int>(cluster.rails().size())};
}

}  // namespace chorus::algo
