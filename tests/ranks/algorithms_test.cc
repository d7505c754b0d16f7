// SPDX-License-Identifier: Apache-2.0
// Every algorithm of every collective, forced with CHORUS_ALGO, over the datatype x operator x
// count x rank-count matrix (smaller counts than the default-choice matrix), in place and not;
// and the ring split over several channels.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <string>

#include "common/params.h"
#include "support/coll_check.h"
#include "support/rank_group.h"
#include "support/scoped_env.h"

namespace chorus::test {
namespace {

// CHORUS_TEST_RANK_COUNTS="2,3,5": of a matrix's rank counts, only those (the sanitizer stages,
// scripts/sanitizers.sh); unset: all.
bool rank_count_selected(int nranks) {
  const char* list = std::getenv("CHORUS_TEST_RANK_COUNTS");
  if (list == nullptr || *list == '\0') return true;
  const std::string padded = "," + std::string(list) + ",";
  return padded.find("," + std::to_string(nranks) + ",") != std::string::npos;
}

void run_algorithm(Coll coll, const char* spec, std::initializer_list<int> rank_counts,
                   std::initializer_list<size_t> counts = {0, 1, 7, 1023, 65537}) {
  ScopedEnv algo("CHORUS_ALGO", spec);
  for (int nranks : rank_counts) {
    if (!rank_count_selected(nranks)) continue;
    RankGroup group(nranks);
    REQUIRE(group.init_error().empty());
    for (ncclDataType_t dtype : all_datatypes()) {
      for (int op = 0; op < (coll_reduces(coll) ? kNumTestOps : 1); ++op) {
        for (size_t count : counts) {
          for (int in_place = 0; in_place < 2; ++in_place) {
            Case c;
            c.coll = coll;
            c.dtype = dtype;
            c.op = op;
            c.count = count;
            c.in_place = in_place != 0;
            c.root = coll_rooted(coll) ? static_cast<int>((dtype + count + op) % nranks) : 0;
            std::string failures = group.run([&](int, ncclComm_t comm) { return run_case(comm, c); });
            if (!failures.empty())
              FAIL(spec << ": " << c.describe() << " with " << nranks << " ranks: " << failures);
          }
        }
      }
    }
  }
}

#define ALGO_TEST(COLL, SPEC)                                                               \
  TEST_CASE(#COLL " with algorithm " SPEC, "[ranks][algo]") {                              \
    run_algorithm(Coll::k##COLL, SPEC, {1, 2, 3, 4, 5, 8});                                 \
  }

ALGO_TEST(AllReduce, "allreduce:ring")
ALGO_TEST(AllReduce, "allreduce:rd")
ALGO_TEST(AllReduce, "allreduce:rhd")
ALGO_TEST(AllReduce, "allreduce:oneshot")
ALGO_TEST(AllReduce, "allreduce:twoshot")
ALGO_TEST(AllReduce, "allreduce:tree")
ALGO_TEST(ReduceScatter, "reducescatter:ring")
ALGO_TEST(ReduceScatter, "reducescatter:rhd")
ALGO_TEST(ReduceScatter, "reducescatter:direct")
ALGO_TEST(AllGather, "allgather:ring")
ALGO_TEST(AllGather, "allgather:bruck")
ALGO_TEST(AllGather, "allgather:direct")
ALGO_TEST(Broadcast, "broadcast:chain")
ALGO_TEST(Broadcast, "broadcast:tree")
ALGO_TEST(Reduce, "reduce:chain")
ALGO_TEST(Reduce, "reduce:tree")
ALGO_TEST(AlltoAll, "alltoall:pairwise")
ALGO_TEST(AlltoAll, "alltoall:bruck")

// The small-message algorithms, at counts whose messages fit a box (up to 511 doubles: 4088
// bytes) and one that does not for the larger datatypes (1023 doubles: the model's choice
// among the others, which their own tests cover at every count).
#define BOX_TEST(COLL, SPEC)                                                                \
  TEST_CASE(#COLL " with algorithm " SPEC, "[ranks][algo][box]") {                          \
    run_algorithm(Coll::k##COLL, SPEC, {2, 3, 5, 8}, {0, 1, 7, 100, 511, 1023});            \
  }

BOX_TEST(AllReduce, "allreduce:box")
BOX_TEST(ReduceScatter, "reducescatter:box")
BOX_TEST(AllGather, "allgather:box")
BOX_TEST(Broadcast, "broadcast:box")
BOX_TEST(Reduce, "reduce:box")
BOX_TEST(AlltoAll, "alltoall:box")
BOX_TEST(Gather, "gather:box")
BOX_TEST(Scatter, "scatter:box")

// A blocking call on an idle communicator runs the box algorithms from its own frame
// (src/core/express.cc); queued as operations, fibers run them (the same BoxCollective): the
// matrices above take the first path, these the second, for the fold, the blocks from every
// peer and the one message from the root.
TEST_CASE("the small-message algorithms queued as operations (CHORUS_EXPRESS=0)",
          "[ranks][algo][box]") {
  ScopedEnv express("CHORUS_EXPRESS", "0");
  run_algorithm(Coll::kAllReduce, "allreduce:box", {2, 3}, {0, 1, 7, 511});
  run_algorithm(Coll::kAlltoAll, "alltoall:box", {2, 3}, {0, 1, 7, 511});
  run_algorithm(Coll::kBroadcast, "broadcast:box", {2, 3}, {0, 1, 7, 511});
}

TEST_CASE("ring and chain split over several channels", "[ranks][algo]") {
  ScopedEnv channels("CHORUS_NCHANNELS", "3");
  for (const char* spec : {"allreduce:ring", "broadcast:chain", "reduce:chain"}) {
    Coll coll = spec[0] == 'a' ? Coll::kAllReduce : spec[0] == 'b' ? Coll::kBroadcast : Coll::kReduce;
    // Sizes past the 512 KiB-per-channel threshold, so that more than one channel is used.
    run_algorithm(coll, spec, {2, 3}, {1, 7, (size_t{3} << 20) + 5});
  }
}

TEST_CASE("CHORUS_ALGO names that do not fit a collective are ignored", "[ranks][algo]") {
  // bruck is not an AllReduce algorithm: the tuner's choice is used and results stay right.
  run_algorithm(Coll::kAllReduce, "bruck,nonsense,allreduce:", {3}, {7, 1023});
}

}  // namespace
}  // namespace chorus::test
