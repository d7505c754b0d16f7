// SPDX-License-Identifier: Apache-2.0
// Registered memory over UCX, ranks as threads: collectives on ncclCommRegister'ed buffers
// (malloc'ed and ncclMemAlloc'ed) carry the UCP memory handle the ucx transport made for each
// registration, unregistered buffers none (the transport counts the messages that carried one);
// every rank's result is checked; handles go with their registration, or with the
// communicator; deregistering memory in use stays an error.
//
// UCX reads UCX_TLS once per process, when its context is made: each case is its own ctest
// process (run in one process, the second case would reuse the first one's UCX_TLS).
#include <catch2/catch.hpp>

#if __has_include(<ucp/api/ucp.h>)  // the transport is built whenever UCX is found

#include <nccl.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "api/api_util.h"
#include "support/rank_group.h"
#include "support/scoped_env.h"
#include "transports/ucx/ucx_worker.h"

namespace chorus::test {
namespace {

constexpr int kRanks = 3;
constexpr size_t kCount = 262147;  // floats per rank: ~1 MiB, several UCX payload messages

std::string err(ncclResult_t r, const char* what) {
  return r == ncclSuccess ? "" : std::string(what) + ": " + ncclGetLastError(nullptr);
}

// Rank r's input i: a non-integer in (-1, 1), from a hash (splitmix64).
float input(int r, size_t i, uint64_t round) {
  uint64_t z = (static_cast<uint64_t>(r) << 40) + (round << 32) + i + 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return static_cast<float>(static_cast<double>(z >> 40) / double(1 << 23) - 1.0) + 1.0f / 3.0f;
}

// Where a rank's buffers come from.
enum class Memory { kRegistered, kMemAllocRegistered, kUnregistered };

struct Buffers {
  float* send = nullptr;
  float* recv = nullptr;  // kRanks * kCount: AllGather's output
  std::vector<float> plain_send, plain_recv;
  void* handles[2] = {};
  bool nccl = false;
};

std::string acquire(ncclComm_t comm, Memory memory, Buffers* b) {
  const size_t send_bytes = kCount * sizeof(float), recv_bytes = kRanks * send_bytes;
  if (memory == Memory::kMemAllocRegistered) {
    b->nccl = true;
    void* s = nullptr;
    void* r = nullptr;
    if (auto e = err(ncclMemAlloc(&s, send_bytes), "ncclMemAlloc"); !e.empty()) return e;
    if (auto e = err(ncclMemAlloc(&r, recv_bytes), "ncclMemAlloc"); !e.empty()) return e;
    b->send = static_cast<float*>(s);
    b->recv = static_cast<float*>(r);
  } else {
    b->plain_send.resize(kCount);
    b->plain_recv.resize(kRanks * kCount);
    b->send = b->plain_send.data();
    b->recv = b->plain_recv.data();
  }
  if (memory == Memory::kUnregistered) return "";
  if (auto e = err(ncclCommRegister(comm, b->send, send_bytes, &b->handles[0]), "register");
      !e.empty())
    return e;
  return err(ncclCommRegister(comm, b->recv, recv_bytes, &b->handles[1]), "register");
}

std::string release(ncclComm_t comm, Buffers* b) {
  for (void* h : b->handles)
    if (h != nullptr)
      if (auto e = err(ncclCommDeregister(comm, h), "deregister"); !e.empty()) return e;
  if (b->nccl) {
    if (auto e = err(ncclMemFree(b->send), "ncclMemFree"); !e.empty()) return e;
    return err(ncclMemFree(b->recv), "ncclMemFree");
  }
  return "";
}

// Whether `out` is the sum of every rank's inputs of `round`, to fp32 rounding: "" or what is
// wrong.
std::string check_sum(const float* out, uint64_t round, const char* what) {
  for (size_t i = 0; i < kCount; ++i) {
    double want = 0, magnitude = 0;
    for (int p = 0; p < kRanks; ++p) {
      want += input(p, i, round);
      magnitude += std::fabs(input(p, i, round));
    }
    if (std::fabs(out[i] - want) > 1e-6 * magnitude)
      return std::string(what) + ": element " + std::to_string(i) + " is " +
             std::to_string(out[i]) + ", not " + std::to_string(want);
  }
  return "";
}

// AllReduce (out of place, then in place) and AllGather of random non-integer floats; every
// rank checks its own results against the fp64 sum and the exact inputs. `outputs[r]` gets rank
// r's out-of-place AllReduce result, for the ranks to be compared with each other.
std::string reduce_and_gather(int r, ncclComm_t comm, const Buffers& b, uint64_t round,
                              std::vector<std::vector<float>>* outputs) {
  for (size_t i = 0; i < kCount; ++i) b.send[i] = input(r, i, round);
  if (auto e = err(ncclAllReduce(b.send, b.recv, kCount, ncclFloat, ncclSum, comm, nullptr),
                   "AllReduce");
      !e.empty())
    return e;
  if (auto e = check_sum(b.recv, round, "AllReduce"); !e.empty()) return e;
  (*outputs)[r].assign(b.recv, b.recv + kCount);
  std::memcpy(b.recv, b.send, kCount * sizeof(float));
  if (auto e = err(ncclAllReduce(b.recv, b.recv, kCount, ncclFloat, ncclSum, comm, nullptr),
                   "AllReduce in place");
      !e.empty())
    return e;
  if (auto e = check_sum(b.recv, round, "AllReduce in place"); !e.empty()) return e;
  if (auto e = err(ncclAllGather(b.send, b.recv, kCount, ncclFloat, comm, nullptr), "AllGather");
      !e.empty())
    return e;
  for (int p = 0; p < kRanks; ++p) {
    for (size_t i = 0; i < kCount; ++i) {
      if (b.recv[p * kCount + i] != input(p, i, round))
        return "AllGather: element " + std::to_string(i) + " of rank " + std::to_string(p);
    }
  }
  return "";
}

// Collectives on `memory` on every rank; returns the memory-handle counts they caused.
ucx::MemhStats run_on(RankGroup& g, Memory memory, uint64_t round) {
  std::vector<std::vector<float>> outputs(kRanks);
  ucx::MemhStats before = ucx::memh_stats();
  std::string f = g.run([&](int r, ncclComm_t comm) -> std::string {
    Buffers b;
    std::string e = acquire(comm, memory, &b);
    if (e.empty()) e = reduce_and_gather(r, comm, b, round, &outputs);
    std::string released = release(comm, &b);
    return e.empty() ? released : e;
  });
  REQUIRE(f == "");
  for (int r = 1; r < kRanks; ++r) CHECK(outputs[r] == outputs[0]);  // bit-identical
  ucx::MemhStats after = ucx::memh_stats();
  return ucx::MemhStats{after.mapped - before.mapped, after.unmapped - before.unmapped,
                        after.sends - before.sends, after.recvs - before.recvs};
}

void collectives_on_registered_memory(const char* tls) {
  ScopedEnv transport("CHORUS_TRANSPORT", "UCX");
  ScopedEnv ucx_tls("UCX_TLS", tls);
  ScopedEnv devices("UCX_NET_DEVICES", "lo");
  const ucx::MemhStats start = ucx::memh_stats();
  std::vector<void*> left_registered(kRanks);
  {
    RankGroup g(kRanks);
    REQUIRE(g.init_error() == "");

    // Registered: every registration used by a transfer has a handle, released when it is
    // deregistered; the payload messages of its transfers carry it both ways.
    for (Memory memory : {Memory::kRegistered, Memory::kMemAllocRegistered}) {
      INFO((memory == Memory::kRegistered ? "malloc'ed" : "ncclMemAlloc'ed") << ", registered");
      ucx::MemhStats d = run_on(g, memory, 1);
      CHECK(d.mapped >= kRanks);
      CHECK(d.mapped <= 2 * kRanks);  // one per registration at most, however many transfers
      CHECK(d.unmapped == d.mapped);
      CHECK(d.sends >= 2 * kRanks);
      CHECK(d.recvs >= 2 * kRanks);
    }
    {
      INFO("unregistered");
      ucx::MemhStats d = run_on(g, Memory::kUnregistered, 2);
      CHECK(d.mapped == 0);
      CHECK(d.sends == 0);
      CHECK(d.recvs == 0);
    }

    // Memory in use cannot be deregistered (an error, not a crash), and its handle stays
    // usable. The send buffers' registrations are left for ncclCommDestroy to release.
    const ucx::MemhStats before = ucx::memh_stats();
    std::vector<std::vector<float>> outputs(kRanks);
    std::string f = g.run([&](int r, ncclComm_t comm) -> std::string {
      Buffers b;
      if (auto e = acquire(comm, Memory::kMemAllocRegistered, &b); !e.empty()) return e;
      left_registered[r] = b.send;
      if (auto e = reduce_and_gather(r, comm, b, 3, &outputs); !e.empty()) return e;
      Result<std::shared_ptr<Comm>> c = api::find_comm(comm);
      if (!c.ok()) return c.status().message();
      Result<RegistrationPin> pin =
          (*c)->pin(b.recv, kCount * sizeof(float), "AllGather #9 (test)");
      if (!pin.ok() || !*pin) return "no pin";
      if (ncclCommDeregister(comm, b.handles[1]) != ncclInvalidUsage) return "deregistered in use";
      if (std::string(ncclGetLastError(nullptr)).find("in use by AllGather #9 (test)") ==
          std::string::npos)
        return std::string("deregister: ") + ncclGetLastError(nullptr);
      if (auto e = reduce_and_gather(r, comm, b, 4, &outputs); !e.empty()) return e;
      pin->reset();
      if (auto e = err(ncclCommDeregister(comm, b.handles[1]), "deregister"); !e.empty()) return e;
      return err(ncclMemFree(b.recv), "ncclMemFree");
    });
    REQUIRE(f == "");
    const ucx::MemhStats during = ucx::memh_stats();
    CHECK(during.mapped - before.mapped >= kRanks);
    CHECK(during.unmapped - before.unmapped == kRanks);  // the receive buffers'
    CHECK(during.sends - before.sends > 0);
  }
  // The communicators went with registrations left: their handles went with them.
  const ucx::MemhStats end = ucx::memh_stats();
  CHECK(end.unmapped - start.unmapped == end.mapped - start.mapped);
  for (void* p : left_registered)
    if (p != nullptr) CHECK(ncclMemFree(p) == ncclSuccess);
}

TEST_CASE("collectives on registered memory over UCX (tcp) carry its memory handles",
          "[ranks][ucx][reg]") {
  collectives_on_registered_memory("tcp,self");
}

TEST_CASE("collectives on registered memory over UCX (shared memory) carry its memory handles",
          "[ranks][ucx][reg]") {
  collectives_on_registered_memory("sm,self");
}

}  // namespace
}  // namespace chorus::test

#endif
