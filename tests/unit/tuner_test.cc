// SPDX-License-Identifier: Apache-2.0
// The tuner's cost model and choices on communicators of several shapes (src/algo/tuner.h):
// flat on one host, hierarchical across hosts of equal size, never hierarchical otherwise.
#include <catch2/catch.hpp>

#include "algo/tuner.h"
#include "support/scoped_env.h"

namespace chorus::algo {
namespace {

// Hosts joined by 1 Gbit/s Ethernet (0.125 GB/s, 25 us), shared memory within (8 GB/s, 1 us).
CostModel ethernet() {
  CostModel m;
  m.alpha_us = 25;
  m.beta_gbps = 0.125;
  m.gamma_gbps = 10;
  m.intra_alpha_us = 1;
  m.intra_beta_gbps = 8;
  return m;
}

constexpr size_t kMiB = size_t{1} << 20;

TEST_CASE("one host: the hierarchical AllReduce is never predicted or chosen", "[tuner]") {
  const CostModel m = ethernet();
  for (int n : {2, 4, 8}) {
    CHECK(predict_us(m, Algo::kHierarchical, CollKind::kAllReduce, 64 * kMiB, Shape::flat(n)) >= 1e29);
    CHECK(choose(m, CollKind::kAllReduce, 64 * kMiB, Shape::flat(n), 1).algo != Algo::kHierarchical);
    CHECK(host_link_share(Shape::flat(n)) == 1.0);
  }
}

TEST_CASE("2 hosts x 2 ranks: hierarchical for large AllReduce, at 2/3 of the ring's time",
          "[tuner]") {
  const CostModel m = ethernet();
  const Shape shape{4, 2, 2};
  const double hier = predict_us(m, Algo::kHierarchical, CollKind::kAllReduce, 64 * kMiB, shape);
  const double ring = predict_us(m, Algo::kRing, CollKind::kAllReduce, 64 * kMiB, shape);
  // The host's link carries S each way against the ring's 2 (n-1)/n S = 1.5 S.
  CHECK(hier / ring == Approx(2.0 / 3).epsilon(0.02));
  CHECK(choose(m, CollKind::kAllReduce, 64 * kMiB, shape, 1).algo == Algo::kHierarchical);
  CHECK(choose(m, CollKind::kAllReduce, 4 * kMiB, shape, 1).algo == Algo::kHierarchical);
  // Two ranks of a host share its link for a direct exchange: 2 x 2 / 3 of one rank's figure.
  CHECK(host_link_share(shape) == Approx(4.0 / 3));
  CHECK(predict_us(m, Algo::kTwoShot, CollKind::kAllReduce, 64 * kMiB, shape) >
        predict_us(m, Algo::kTwoShot, CollKind::kAllReduce, 64 * kMiB, Shape::flat(4)));
}

TEST_CASE("2 hosts x 2 ranks: hierarchical ReduceScatter and AllGather for large calls",
          "[tuner]") {
  const CostModel m = ethernet();
  const Shape shape{4, 2, 2};
  for (CollKind coll : {CollKind::kReduceScatter, CollKind::kAllGather}) {
    // The host's link carries (H-1)/H = 1/2 of the buffer each way against the ring's 3/4.
    const double hier = predict_us(m, Algo::kHierarchical, coll, 64 * kMiB, shape);
    const double ring = predict_us(m, Algo::kRing, coll, 64 * kMiB, shape);
    CHECK(hier / ring == Approx(2.0 / 3).epsilon(0.05));
    CHECK(choose(m, coll, 64 * kMiB, shape, 1).algo == Algo::kHierarchical);
    CHECK(choose(m, coll, 64 * kMiB, Shape::flat(4), 1).algo != Algo::kHierarchical);
  }
}

TEST_CASE("hosts of different sizes never get the hierarchical AllReduce", "[tuner]") {
  const CostModel m = ethernet();
  const Shape uneven{3, 2, 0};
  CHECK(choose(m, CollKind::kAllReduce, 64 * kMiB, uneven, 1).algo != Algo::kHierarchical);
  chorus::test::ScopedEnv forced("CHORUS_ALGO", "allreduce:hier");
  CHECK(choose(m, CollKind::kAllReduce, 64 * kMiB, uneven, 1).algo == Algo::kRing);
  CHECK(choose(m, CollKind::kAllReduce, 64 * kMiB, Shape{4, 2, 2}, 1).algo == Algo::kHierarchical);
  CHECK(choose(m, CollKind::kAllReduce, 64 * kMiB, Shape{4, 4, 1}, 1).algo == Algo::kRing);
}

TEST_CASE("64 hosts x 8 ranks: hierarchical at large sizes, a bandwidth algorithm across hosts",
          "[tuner]") {
  const CostModel m = ethernet();
  const Shape shape{512, 64, 8};
  CHECK(choose(m, CollKind::kAllReduce, 256 * kMiB, shape, 1).algo == Algo::kHierarchical);
  const Algo across = across_hosts_algo(m, 256 * kMiB, shape);
  CHECK((across == Algo::kRing || across == Algo::kHalvingDoubling));
  // Small messages: latency decides; whatever the choice, the model puts it no slower than the
  // ring.
  const Choice small = choose(m, CollKind::kAllReduce, 64, shape, 1);
  CHECK(predict_us(m, small.algo, CollKind::kAllReduce, 64, shape) <=
        predict_us(m, Algo::kRing, CollKind::kAllReduce, 64, shape));
}

// AlltoAll carries the same bytes across hosts either way; the hierarchical one sends H - 1
// messages across per rank instead of n - L, at the price of a pass over shared memory.
TEST_CASE("hierarchical AlltoAll: chosen where messages across hosts cost, never on one host",
          "[tuner]") {
  const CostModel m = ethernet();
  const Shape big{512, 64, 8};
  // 16 KiB per rank (32-byte blocks): a host sends 128 KiB across, 1 ms at 1 Gbit/s, while
  // the flat one's 510 messages after the first, at a quarter alpha each, cost 3.2 ms; the
  // hierarchical one sends 62 across and 7 x 64 within at 1 us.
  const double hier = predict_us(m, Algo::kHierarchical, CollKind::kAlltoAll, 16 << 10, big);
  const double flat = predict_us(m, Algo::kPairwise, CollKind::kAlltoAll, 16 << 10, big);
  CHECK(hier < flat / 2);
  CHECK(choose(m, CollKind::kAlltoAll, 16 << 10, big, 1).algo == Algo::kHierarchical);
  // Very large blocks: both are bound by the host's link; the extra pass costs more than the
  // messages it saves.
  CHECK(choose(m, CollKind::kAlltoAll, 1024 * kMiB, Shape{4, 2, 2}, 1).algo == Algo::kPairwise);
  for (int n : {2, 4, 8}) {
    CHECK(predict_us(m, Algo::kHierarchical, CollKind::kAlltoAll, kMiB, Shape::flat(n)) >= 1e29);
    CHECK(choose(m, CollKind::kAlltoAll, kMiB, Shape::flat(n), 1).algo != Algo::kHierarchical);
  }
  CHECK(choose(m, CollKind::kAlltoAll, kMiB, Shape{3, 2, 0}, 1).algo != Algo::kHierarchical);
  chorus::test::ScopedEnv forced("CHORUS_ALGO", "alltoall:hier");
  CHECK(choose(m, CollKind::kAlltoAll, kMiB, Shape{4, 2, 2}, 1).algo == Algo::kHierarchical);
}

TEST_CASE("hierarchical Broadcast: chosen across hosts of equal size, pipelined in pieces",
          "[tuner]") {
  const CostModel m = ethernet();
  for (const Shape& shape : {Shape{4, 2, 2}, Shape{6, 3, 2}, Shape{6, 2, 3}}) {
    CAPTURE(shape.hosts, shape.local);
    // 64 MiB: the chain across hosts carries it once (128 chunks of 512 KiB) with H - 2 hops
    // to fill, against n - 2 for the chain through every rank; the host's ranks get it in 8
    // pieces over shared memory while the next pieces cross.
    const double hier = predict_us(m, Algo::kHierarchical, CollKind::kBroadcast, 64 * kMiB, shape);
    const double chain = predict_us(m, Algo::kChain, CollKind::kBroadcast, 64 * kMiB, shape);
    CHECK(hier < chain);
    CHECK(hier / chain > 0.95);  // the network bounds both: S / beta
    CHECK(choose(m, CollKind::kBroadcast, 64 * kMiB, shape, 1).algo == Algo::kHierarchical);
    const RootedPlan plan = hier_rooted_plan(m, CollKind::kBroadcast, 64 * kMiB, shape);
    // Between two hosts the tree is one message per piece (fewer latencies than the chain's
    // chunks); through three, the chain (a tree would send each piece twice from the root).
    CHECK(plan.across == (shape.hosts > 2 ? Algo::kChain : Algo::kTree));
    CHECK(plan.pieces == 8);
    // Small calls: one piece, and no slower than the flat tree under the model.
    const RootedPlan small = hier_rooted_plan(m, CollKind::kBroadcast, 4096, shape);
    CHECK(small.pieces == 1);
    CHECK(predict_us(m, Algo::kHierarchical, CollKind::kBroadcast, 4096, shape) <
          predict_us(m, Algo::kTree, CollKind::kBroadcast, 4096, shape));
  }
  // 64 hosts: a tree across them for small calls, the chain for large ones.
  const Shape big{512, 64, 8};
  CHECK(hier_rooted_plan(m, CollKind::kBroadcast, 64, big).across == Algo::kTree);
  CHECK(hier_rooted_plan(m, CollKind::kBroadcast, 256 * kMiB, big).across == Algo::kChain);
  CHECK(choose(m, CollKind::kBroadcast, 256 * kMiB, big, 1).algo == Algo::kHierarchical);
}

TEST_CASE("hierarchical Broadcast: never on one host or hosts of different sizes", "[tuner]") {
  const CostModel m = ethernet();
  for (int n : {2, 4, 8}) {
    CHECK(predict_us(m, Algo::kHierarchical, CollKind::kBroadcast, 64 * kMiB, Shape::flat(n)) >= 1e29);
    CHECK(choose(m, CollKind::kBroadcast, 64 * kMiB, Shape::flat(n), 1).algo != Algo::kHierarchical);
  }
  const Shape uneven{3, 2, 0};
  CHECK(choose(m, CollKind::kBroadcast, 64 * kMiB, uneven, 1).algo != Algo::kHierarchical);
  CHECK(choose(m, CollKind::kBroadcast, 64 * kMiB, Shape{4, 4, 1}, 1).algo != Algo::kHierarchical);
  chorus::test::ScopedEnv forced("CHORUS_ALGO", "broadcast:hier");
  CHECK(choose(m, CollKind::kBroadcast, 64 * kMiB, Shape{4, 2, 2}, 1).algo == Algo::kHierarchical);
  // Forced where it cannot run: the flat fallback (run.cc maps it to the chain).
  CHECK(choose(m, CollKind::kBroadcast, 64 * kMiB, uneven, 1).algo == Algo::kRing);
}

TEST_CASE("hierarchical Reduce: the Broadcast's stages in the other order", "[tuner]") {
  const CostModel m = ethernet();
  for (const Shape& shape : {Shape{4, 2, 2}, Shape{6, 3, 2}, Shape{6, 2, 3}}) {
    CAPTURE(shape.hosts, shape.local);
    const double hier = predict_us(m, Algo::kHierarchical, CollKind::kReduce, 64 * kMiB, shape);
    const double chain = predict_us(m, Algo::kChain, CollKind::kReduce, 64 * kMiB, shape);
    CHECK(hier < chain);
    CHECK(choose(m, CollKind::kReduce, 64 * kMiB, shape, 1).algo == Algo::kHierarchical);
    CHECK(hier_rooted_plan(m, CollKind::kReduce, 64 * kMiB, shape).pieces == 8);
  }
  for (int n : {2, 4, 8}) {
    CHECK(predict_us(m, Algo::kHierarchical, CollKind::kReduce, 64 * kMiB, Shape::flat(n)) >= 1e29);
    CHECK(choose(m, CollKind::kReduce, 64 * kMiB, Shape::flat(n), 1).algo != Algo::kHierarchical);
  }
  CHECK(choose(m, CollKind::kReduce, 64 * kMiB, Shape{3, 2, 0}, 1).algo != Algo::kHierarchical);
  chorus::test::ScopedEnv forced("CHORUS_ALGO", "reduce:hier");
  CHECK(choose(m, CollKind::kReduce, 64 * kMiB, Shape{4, 2, 2}, 1).algo == Algo::kHierarchical);
  CHECK(choose(m, CollKind::kReduce, 64 * kMiB, Shape{3, 2, 0}, 1).algo == Algo::kRing);
}

TEST_CASE("small messages among ranks of one host go through the boxes", "[tuner]") {
  const CostModel m = ethernet();
  Shape boxes = Shape::flat(4);
  boxes.box_bytes = 4096;
  // AllReduce, Broadcast and Reduce send their whole buffer; the others one block of n.
  CHECK(choose(m, CollKind::kAllReduce, 8, boxes, 1).algo == Algo::kBox);
  CHECK(choose(m, CollKind::kAllReduce, 4096, boxes, 1).algo == Algo::kBox);
  CHECK(choose(m, CollKind::kAllReduce, 4100, boxes, 1).algo != Algo::kBox);
  CHECK(choose(m, CollKind::kBroadcast, 4096, boxes, 1).algo == Algo::kBox);
  CHECK(choose(m, CollKind::kReduce, 8192, boxes, 1).algo != Algo::kBox);
  for (CollKind c : {CollKind::kReduceScatter, CollKind::kAllGather, CollKind::kAlltoAll,
                     CollKind::kGather, CollKind::kScatter}) {
    CHECK(choose(m, c, 4 * 4096, boxes, 1).algo == Algo::kBox);
    CHECK(choose(m, c, 4 * 4096 + 4, boxes, 1).algo != Algo::kBox);
  }
  CHECK(box_message_bytes(CollKind::kAlltoAll, 64, 4) == 16);
  CHECK(box_message_bytes(CollKind::kBroadcast, 64, 4) == 64);
  // No boxes (another host, a transport without them, CHORUS_BOX_BYTES=0), or one rank: never.
  CHECK(choose(m, CollKind::kAllReduce, 8, Shape::flat(4), 1).algo != Algo::kBox);
  Shape one = Shape::flat(1);
  one.box_bytes = 4096;
  CHECK(choose(m, CollKind::kAllReduce, 8, one, 1).algo != Algo::kBox);
  // Forced where they do not fit: the model's choice among the others.
  chorus::test::ScopedEnv forced("CHORUS_ALGO", "box");
  CHECK(choose(m, CollKind::kAllGather, 64, boxes, 1).algo == Algo::kBox);
  CHECK(choose(m, CollKind::kAllReduce, 64, Shape::flat(4), 1).algo != Algo::kBox);
  CHECK(choose(m, CollKind::kAllReduce, 1 << 20, boxes, 1).algo != Algo::kBox);
}

}  // namespace
}  // namespace chorus::algo
