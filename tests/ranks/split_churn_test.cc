// SPDX-License-Identifier: Apache-2.0
// Splits one after another from the same parent, as the soak test (tests/soak) makes them:
// after a split where some rank passed NCCL_SPLIT_NOCOLOR, and several splits of one parent
// in one group. Both once paired the wrong internal exchanges on the parent.
#include <catch2/catch.hpp>
#include <nccl.h>

#include <string>
#include <vector>

#include "support/rank_group.h"

namespace chorus::test {
namespace {

std::string err(ncclResult_t r, const char* what) {
  return r == ncclSuccess ? "" : std::string(what) + ": " + ncclGetLastError(nullptr);
}

// Checks comm's rank and size, then a sum-AllReduce of `value` over it.
std::string check_comm(ncclComm_t comm, int want_rank, int want_count, int value, int want_sum) {
  int rank = -1, count = -1;
  ncclCommUserRank(comm, &rank);
  ncclCommCount(comm, &count);
  if (rank != want_rank || count != want_count)
    return "rank " + std::to_string(rank) + "/" + std::to_string(count) + ", want " +
           std::to_string(want_rank) + "/" + std::to_string(want_count);
  std::vector<int> v(100, value);
  ncclResult_t res = ncclAllReduce(v.data(), v.data(), v.size(), ncclInt, ncclSum, comm, nullptr);
  if (res != ncclSuccess) return err(res, "allreduce");
  return v[99] == want_sum ? "" : "sum " + std::to_string(v[99]) + ", want " + std::to_string(want_sum);
}

TEST_CASE("splits of a parent after a split with NCCL_SPLIT_NOCOLOR", "[ranks][api][split]") {
  const int n = 4;
  RankGroup g(n);
  std::string f = g.run([&](int r, ncclComm_t comm) -> std::string {
    for (int round = 0; round < 3; ++round) {
      // Rank `round` sits this one out; the others form one comm.
      ncclComm_t sub = nullptr;
      int color = r == round ? NCCL_SPLIT_NOCOLOR : 0;
      ncclResult_t res = ncclCommSplit(comm, color, r, &sub, nullptr);
      if (res != ncclSuccess) return err(res, "split with a NOCOLOR rank");
      if (sub != nullptr) {
        std::string e = check_comm(sub, r < round ? r : r - 1, n - 1, r, n * (n - 1) / 2 - round);
        ncclCommDestroy(sub);
        if (!e.empty()) return "round " + std::to_string(round) + ": " + e;
      }
      // Then every rank splits again: the parent's exchanges must still pair up.
      res = ncclCommSplit(comm, 0, -r, &sub, nullptr);
      if (res != ncclSuccess) return err(res, "split after a NOCOLOR split");
      std::string e = check_comm(sub, n - 1 - r, n, 1, n);
      ncclCommDestroy(sub);
      if (!e.empty()) return "round " + std::to_string(round) + ": " + e;
    }
    return "";
  });
  REQUIRE(f == "");
}

TEST_CASE("splits of one parent in one group pair up in call order", "[ranks][api][split]") {
  const int n = 4;
  RankGroup g(n);
  std::string f = g.run([&](int r, ncclComm_t comm) -> std::string {
    for (int round = 0; round < 20; ++round) {
      ncclComm_t a = nullptr, b = nullptr, c = nullptr;
      if (ncclGroupStart() != ncclSuccess) return "group start";
      ncclCommSplit(comm, 0, r, &a, nullptr);                // same order
      ncclCommSplit(comm, 0, n - r, &b, nullptr);            // reversed
      ncclCommSplit(comm, r % 2, r, &c, nullptr);            // by parity
      ncclResult_t res = ncclGroupEnd();
      if (res != ncclSuccess) return err(res, "group of three splits");
      std::string e = check_comm(a, r, n, r, n * (n - 1) / 2);
      if (e.empty()) e = check_comm(b, n - 1 - r, n, 1, n);
      if (e.empty()) e = check_comm(c, r / 2, n / 2, 1, n / 2);
      for (ncclComm_t x : {a, b, c})
        if (x != nullptr) ncclCommDestroy(x);
      if (!e.empty()) return "round " + std::to_string(round) + ": " + e;
    }
    return "";
  });
  REQUIRE(f == "");
}

}  // namespace
}  // namespace chorus::test
