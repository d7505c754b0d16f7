// SPDX-License-Identifier: Apache-2.0
// Registered memory through the API, ranks as threads: collectives on registered buffers
// (ncclMemAlloc'ed or not), handles, and the errors of deregistering or freeing memory that is
// registered or in use by an operation.
#include <catch2/catch.hpp>
#include <nccl.h>

#include <memory>
#include <string>
#include <vector>

#include "api/api_util.h"
#include "support/rank_group.h"
#include "support/require_error.h"

namespace chorus::test {
namespace {


std::string err(ncclResult_t r, const char* what) {
  return r == ncclSuccess ? "" : std::string(what) + ": " + last_error();
}

// AllReduce (sum) then AllGather of `count` floats from send into recv (count * nranks).
std::string reduce_and_gather(int r, int n, ncclComm_t comm, float* send, float* recv,
                              size_t count) {
  for (size_t i = 0; i < count; ++i) send[i] = static_cast<float>(r + 1);
  if (auto e = err(ncclAllReduce(send, recv, count, ncclFloat, ncclSum, comm, nullptr),
                   "allreduce"); !e.empty())
    return e;
  for (size_t i = 0; i < count; ++i)
    if (recv[i] != static_cast<float>(n * (n + 1) / 2)) return "wrong sum";
  if (auto e = err(ncclAllGather(send, recv, count, ncclFloat, comm, nullptr), "allgather");
      !e.empty())
    return e;
  for (int peer = 0; peer < n; ++peer) {
    if (recv[static_cast<size_t>(peer) * count] != static_cast<float>(peer + 1))
      return "wrong gather";
  }
  return "";
}

TEST_CASE("collectives on registered buffers, then deregistration", "[ranks][reg]") {
  const int n = 3;
  const size_t count = 100003;
  RankGroup g(n);
  std::string f = g.run([&](int r, ncclComm_t comm) -> std::string {
    void* send = nullptr;
    void* recv = nullptr;
    if (ncclMemAlloc(&send, count * sizeof(float)) != ncclSuccess) return "alloc send";
    if (ncclMemAlloc(&recv, n * count * sizeof(float)) != ncclSuccess) return "alloc recv";
    std::vector<float> plain(n * count);
    void* hs = nullptr;
    void* hr = nullptr;
    void* hp = nullptr;
    if (auto e = err(ncclCommRegister(comm, send, count * sizeof(float), &hs), "register send");
        !e.empty())
      return e;
    if (auto e = err(ncclCommRegister(comm, recv, n * count * sizeof(float), &hr), "register recv");
        !e.empty())
      return e;
    if (auto e = err(ncclCommRegister(comm, plain.data(), plain.size() * sizeof(float), &hp),
                     "register plain");
        !e.empty())
      return e;
    std::string bad = reduce_and_gather(r, n, comm, static_cast<float*>(send),
                                        static_cast<float*>(recv), count);
    if (bad.empty())
      bad = reduce_and_gather(r, n, comm, static_cast<float*>(send), plain.data(), count);
    if (!bad.empty()) return bad;
    for (void* h : {hs, hr, hp})
      if (auto e = err(ncclCommDeregister(comm, h), "deregister"); !e.empty()) return e;
    if (ncclCommDeregister(comm, hs) != ncclInvalidArgument) return "double deregister accepted";
    if (auto e = err(ncclMemFree(send), "free send"); !e.empty()) return e;
    return err(ncclMemFree(recv), "free recv");
  });
  REQUIRE(f == "");
}

TEST_CASE("the same range registered twice has two handles", "[ranks][reg]") {
  RankGroup g(1);
  std::vector<char> buf(4096);
  void* a = nullptr;
  void* b = nullptr;
  REQUIRE(ncclCommRegister(g.comm(0), buf.data(), buf.size(), &a) == ncclSuccess);
  REQUIRE(ncclCommRegister(g.comm(0), buf.data(), buf.size(), &b) == ncclSuccess);
  REQUIRE(a != b);
  REQUIRE(ncclCommDeregister(g.comm(0), a) == ncclSuccess);
  REQUIRE(ncclCommDeregister(g.comm(0), b) == ncclSuccess);
  REQUIRE_ERROR(ncclCommDeregister(g.comm(0), b), ncclInvalidArgument, "not a registration");
}

TEST_CASE("ncclMemFree of registered memory fails until it is deregistered", "[ranks][reg]") {
  RankGroup g(1);
  void* p = nullptr;
  REQUIRE(ncclMemAlloc(&p, 1 << 20) == ncclSuccess);
  void* handle = nullptr;
  REQUIRE(ncclCommRegister(g.comm(0), static_cast<char*>(p) + 4096, 8192, &handle) == ncclSuccess);
  REQUIRE_ERROR(ncclMemFree(p), ncclInvalidUsage, "still registered on comm");
  REQUIRE(last_error().find("rank 0/1") != std::string::npos);
  REQUIRE(ncclCommDeregister(g.comm(0), handle) == ncclSuccess);

  ncclWindow_t win = nullptr;
  REQUIRE(ncclCommWindowRegister(g.comm(0), p, 1 << 20, &win, 0) == ncclSuccess);
  REQUIRE_ERROR(ncclMemFree(p), ncclInvalidUsage, "ncclCommDeregister it first");
  REQUIRE(ncclCommWindowDeregister(g.comm(0), win) == ncclSuccess);
  REQUIRE(ncclMemFree(p) == ncclSuccess);
  REQUIRE_ERROR(ncclMemFree(p), ncclInvalidArgument, "not allocated by ncclMemAlloc");
}

TEST_CASE("memory an operation pins can be neither deregistered nor freed", "[ranks][reg]") {
  RankGroup g(2);
  std::string f = g.run([&](int r, ncclComm_t comm) -> std::string {
    const size_t count = 4096;
    void* p = nullptr;
    if (ncclMemAlloc(&p, count * sizeof(float)) != ncclSuccess) return "alloc";
    void* handle = nullptr;
    if (auto e = err(ncclCommRegister(comm, p, count * sizeof(float), &handle), "register");
        !e.empty())
      return e;
    // What an operation does when it starts: pin the registration of its buffer.
    Result<std::shared_ptr<Comm>> c = api::find_comm(comm);
    if (!c.ok()) return c.status().message();
    Result<RegistrationPin> pin = (*c)->pin(p, count * sizeof(float), "AllReduce #12 (test)");
    if (!pin.ok() || !*pin) return "no pin";
    if (ncclCommDeregister(comm, handle) != ncclInvalidUsage) return "deregistered while pinned";
    if (last_error().find("in use by AllReduce #12 (test)") == std::string::npos)
      return "deregister: " + last_error();
    if (ncclMemFree(p) != ncclInvalidUsage) return "freed while pinned";
    if (last_error().find("in use by AllReduce #12 (test)") == std::string::npos)
      return "free: " + last_error();
    // The registration stayed valid: a collective on it works.
    auto* v = static_cast<float*>(p);
    for (size_t i = 0; i < count; ++i) v[i] = static_cast<float>(r + 1);
    if (auto e = err(ncclAllReduce(v, v, count, ncclFloat, ncclSum, comm, nullptr), "allreduce");
        !e.empty())
      return e;
    if (v[count - 1] != 3.0f) return "wrong sum";
    pin->reset();
    if (auto e = err(ncclCommDeregister(comm, handle), "deregister"); !e.empty()) return e;
    return err(ncclMemFree(p), "free");
  });
  REQUIRE(f == "");
}

TEST_CASE("destroying a communicator releases its registrations", "[ranks][reg]") {
  void* p = nullptr;
  REQUIRE(ncclMemAlloc(&p, 4096) == ncclSuccess);
  {
    RankGroup g(2);
    void* handle = nullptr;
    REQUIRE(ncclCommRegister(g.comm(1), p, 4096, &handle) == ncclSuccess);
    REQUIRE(ncclMemFree(p) == ncclInvalidUsage);
  }
  REQUIRE(ncclMemFree(p) == ncclSuccess);
}

}  // namespace
}  // namespace chorus::test
