// SPDX-License-Identifier: Apache-2.0
// Which transport a communicator uses between two ranks, ranks as threads: the cheapest at
// 1 MiB by declared cost, or by the measured figures of a tuner file (CHORUS_TUNER_FILE, as
// `chorus-info --tune` writes it). An opt-in transport (UCX) is opened only when forced or
// measured there, and is then chosen like any other.
#include <catch2/catch.hpp>
#include <nccl.h>
#include <unistd.h>

#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "api/api_util.h"
#include "core/comm.h"
#include "support/rank_group.h"
#include "support/scoped_env.h"
#include "transports/registry.h"

namespace chorus::test {
namespace {

// A tuner file with `text` for the scope of one test.
class TunerFile {
 public:
  explicit TunerFile(const char* text) {
    int fd = mkstemp(path_);
    REQUIRE(fd >= 0);
    REQUIRE(write(fd, text, std::char_traits<char>::length(text)) >= 0);
    close(fd);
  }
  ~TunerFile() { unlink(path_); }
  const char* path() const { return path_; }

 private:
  char path_[64] = "/tmp/chorus_tuner_choice_XXXXXX";
};

// Each rank: the transport its communicator uses to every peer, then an AllReduce of random
// non-integer floats checked against the sum every rank computes on its own.
std::string transports_and_sum(RankGroup& g, std::vector<std::string>* names) {
  names->assign(static_cast<size_t>(g.size()), "");
  return g.run([&](int r, ncclComm_t comm) -> std::string {
    auto c = api::find_comm(comm);
    if (!c.ok()) return c.status().message();
    for (int p = 0; p < g.size(); ++p) {
      if (p == r) continue;
      const TransportDesc* d = (*c)->transport_to(p);
      (*names)[static_cast<size_t>(r)] = d != nullptr ? d->name : "none";
    }
    const size_t count = 10000;
    auto input = [&](int rank) {
      std::mt19937 gen(static_cast<unsigned>(rank) * 7919u + 1);
      std::uniform_real_distribution<float> dist(-3.0f, 3.0f);
      std::vector<float> v(count);
      for (float& x : v) x = dist(gen);
      return v;
    };
    std::vector<float> mine = input(r), out(count, 0.0f);
    if (ncclAllReduce(mine.data(), out.data(), count, ncclFloat, ncclSum, comm, nullptr) !=
        ncclSuccess)
      return std::string("AllReduce: ") + ncclGetLastError(comm);
    std::vector<std::vector<float>> all;
    for (int q = 0; q < g.size(); ++q) all.push_back(input(q));
    for (size_t i = 0; i < count; ++i) {
      double want = 0;
      for (const auto& v : all) want += v[i];
      if (std::abs(out[i] - want) > 1e-4 * (1 + std::abs(want)))
        return "element " + std::to_string(i) + " is " + std::to_string(out[i]) + ", want " +
               std::to_string(want);
    }
    return "";
  });
}

// Two ranks as threads: both use `want` to reach the other, and their AllReduce is right.
void check_choice(const std::string& want) {
  RankGroup g(2);
  REQUIRE(g.init_error().empty());
  std::vector<std::string> names;
  std::string failures = transports_and_sum(g, &names);
  INFO(failures);
  CHECK(failures.empty());
  CHECK(names == std::vector<std::string>{want, want});
}

TEST_CASE("transport choice: the declared cost picks direct between threads", "[ranks][transport]") {
  ScopedEnv tuner("CHORUS_TUNER_FILE", "");
  check_choice("direct");
}

TEST_CASE("transport choice: a tuner file's figures decide, and bring in an opt-in transport",
          "[ranks][transport][ucx]") {
  if (find_transport("ucx") == nullptr) {
    WARN("this build has no UCX transport");
    return;
  }
  // UCX between threads of this process, kept on loopback.
  ScopedEnv tls("UCX_TLS", "tcp,self");
  ScopedEnv dev("UCX_NET_DEVICES", "lo");
  SECTION("ucx measured cheapest: opened and chosen") {
    TunerFile file("direct 400 0.01\nshm 400 0.01\ntcp 400 0.01\nucx 3 20\nreduce 10\n");
    ScopedEnv tuner("CHORUS_TUNER_FILE", file.path());
    check_choice("ucx");
  }
  SECTION("tcp measured cheapest: the file overrides the declared costs") {
    TunerFile file("direct 400 0.01\ntcp 3 20\n");
    ScopedEnv tuner("CHORUS_TUNER_FILE", file.path());
    check_choice("tcp");
  }
}

}  // namespace
}  // namespace chorus::test
