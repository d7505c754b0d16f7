// SPDX-License-Identifier: Apache-2.0
// The tuner planning on clusters this machine cannot build, from topology files
// (src/topo/cluster.h -> algo::model_of / shape_of): which AllReduce it picks at each size, and
// what its model predicts against the links' limits.
#include <catch2/catch.hpp>

#include "algo/tuner.h"
#include "topo/cluster.h"

namespace chorus::algo {
namespace {

topo::Cluster parse(const char* text) {
  auto c = topo::parse_cluster(text, "test.topo");
  REQUIRE(c.ok());
  return *c;
}

constexpr size_t kMiB = size_t{1} << 20;

// Every size from 8 B to 1 GiB: the choice is the model's cheapest algorithm.
void check_choices_are_cheapest(const CostModel& m, const Shape& shape) {
  for (size_t bytes = 8; bytes <= (size_t{1} << 30); bytes *= 4) {
    INFO(bytes << " bytes");
    const Algo chosen = choose(m, CollKind::kAllReduce, bytes, shape, 1).algo;
    const double t = predict_us(m, chosen, CollKind::kAllReduce, bytes, shape);
    for (Algo a : algorithms_for(CollKind::kAllReduce)) {
      INFO(algo_name(a));
      CHECK(t <= predict_us(m, a, CollKind::kAllReduce, bytes, shape));
    }
  }
}

TEST_CASE("plan: 2 hosts x 2 ranks on one 1 Gbit/s link, as on the test bed", "[topo][tuner]") {
  const topo::Cluster c = parse("intra 1us 8GB/s\nrail eth0 25us 1Gbit/s\nhosts 2 2\n");
  const CostModel m = model_of(c);
  const Shape shape = shape_of(c);
  CHECK(m.beta_gbps == Approx(0.125));
  CHECK(shape.nranks == 4);
  CHECK(shape.hosts == 2);
  CHECK(shape.local == 2);
  CHECK(shape.rails == 1);
  CHECK(choose(m, CollKind::kAllReduce, 64 * kMiB, shape, 1).algo == Algo::kHierarchical);
  // The model's algbw at 64 MiB: the hierarchical AllReduce within 10 % of the link's 0.125
  // GB/s (its bound), the host-aware ring at 2/3 of that.
  const double S = 64.0 * kMiB;
  const double hier = S / predict_us(m, Algo::kHierarchical, CollKind::kAllReduce, 64 * kMiB, shape) / 1e3;
  const double ring = S / predict_us(m, Algo::kRing, CollKind::kAllReduce, 64 * kMiB, shape) / 1e3;
  CHECK(hier >= 0.9 * 0.125);
  CHECK(hier <= 0.125);
  CHECK(ring / hier == Approx(2.0 / 3).epsilon(0.05));
  check_choices_are_cheapest(m, shape);
}

TEST_CASE("plan: 64 hosts x 8 ranks x 4 rails of 400 Gbit/s", "[topo][tuner]") {
  const topo::Cluster c = parse(
      "intra 0.7us 60GB/s\n"
      "rail mlx5_0 2us 400Gbit/s\nrail mlx5_1 2us 400Gbit/s\n"
      "rail mlx5_2 2us 400Gbit/s\nrail mlx5_3 2us 400Gbit/s\n"
      "hosts 64 8\n");
  const CostModel m = model_of(c);
  Shape shape = shape_of(c);
  CHECK(shape.nranks == 512);
  CHECK(shape.hosts == 64);
  CHECK(shape.local == 8);
  CHECK(shape.rails == 4);
  CHECK(c.rail_of(5) == 1);  // local rank 5 on rail 1
  for (size_t bytes : {64 * kMiB, 1024 * kMiB})
    CHECK(choose(m, CollKind::kAllReduce, bytes, shape, 1).algo == Algo::kHierarchical);
  // Its cross-host stage spreads over the four rails: one rail would be slower.
  Shape one_rail = shape;
  one_rail.rails = 1;
  CHECK(predict_us(m, Algo::kHierarchical, CollKind::kAllReduce, 1024 * kMiB, shape) <
        predict_us(m, Algo::kHierarchical, CollKind::kAllReduce, 1024 * kMiB, one_rail));
  check_choices_are_cheapest(m, shape);
}

TEST_CASE("plan: 64 hosts x 8 ranks x 4 rails of 100 Gbit/s, slower than memory", "[topo][tuner]") {
  const topo::Cluster c = parse(
      "intra 0.7us 60GB/s\n"
      "rail eth0 5us 100Gbit/s\nrail eth1 5us 100Gbit/s\n"
      "rail eth2 5us 100Gbit/s\nrail eth3 5us 100Gbit/s\n"
      "hosts 64 8\n");
  const CostModel m = model_of(c);
  const Shape shape = shape_of(c);
  // At 1 GiB the ring carries 2 (n-1)/n S over one rail per crossing; the hierarchical
  // AllReduce's eight flows per host share four rails and carry 2 (H-1)/H S / 8 each: more
  // than twice as fast, in the model, even with its two stages in memory.
  const double hier = predict_us(m, Algo::kHierarchical, CollKind::kAllReduce, 1024 * kMiB, shape);
  CHECK(predict_us(m, Algo::kRing, CollKind::kAllReduce, 1024 * kMiB, shape) / hier > 2.0);
  CHECK(choose(m, CollKind::kAllReduce, 1024 * kMiB, shape, 1).algo == Algo::kHierarchical);
  check_choices_are_cheapest(m, shape);
}

TEST_CASE("plan: hosts of different sizes fall back to flat algorithms", "[topo][tuner]") {
  const topo::Cluster c = parse("intra 1us 8GB/s\nrail eth0 25us 10Gbit/s\nhost a 2\nhost b 3\n");
  const Shape shape = shape_of(c);
  CHECK(shape.local == 0);
  CHECK(choose(model_of(c), CollKind::kAllReduce, 64 * kMiB, shape, 1).algo != Algo::kHierarchical);
  check_choices_are_cheapest(model_of(c), shape);
}

}  // namespace
}  // namespace chorus::algo
