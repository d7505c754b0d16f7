// SPDX-License-Identifier: Apache-2.0
// File: tests/ranks/overlap_test.cc
// The overlap scheduler (include/chorus/overlap.h), ranks as threads: its results are exactly
// those of plain AllReduce calls on the same data, for gradients made ready in a random order
// that differs on every rank, from several threads per rank, over several steps, with every
// policy; and its errors (bad registrations, ready twice, a tensor never ready) are the ones
// the header promises, naming what is wrong.
#include <catch2/catch.hpp>
#include <chorus/compress.h>
#include <chorus/overlap.h>
#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "support/rank_group.h"
#include "support/scoped_env.h"

namespace chorus::test {
namespace {

struct TensorSpec {
  size_t count;
  ncclDataType_t dtype;
  int layer;
  bool in_arena;  // back to back with its neighbours in one allocation (zero-copy buckets)
};

// 14 tensors: small ones that fuse, large ones that are partitioned, three datatypes, a run
// of them adjacent in memory; layers in forward order.
std::vector<TensorSpec> model_tensors() {
  std::mt19937 gen(12345);  // the same on every rank
  std::vector<TensorSpec> specs;
  const ncclDataType_t types[] = {ncclFloat32, ncclFloat64, ncclInt32};
  for (int i = 0; i < 14; ++i) {
    size_t count = i % 4 == 3 ? 20000 + gen() % 30000 : 1 + gen() % 3000;
    specs.push_back({count, i < 6 ? ncclFloat32 : types[gen() % 3], i, i >= 2 && i < 6});
  }
  return specs;
}

size_t elem_size(ncclDataType_t t) { return t == ncclFloat64 ? 8 : 4; }

// Values that every summation order adds exactly: multiples of 1/64 in [-8, 8] (integers in
// -512..512 for int32), so "exactly" means byte for byte.
void fill(void* p, size_t count, ncclDataType_t t, std::mt19937& gen) {
  std::uniform_int_distribution<int> d(-512, 512);
  for (size_t i = 0; i < count; ++i) {
    const int v = d(gen);
    if (t == ncclFloat32) static_cast<float*>(p)[i] = static_cast<float>(v) / 64;
    if (t == ncclFloat64) static_cast<double*>(p)[i] = static_cast<double>(v) / 64;
    if (t == ncclInt32) static_cast<int32_t*>(p)[i] = v;
  }
}

// One rank's gradients: an arena for the adjacent ones, separate buffers for the others.
struct Gradients {
  std::vector<TensorSpec> specs = model_tensors();
  std::vector<char> arena;
  std::vector<std::vector<char>> own;
  std::vector<void*> ptr;
  Gradients() {
    size_t arena_bytes = 0;
    for (const auto& s : specs)
      if (s.in_arena) arena_bytes += s.count * elem_size(s.dtype);
    arena.resize(arena_bytes);
    own.resize(specs.size());
    size_t off = 0;
    for (size_t i = 0; i < specs.size(); ++i) {
      const size_t bytes = specs[i].count * elem_size(specs[i].dtype);
      if (specs[i].in_arena) {
        ptr.push_back(arena.data() + off);
        off += bytes;
      } else {
        own[i].resize(bytes);
        ptr.push_back(own[i].data());
      }
    }
  }
  size_t bytes(size_t i) const { return specs[i].count * elem_size(specs[i].dtype); }
};

std::string run_steps(int rank, ncclComm_t comm, const chorusOverlapConfig_t& config, int steps,
                      int threads) {
  Gradients g;
  chorusOverlap_t s = nullptr;
  if (chorusOverlapCreate(comm, &config, &s) != ncclSuccess)
    return std::string("create: ") + ncclGetLastError(nullptr);
  for (size_t i = 0; i < g.specs.size(); ++i) {
    if (chorusOverlapRegister(s, g.ptr[i], g.specs[i].count, g.specs[i].dtype, g.specs[i].layer) !=
        ncclSuccess)
      return std::string("register: ") + ncclGetLastError(nullptr);
  }
  std::string failure;
  for (int step = 0; step < steps && failure.empty(); ++step) {
    // This step's gradients, and what plain AllReduce calls make of them (issued while no
    // step runs: the scheduler's communicator is the caller's between steps).
    std::mt19937 gen(static_cast<unsigned>(rank * 1000 + step));
    std::vector<std::vector<char>> want(g.specs.size());
    for (size_t i = 0; i < g.specs.size(); ++i) {
      fill(g.ptr[i], g.specs[i].count, g.specs[i].dtype, gen);
      want[i].assign(static_cast<char*>(g.ptr[i]), static_cast<char*>(g.ptr[i]) + g.bytes(i));
      if (ncclAllReduce(want[i].data(), want[i].data(), g.specs[i].count, g.specs[i].dtype,
                        config.op, comm, nullptr) != ncclSuccess)
        return std::string("plain AllReduce: ") + ncclGetLastError(nullptr);
    }
    // Ready in an order of this rank's own, split over `threads` threads, with short pauses.
    std::vector<int> order(g.specs.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int>(i);
    std::shuffle(order.begin(), order.end(), gen);
    std::vector<std::string> errors(static_cast<size_t>(threads));
    std::vector<std::thread> workers;
    for (int t = 0; t < threads; ++t) {
      workers.emplace_back([&, t] {
        std::mt19937 pause(static_cast<unsigned>(rank * 7 + t + step * 131));
        for (size_t k = static_cast<size_t>(t); k < order.size(); k += static_cast<size_t>(threads)) {
          std::this_thread::sleep_for(std::chrono::microseconds(pause() % 400));
          const int i = order[k];
          if (chorusOverlapReady(s, g.ptr[i], g.specs[i].count, g.specs[i].dtype) != ncclSuccess) {
            errors[t] = std::string("ready: ") + ncclGetLastError(nullptr);
            return;
          }
        }
      });
    }
    for (auto& w : workers) w.join();
    for (const auto& e : errors)
      if (!e.empty()) failure = e;
    if (!failure.empty()) break;
    // The first layer first, as a forward pass would, then the rest.
    if (chorusOverlapWait(s, g.ptr[0]) != ncclSuccess) {
      failure = std::string("wait: ") + ncclGetLastError(nullptr);
      break;
    }
    if (std::memcmp(g.ptr[0], want[0].data(), g.bytes(0)) != 0) {
      failure = "step " + std::to_string(step) + ": tensor 0 differs after chorusOverlapWait";
      break;
    }
    if (chorusOverlapWaitAll(s) != ncclSuccess) {
      failure = std::string("wait all: ") + ncclGetLastError(nullptr);
      break;
    }
    for (size_t i = 0; i < g.specs.size() && failure.empty(); ++i) {
      if (std::memcmp(g.ptr[i], want[i].data(), g.bytes(i)) != 0)
        failure = "step " + std::to_string(step) + ": tensor " + std::to_string(i) +
                  " differs from plain AllReduce";
    }
  }
  chorusOverlapStats_t st{};
  if (failure.empty() && chorusOverlapGetStats(s, &st) != ncclSuccess) failure = "stats";
  if (failure.empty()) {
    size_t all = 0;
    for (size_t i = 0; i < g.specs.size(); ++i) all += g.bytes(i);
    if (st.step != static_cast<uint64_t>(steps) || st.bytes != all || st.buckets == 0 ||
        st.agreements == 0)
      failure = "stats: step " + std::to_string(st.step) + ", bytes " + std::to_string(st.bytes) +
                " of " + std::to_string(all) + ", buckets " + std::to_string(st.buckets);
  }
  if (chorusOverlapDestroy(s) != ncclSuccess && failure.empty())
    failure = std::string("destroy: ") + ncclGetLastError(nullptr);
  return failure;
}

chorusOverlapConfig_t small_config(chorusOverlapPolicy_t policy, ncclRedOp_t op) {
  chorusOverlapConfig_t c;
  chorusOverlapConfigInit(&c);
  c.policy = policy;
  c.bucketBytes = 64 << 10;
  c.firstBucketBytes = 16 << 10;
  c.partitionBytes = 32 << 10;
  c.creditBytes = 128 << 10;
  c.cycleUs = 200;
  c.op = op;
  return c;
}

TEST_CASE("overlap scheduler: results equal plain AllReduce, random ready orders, several threads",
          "[ranks][overlap]") {
  for (int n : {2, 3}) {
    for (auto policy : {chorusOverlapPriority, chorusOverlapFifo}) {
      for (auto op : {ncclSum, ncclAvg}) {
        CAPTURE(n, policy, op);
        RankGroup g(n);
        REQUIRE(g.init_error().empty());
        const chorusOverlapConfig_t c = small_config(policy, op);
        CHECK(g.run([&](int r, ncclComm_t comm) { return run_steps(r, comm, c, 3, 3); }) == "");
      }
    }
  }
}

TEST_CASE("overlap scheduler: no partitions, no credit, one bucket cap (DDP-like FIFO)",
          "[ranks][overlap]") {
  RankGroup g(4);
  REQUIRE(g.init_error().empty());
  chorusOverlapConfig_t c = small_config(chorusOverlapFifo, ncclSum);
  c.partitionBytes = 0;
  c.creditBytes = 0;
  c.bucketBytes = 25 << 20;
  c.firstBucketBytes = 1 << 20;
  CHECK(g.run([&](int r, ncclComm_t comm) { return run_steps(r, comm, c, 2, 2); }) == "");
}

// With compression each fp32 piece is reduced through FP8 (chorusAllReduceCompressed): every
// rank ends with the same bytes, within two E4M3 quantizations of the exact sum (each at most
// 1/16 of its 128-element block's largest magnitude), and not exact (it was compressed); an
// int32 tensor beside them stays exact.
TEST_CASE("overlap scheduler: FP8 compression per piece, identical on every rank, within FP8's error",
          "[ranks][overlap][compress]") {
  const int n = 3;
  const std::vector<size_t> counts = {5000, 40000, 128, 70001};
  RankGroup g(n);
  REQUIRE(g.init_error().empty());
  // inputs[r][t], results[r][t]: filled by the ranks, compared here.
  std::vector<std::vector<std::vector<float>>> inputs(n), results(n);
  std::vector<std::vector<int32_t>> ints(n);
  chorusCompressConfig_t fp8 = CHORUS_COMPRESS_CONFIG_INIT;
  chorusOverlapConfig_t c = small_config(chorusOverlapPriority, ncclSum);
  c.compress = &fp8;
  CHECK(g.run([&](int r, ncclComm_t comm) -> std::string {
    std::mt19937 gen(static_cast<unsigned>(77 + r));
    std::normal_distribution<float> d(0.0f, 1.0f);
    auto& in = inputs[r];
    auto& out = results[r];
    in.resize(counts.size());
    for (size_t t = 0; t < counts.size(); ++t) {
      in[t].resize(counts[t]);
      for (float& x : in[t]) x = d(gen);
    }
    out = in;
    ints[r].assign(1000, r + 1);
    chorusOverlap_t s = nullptr;
    if (chorusOverlapCreate(comm, &c, &s) != ncclSuccess) return std::string("create: ") + ncclGetLastError(nullptr);
    for (size_t t = 0; t < counts.size(); ++t)
      chorusOverlapRegister(s, out[t].data(), counts[t], ncclFloat32, static_cast<int>(t));
    chorusOverlapRegister(s, ints[r].data(), ints[r].size(), ncclInt32, 9);
    std::vector<int> order = {3, 0, 4, 2, 1};
    std::shuffle(order.begin(), order.end(), gen);
    for (int t : order) {
      const ncclResult_t rc = t == 4 ? chorusOverlapReady(s, ints[r].data(), ints[r].size(), ncclInt32)
                                     : chorusOverlapReady(s, out[t].data(), counts[t], ncclFloat32);
      if (rc != ncclSuccess) return std::string("ready: ") + ncclGetLastError(nullptr);
    }
    std::string f;
    if (chorusOverlapWaitAll(s) != ncclSuccess) f = std::string("wait: ") + ncclGetLastError(nullptr);
    if (chorusOverlapDestroy(s) != ncclSuccess && f.empty()) f = "destroy";
    return f;
  }) == "");
  for (int r = 0; r < n; ++r) CHECK(ints[r] == std::vector<int32_t>(1000, n * (n + 1) / 2));
  size_t inexact = 0, beyond = 0;
  for (size_t t = 0; t < counts.size(); ++t) {
    for (int r = 1; r < n; ++r) CHECK(std::memcmp(results[r][t].data(), results[0][t].data(), counts[t] * 4) == 0);
    for (size_t b = 0; b < counts[t]; b += 128) {
      const size_t e = std::min(counts[t], b + 128);
      double block_max = 0;
      for (size_t i = b; i < e; ++i) {
        double abs_sum = 0;
        for (int r = 0; r < n; ++r) abs_sum += std::fabs(inputs[r][t][i]);
        block_max = std::max(block_max, abs_sum);
      }
      for (size_t i = b; i < e; ++i) {
        double exact = 0;
        for (int r = 0; r < n; ++r) exact += inputs[r][t][i];
        const double err = std::fabs(results[0][t][i] - exact);
        if (err > 0) ++inexact;
        if (err > block_max / 8) ++beyond;
      }
    }
  }
  CHECK(beyond == 0);
  CHECK(inexact > 0);
}

TEST_CASE("overlap scheduler: bad calls are refused, naming what is wrong", "[ranks][overlap]") {
  RankGroup g(2);
  REQUIRE(g.init_error().empty());
  std::string result = g.run([&](int, ncclComm_t comm) -> std::string {
    std::vector<float> a(100), b(50), c(10);
    chorusOverlapConfig_t bad;
    chorusOverlapConfigInit(&bad);
    bad.op = ncclMax;
    chorusOverlap_t s = nullptr;
    if (chorusOverlapCreate(comm, &bad, &s) != ncclInvalidArgument) return "ncclMax accepted";
    bad.op = ncclSum;
    bad.cycleUs = 0;
    if (chorusOverlapCreate(comm, &bad, &s) != ncclInvalidArgument) return "cycleUs 0 accepted";
    if (chorusOverlapCreate(comm, nullptr, &s) != ncclSuccess) return "create with defaults failed";
    auto expect = [&](ncclResult_t got, ncclResult_t want, const char* words, const char* what) {
      const std::string msg = ncclGetLastError(nullptr);
      if (got != want || msg.find(words) == std::string::npos)
        return std::string(what) + ": " + std::to_string(got) + " " + msg;
      return std::string();
    };
    std::string f;
    if (chorusOverlapRegister(s, a.data(), a.size(), ncclFloat32, 0) != ncclSuccess) f = "register a";
    if (f.empty()) f = expect(chorusOverlapRegister(s, a.data() + 50, 10, ncclFloat32, 1),
                              ncclInvalidArgument, "overlaps", "overlapping register");
    if (f.empty()) f = expect(chorusOverlapRegister(s, b.data(), 0, ncclFloat32, 1),
                              ncclInvalidArgument, "count is 0", "empty register");
    if (f.empty()) f = expect(chorusOverlapRegister(s, b.data(), b.size(), ncclFloat32, -1),
                              ncclInvalidArgument, "negative", "negative layer");
    if (f.empty() && chorusOverlapRegister(s, b.data(), b.size(), ncclFloat32, 1) != ncclSuccess)
      f = "register b";
    if (f.empty()) f = expect(chorusOverlapReady(s, c.data(), c.size(), ncclFloat32),
                              ncclInvalidUsage, "not a registered tensor", "unregistered ready");
    if (f.empty()) f = expect(chorusOverlapReady(s, a.data(), 99, ncclFloat32), ncclInvalidUsage,
                              "registered with 100 elements", "size changed");
    if (f.empty()) f = expect(chorusOverlapReady(s, a.data(), 100, ncclFloat64), ncclInvalidUsage,
                              "registered with 100 elements", "datatype changed");
    if (f.empty() && chorusOverlapReady(s, a.data(), a.size(), ncclFloat32) != ncclSuccess)
      f = "ready a";
    if (f.empty()) f = expect(chorusOverlapReady(s, a.data(), a.size(), ncclFloat32),
                              ncclInvalidUsage, "ready twice", "ready twice");
    if (f.empty()) f = expect(chorusOverlapRegister(s, c.data(), c.size(), ncclFloat32, 2),
                              ncclInvalidUsage, "before the first chorusOverlapReady",
                              "register after ready");
    if (f.empty() && chorusOverlapReady(s, b.data(), b.size(), ncclFloat32) != ncclSuccess)
      f = "ready b";
    if (f.empty() && chorusOverlapWaitAll(s) != ncclSuccess)
      f = std::string("wait all: ") + ncclGetLastError(nullptr);
    // Its step done, tensor a may be ready again (the next step).
    if (f.empty() && chorusOverlapReady(s, a.data(), a.size(), ncclFloat32) != ncclSuccess)
      f = std::string("ready a in step 2: ") + ncclGetLastError(nullptr);
    if (f.empty() && chorusOverlapReady(s, b.data(), b.size(), ncclFloat32) != ncclSuccess)
      f = std::string("ready b in step 2: ") + ncclGetLastError(nullptr);
    if (f.empty() && chorusOverlapWaitAll(s) != ncclSuccess)
      f = std::string("wait all 2: ") + ncclGetLastError(nullptr);
    if (chorusOverlapDestroy(s) != ncclSuccess && f.empty()) f = "destroy";
    if (f.empty()) f = expect(chorusOverlapReady(s, a.data(), a.size(), ncclFloat32),
                              ncclInvalidArgument, "not a live", "destroyed handle");
    return f;
  });
  CHECK(result == "");
}

TEST_CASE("overlap scheduler: a tensor one rank never readies ends the wait, naming it",
          "[ranks][overlap]") {
  ScopedEnv timeout("CHORUS_TIMEOUT_MS", "1500");
  RankGroup g(2);
  REQUIRE(g.init_error().empty());
  // Both waits end before either rank destroys its scheduler (a destroyed peer would end the
  // other's wait with its own error first).
  std::atomic<int> waited{0};
  std::string result = g.run([&](int rank, ncclComm_t comm) -> std::string {
    std::vector<float> a(1000, 1.0f), b(3000, 2.0f);
    chorusOverlap_t s = nullptr;
    if (chorusOverlapCreate(comm, nullptr, &s) != ncclSuccess) return "create";
    chorusOverlapRegister(s, a.data(), a.size(), ncclFloat32, 0);
    chorusOverlapRegister(s, b.data(), b.size(), ncclFloat32, 1);
    chorusOverlapReady(s, a.data(), a.size(), ncclFloat32);
    if (rank == 0) chorusOverlapReady(s, b.data(), b.size(), ncclFloat32);  // rank 1 never does
    const ncclResult_t r = chorusOverlapWaitAll(s);
    const std::string msg = ncclGetLastError(nullptr);
    std::string f;
    if (rank == 0 && (r != ncclRemoteError || msg.find("1 (layer 1)") == std::string::npos ||
                      msg.find("not ready on rank(s) 1") == std::string::npos))
      f = "rank 0: " + std::to_string(r) + " " + msg;
    if (rank == 1 && (r != ncclInvalidUsage || msg.find("never ready on rank 1") == std::string::npos ||
                      msg.find("1 (layer 1)") == std::string::npos))
      f = "rank 1: " + std::to_string(r) + " " + msg;
    waited.fetch_add(1);
    while (waited.load() < 2) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    // Destroyed mid-step: clean, and the communicator still works.
    if (chorusOverlapDestroy(s) != ncclSuccess && f.empty()) f = "destroy";
    float x = 1.0f;
    if (f.empty() && ncclAllReduce(&x, &x, 1, ncclFloat32, ncclSum, comm, nullptr) != ncclSuccess)
      f = std::string("AllReduce after: ") + ncclGetLastError(nullptr);
    if (f.empty() && x != 2.0f) f = "AllReduce after gave " + std::to_string(x);
    return f;
  });
  CHECK(result == "");
}

}  // namespace
}  // namespace chorus::test
