// SPDX-License-Identifier: Apache-2.0
// File: tests/ranks/ep_test.cc
// MoE dispatch and combine (include/chorus/ep.h), normal and low-latency mode, ranks as threads:
// every routing and dispatch datatype checked on every rank against a reference each rank
// computes from the regenerated inputs of all ranks (tests/support/ep_check.h, ep_ll_check.h;
// processes: tests/mp), and bad input refused on every rank with the communicator usable
// afterwards.
#include <nccl.h>

#include <catch2/catch.hpp>
#include <string>

#include "support/ep_check.h"
#include "support/ep_ll_check.h"
#include "support/rank_group.h"

namespace chorus::test {
namespace {

TEST_CASE("ep: dispatch and combine, every routing and datatype, 2 3 4 and 8 ranks",
          "[ranks][ep]") {
  for (int n : {2, 3, 4, 8}) {
    CAPTURE(n);
    RankGroup g(n);
    REQUIRE(g.init_error().empty());
    CHECK(g.run([&](int, ncclComm_t comm) {
      return check_ep_matrix(comm, 1000 + static_cast<uint64_t>(n));
    }) == "");
  }
}

TEST_CASE("ep: bad input is refused on every rank, naming it, and the communicator stays usable",
          "[ranks][ep]") {
  for (int n : {2, 3}) {
    CAPTURE(n);
    RankGroup g(n);
    REQUIRE(g.init_error().empty());
    CHECK(g.run([&](int, ncclComm_t comm) { return check_ep_bad_input(comm); }) == "");
  }
}

TEST_CASE("ep: asynchronous dispatch and combine run in their host stream's order",
          "[ranks][ep][stream]") {
  for (int n : {1, 2, 4}) {
    CAPTURE(n);
    RankGroup g(n);
    REQUIRE(g.init_error().empty());
    CHECK(g.run([&](int, ncclComm_t comm) { return check_ep_async(comm); }) == "");
  }
}

TEST_CASE("ep: outputs allocated during dispatch, and a failed allocation refused on every rank",
          "[ranks][ep]") {
  for (int n : {1, 2, 3}) {
    CAPTURE(n);
    RankGroup g(n);
    REQUIRE(g.init_error().empty());
    CHECK(g.run([&](int, ncclComm_t comm) { return check_ep_allocate(comm); }) == "");
  }
}

TEST_CASE("ep: a single rank dispatches to itself", "[ranks][ep]") {
  RankGroup g(1);
  REQUIRE(g.init_error().empty());
  CHECK(g.run([&](int, ncclComm_t comm) { return check_ep_matrix(comm, 7); }) == "");
}

TEST_CASE("ep low latency: every routing, datatype and FP8 scale kind, 1 2 3 4 and 8 ranks",
          "[ranks][ep]") {
  for (int n : {1, 2, 3, 4, 8}) {
    CAPTURE(n);
    RankGroup g(n);
    REQUIRE(g.init_error().empty());
    CHECK(g.run([&](int, ncclComm_t comm) {
      return check_ep_ll_matrix(comm, 3000 + static_cast<uint64_t>(n));
    }) == "");
  }
}

TEST_CASE("ep low latency: two micro-batches in flight with hooks, 2 and 4 ranks", "[ranks][ep]") {
  for (int n : {2, 4}) {
    CAPTURE(n);
    RankGroup g(n);
    REQUIRE(g.init_error().empty());
    CHECK(g.run([&](int, ncclComm_t comm) { return check_ep_ll_hooks(comm, 77); }) == "");
  }
}

TEST_CASE("ep low latency: bad input is refused on every rank, naming it", "[ranks][ep]") {
  for (int n : {2, 3}) {
    CAPTURE(n);
    RankGroup g(n);
    REQUIRE(g.init_error().empty());
    CHECK(g.run([&](int, ncclComm_t comm) { return check_ep_ll_bad_input(comm); }) == "");
  }
}

}  // namespace
}  // namespace chorus::test
