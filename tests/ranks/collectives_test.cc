// SPDX-License-Identifier: Apache-2.0
// Ranks as threads: every collective x datatype x operator x count x rank count, in place and
// out of place, any root, over the transports a single process uses (direct memory by default;
// the same matrix runs over shm and TCP in the multi-process tests).
#include <catch2/catch.hpp>

#include "support/coll_check.h"
#include "support/rank_group.h"

namespace chorus::test {
namespace {

void run_matrix(Coll coll, int nranks) {
  RankGroup group(nranks);
  REQUIRE(group.init_error().empty());
  int ops = coll_reduces(coll) ? kNumTestOps : 1;
  int cases = 0;
  for (ncclDataType_t dtype : all_datatypes()) {
    for (int op = 0; op < ops; ++op) {
      for (size_t count : matrix_counts()) {
        for (int in_place = 0; in_place < (coll == Coll::kSendRecv ? 1 : 2); ++in_place) {
          Case c;
          c.coll = coll;
          c.dtype = dtype;
          c.op = op;
          c.count = count;
          c.in_place = in_place != 0;
          c.root = coll_rooted(coll) ? static_cast<int>((dtype + count + op) % nranks) : 0;
          std::string failures =
              group.run([&](int, ncclComm_t comm) { return run_case(comm, c); });
          ++cases;
          if (!failures.empty()) FAIL(c.describe() << " with " << nranks << " ranks: " << failures);
        }
      }
    }
  }
  SUCCEED(cases << " cases");
}

}  // namespace

#define CHORUS_MATRIX_TEST(COLL, N) \
  TEST_CASE(#COLL " matrix with " #N " ranks", "[ranks][" #COLL "]") { run_matrix(Coll::k##COLL, N); }

#define CHORUS_MATRIX_ALL_RANKS(COLL) \
  CHORUS_MATRIX_TEST(COLL, 1)         \
  CHORUS_MATRIX_TEST(COLL, 2)         \
  CHORUS_MATRIX_TEST(COLL, 3)         \
  CHORUS_MATRIX_TEST(COLL, 4)         \
  CHORUS_MATRIX_TEST(COLL, 5)         \
  CHORUS_MATRIX_TEST(COLL, 8)

CHORUS_MATRIX_ALL_RANKS(AllReduce)
CHORUS_MATRIX_ALL_RANKS(ReduceScatter)
CHORUS_MATRIX_ALL_RANKS(AllGather)
CHORUS_MATRIX_ALL_RANKS(Broadcast)
CHORUS_MATRIX_ALL_RANKS(Reduce)
CHORUS_MATRIX_ALL_RANKS(AlltoAll)
CHORUS_MATRIX_ALL_RANKS(Gather)
CHORUS_MATRIX_ALL_RANKS(Scatter)
CHORUS_MATRIX_ALL_RANKS(SendRecv)

}  // namespace chorus::test
