// SPDX-License-Identifier: Apache-2.0
// AllReduce gives every rank bit-identical results, with every algorithm (and the tuner's
// choice), every float datatype and operator, on 2 to 8 ranks as threads (the direct
// transport): random non-integer data of mixed magnitudes, outputs compared bit for bit
// across all ranks and against an fp64 reference (tests/support/identical_check.h). The same
// check runs over shared memory and TCP in tests/mp.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <set>
#include <string>
#include <vector>

#include "algo/tuner.h"
#include "common/params.h"
#include "support/identical_check.h"
#include "support/rank_group.h"
#include "support/scoped_env.h"

namespace chorus::test {
namespace {

void run_identical(const std::string& spec) {
  ScopedEnv algo("CHORUS_ALGO", spec);
  std::string failures;
  for (int nranks = 2; nranks <= 8; ++nranks) {
    RankGroup group(nranks);
    REQUIRE(group.init_error().empty());
    std::string f = group.run([&](int, ncclComm_t comm) {
      return check_allreduce_identical(comm, /*seed=*/static_cast<uint64_t>(nranks));
    });
    if (!f.empty()) failures += "with " + std::to_string(nranks) + " ranks: " + f;
  }
  if (failures.size() > 8000) failures = failures.substr(0, 8000) + "... (cut)";
  if (!failures.empty()) FAIL("CHORUS_ALGO=" << spec << ":\n" << failures);
}

// The specs that have a test case below.
std::set<std::string>& tested_specs() {
  static std::set<std::string> specs;
  return specs;
}
struct TestedSpec {
  explicit TestedSpec(const char* spec) { tested_specs().insert(spec); }
};

#define IDENTICAL_TEST(ID, SPEC)                                                             \
  const TestedSpec tested_##ID(SPEC);                                                        \
  TEST_CASE("AllReduce results are bit-identical on every rank with " SPEC,                 \
            "[ranks][algo][identical]") {                                                    \
    run_identical(SPEC);                                                                     \
  }

IDENTICAL_TEST(auto, "auto")
IDENTICAL_TEST(ring, "allreduce:ring")
IDENTICAL_TEST(rd, "allreduce:rd")
IDENTICAL_TEST(rhd, "allreduce:rhd")
IDENTICAL_TEST(oneshot, "allreduce:oneshot")
IDENTICAL_TEST(twoshot, "allreduce:twoshot")
IDENTICAL_TEST(tree, "allreduce:tree")
// Ranks in threads share one host: forced here, the hierarchical AllReduce is the ring. Its own
// stages run in the multi-process tests on simulated hosts (mp:*hosts*) and on the test bed.
IDENTICAL_TEST(hier, "allreduce:hier")
// Through the boxes up to CHORUS_BOX_BYTES per message; forced on larger ones, the model's pick.
IDENTICAL_TEST(box, "allreduce:box")

// Run to run: the same input through the same algorithm gives the same bits every time, however
// the messages of the peers happen to arrive (data-parallel runs must be reproducible).
TEST_CASE("AllReduce and ReduceScatter give the same bits on every run", "[ranks][algo][identical]") {
  const size_t count = 100003;
  std::vector<std::string> specs = allreduce_algorithm_specs();
  for (const char* rs : {"reducescatter:ring", "reducescatter:direct", "reducescatter:rhd"})
    specs.push_back(rs);
  for (const std::string& spec : specs) {
    INFO("CHORUS_ALGO=" << spec);
    ScopedEnv algo("CHORUS_ALGO", spec);
    const bool rs = spec.rfind("reducescatter", 0) == 0;
    RankGroup group(5);
    REQUIRE(group.init_error().empty());
    std::string f = group.run([&](int rank, ncclComm_t comm) -> std::string {
      const size_t in_count = rs ? count * 5 : count;
      std::vector<float> in(in_count), out(count), first(count);
      uint64_t h = 0x9e3779b97f4a7c15ull * static_cast<uint64_t>(rank + 1);
      for (float& x : in) {
        h ^= h << 13;
        h ^= h >> 7;
        h ^= h << 17;
        x = static_cast<float>(static_cast<int64_t>(h % 2000001) - 1000000) * 1.37e-4f;
      }
      std::string differs;  // every rank makes every call, whatever it finds
      for (int run = 0; run < 12; ++run) {
        ncclResult_t res = rs ? ncclReduceScatter(in.data(), out.data(), count, ncclFloat32,
                                                  ncclSum, comm, nullptr)
                              : ncclAllReduce(in.data(), out.data(), count, ncclFloat32, ncclSum,
                                              comm, nullptr);
        if (res != ncclSuccess) return ncclGetLastError(nullptr);
        if (run == 0) first = out;
        if (out != first && differs.empty())
          differs = "run " + std::to_string(run) + " differs from run 0";
      }
      return differs;
    });
    CHECK(f == "");
  }
}

TEST_CASE("the bit-identity check covers every AllReduce algorithm", "[ranks][algo][identical]") {
  // A new AllReduce algorithm needs an IDENTICAL_TEST above and an entry in
  // allreduce_algorithm_specs() (which the multi-process check runs).
  const auto& specs = allreduce_algorithm_specs();
  std::set<std::string> listed(specs.begin(), specs.end());
  CHECK(listed.count("auto") == 1);
  CHECK(tested_specs().count("auto") == 1);
  for (algo::Algo a : algo::algorithms_for(CollKind::kAllReduce)) {
    std::string spec = std::string("allreduce:") + algo::algo_name(a);
    INFO(spec);
    CHECK(listed.count(spec) == 1);
    CHECK(tested_specs().count(spec) == 1);
  }
  CHECK(listed.size() == algo::algorithms_for(CollKind::kAllReduce).size() + 1);
}

}  // namespace
}  // namespace chorus::test
